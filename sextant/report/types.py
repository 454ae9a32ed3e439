"""The report's value, section by section, as typed records.

`sextant.report.model.build_report` fills them; the HTML page, the Markdown file and
`--format json` read them. They are TypedDicts, not dataclasses, because the report is a JSON
document first: `--format json` writes exactly this value, and the Markdown and HTML renderers
are read against the same names. Three fields stay open documents, each because its shape
belongs to another part: the workload definition (the workload TOML), the environment's
fingerprint (the run record's), and the advisor's full advice (`sextant.advisor.to_dict`).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from sextant.claims import ClaimDict

Document = dict[str, Any]
"""An open JSON document whose shape another part of sextant owns (see the module text)."""


class StepTimeCell(TypedDict):
    median: float | None
    p10: float | None
    p90: float | None
    n: int | None


class RateCell(TypedDict):
    """tokens/s: the median, and the range from the step-time p90 (low) and p10 (high)."""

    median: float | None
    low: float | None
    high: float | None


class SpeedupCI(TypedDict):
    low: float | None
    high: float | None
    confidence: float


class RunRow(TypedDict):
    """One configuration in the report: its representative trial's figures, and (added by
    the trial pass) its trial counts and speed-up interval against the reference."""

    id: int | None
    not_ranked: str | None
    effective_precision: str
    device: str
    accelerator: str | None
    mfu: float | None
    planner_step_s: float | None
    planner_error: float | None
    planner_stale: bool
    """Its planner figures were made by another planner or catalogue than today's."""
    device_peak_bytes: float | None
    index: int
    label: str
    framework: str
    mode: str
    parallel: str
    workers: int
    replicas: int
    precision: str
    compress: str
    threads_per_worker: int | None
    status: str
    step_time_s: StepTimeCell
    tokens_per_s: RateCell
    speedup_vs_reference: float | None
    first_step_s: float | None
    compile_s: float | None
    time_to_first_step_s: float | None
    import_s: float | None
    setup_s: float | None
    achieved_flops_per_s: float | None
    peak_rss_bytes: float | None
    peak_rss_total_bytes: float | None
    data_wait_share: float | None
    exposed_comm_s: float | None
    exposed_comm_share: float | None
    final_loss: float | None
    max_loss_diff: float | None
    trials: NotRequired[int]
    disturbed_trials: NotRequired[int]
    disturbed_ids: NotRequired[list[int | None]]
    interference: NotRequired[list[float | None]]
    speedup_ci: NotRequired[SpeedupCI]
    shade: NotRequired[int]


class Interval(TypedDict):
    """A ratio with its confidence interval."""

    value: float
    low: float | None
    high: float | None
    confidence: float


class Headline(TypedDict):
    """The fastest configuration's verdict against the others (model._headline)."""

    verdict: str
    runner_up: str | None
    vs_runner_up: Interval | None
    tied_with: list[str]
    row: NotRequired[RunRow]


class Fastest(TypedDict):
    run: str
    tokens_per_s: float | None
    step_time_s: float | None
    speedup_vs_reference: float | None
    speedup_ci: SpeedupCI | None
    verdict: str
    runner_up: str | None
    vs_runner_up: Interval | None
    tied_with: list[str]


class Disturbed(TypedDict):
    run: str
    ids: list[int | None]


class Leanest(TypedDict):
    run: str
    peak_rss_bytes: float | None
    heaviest_run: str | None
    heaviest_peak_rss_bytes: float | None


class NotRanked(TypedDict):
    run: str
    why: str


class ScalingHeadline(TypedDict):
    series: str
    workers: int
    speedup_vs_one: float | None


class Summary(TypedDict):
    """The headline figures: the fastest configuration and whether its interval names it,
    the leanest, what was not ranked and why, parity and the claims' verdict counts."""

    runs: int
    reference: str | None
    fastest: Fastest | None
    trials: int
    disturbed: list[Disturbed]
    leanest: Leanest | None
    not_ranked: list[NotRanked]
    parity_ok: bool
    parity_max_diff: float
    claims: dict[str, int]
    scaling: list[ScalingHeadline]


class ParityRow(TypedDict):
    """One run's agreement with the reference's fp32 curve (model._parity_row)."""

    run: str
    id: int | None
    precision: str
    max_diff: float | None
    held_to_parity: bool
    rule: str | None
    band_ratio: float | None
    agrees: bool | None
    why_not: str


class Curve(TypedDict):
    run: str
    losses: list[float]


class Parity(TypedDict):
    reference: str
    atol: float
    max_diff: float
    ok: bool
    per_run: list[ParityRow]
    curves: list[Curve]
    note: str


class PlannedPoint(TypedDict):
    """The planner's figures for one worker count (sextant.planner.local.predict_scaling)."""

    workers: int
    step_s: float
    tokens_per_s: float
    tokens_per_s_no_overlap: float
    exposed_share: float


class PlannedScaling(TypedDict):
    efficiency: float
    fitted_on: int | None
    points: list[PlannedPoint]


class ScalingPoint(TypedDict):
    workers: int
    tokens_per_s: float
    low: float | None
    high: float | None
    run: str
    id: int | None
    compute: int
    speedup_vs_one: NotRequired[float | None]
    efficiency: NotRequired[float | None]
    predicted_tokens_per_s: NotRequired[float | None]
    prediction_error: NotRequired[float | None]


class ScalingSeries(TypedDict):
    name: str
    framework: str
    mode: str
    parallel: str
    shade: int
    points: list[ScalingPoint]
    prediction: NotRequired[PlannedScaling | None]


class PredictedOnly(TypedDict):
    series: str
    workers: int
    tokens_per_s: float
    exposed_share: float


class ScalingPrediction(TypedDict):
    calibration_created: str | None
    cores: int
    allreduce: dict[str, float] | None
    series_predicted: int


class Scaling(TypedDict):
    series: list[ScalingSeries]
    prediction: ScalingPrediction | None
    predicted_only: list[PredictedOnly]
    prediction_note: str


class LinkPoint(TypedDict):
    link_gbit: float
    hosts: int
    tokens_per_s: float | None
    id: int | None
    exposed_share: float | None
    efficiency: float | None
    predicted_efficiency: NotRequired[float | None]
    prediction_error: NotRequired[float | None]


class LinkFit(TypedDict):
    """The all-reduce fitted between a cluster's hosts, at the link rate it was measured."""

    alpha_s: float
    beta_s_per_byte: float
    link_bit_s: float


class LinkPrediction(TypedDict):
    link_gbit: float
    tokens_per_s: float
    efficiency: float


class LinkSeries(TypedDict):
    name: str
    framework: str
    parallel: str
    workers: int
    single_id: int | None
    points: list[LinkPoint]
    fit: LinkFit | None
    prediction: list[LinkPrediction] | None


class Interconnect(TypedDict):
    series: list[LinkSeries]
    note: str


class MemoryRank(TypedDict):
    run: str
    id: int | None
    rank: int | None
    rss_start_bytes: float | None
    peak_rss_bytes: float | None
    growth_bytes: float | None
    data_wait_median_s: float | None
    step_time_median_s: float | None
    threads: int | None


class Memory(TypedDict):
    ranks: list[MemoryRank]
    params: int | None
    model_state_bytes: int | None


class CommRow(TypedDict):
    run: str
    id: int | None
    step_s: float
    compute_s: float
    exposed_comm_s: float
    exposed_comm_share: float | None
    nosync_step_s: float | None
    noise: bool


class CompileRow(TypedDict):
    run: str
    id: int | None
    mode: str
    first_step_s: float
    steady_step_s: float
    compile_s: float
    first_over_steady: float | None
    time_to_first_step_s: float | None
    import_s: float | None
    setup_s: float | None


class LayoutRow(TypedDict):
    """One run of the parallelism spectrum: what its layout cost, and its sextant code."""

    label: str
    framework: str
    parallel: str
    step_time_s: float | None
    comm_bytes_per_step: float | None
    param_bytes: float | None
    optimizer_bytes: float | None
    stage_idle_share: float | None
    code_lines: int | None


class Environment(TypedDict):
    fingerprint: Document
    framework_versions: dict[str, str]


class Reason(TypedDict):
    id: str
    delta: float
    source: str
    rationale: str
    detail: str


class RankedCandidate(TypedDict):
    rank: int
    candidate: str
    score: float
    tco_usd: float | None
    reasons: list[str]


class Recommendation(TypedDict):
    """What the report recommends: the measured ranking alone (source 'measured', with a
    hint to add a profile), or the advisor's answer for a team profile (source 'advisor')."""

    source: str
    hint: NotRequired[str]
    profile: NotRequired[str | None]
    profile_name: NotRequired[str | None]
    top: NotRequired[str]
    headline: NotRequired[str]
    tco_usd: NotRequired[float | None]
    compute_usd: NotRequired[float | None]
    people_usd: NotRequired[float | None]
    training_hours: NotRequired[float | None]
    hours_source: NotRequired[str]
    reasons: NotRequired[list[Reason]]
    ranking: NotRequired[list[RankedCandidate]]
    notes: NotRequired[list[str]]
    advice: NotRequired[Document]


class DeployRow(TypedDict):
    """One deployment artifact as the report shows it (sextant.results.deploy.DeployRecord)."""

    label: str
    framework: str
    format: str
    runtime: str
    status: str
    error: str | None
    parity: str | None
    max_rel: float | None
    argmax_agree: float | None
    loss_change: float | None
    """Held-out loss of the artifact minus the reference's (a quantized artifact's cost)."""
    probe: str | None
    probe_detail: str | None
    generation_match: bool | None
    b1_ms: float | None
    b1_low_ms: float | None
    b1_high_ms: float | None
    bn_ms: float | None
    bn_batch: int | None
    cold_start_s: float | None
    size_mb: float | None
    rss_mb: float | None
    targets: list[str]


class Deployment(TypedDict):
    """The deployment section: every artifact exported from one run's final parameters."""

    source_run: int | None
    params_sha256: str
    threads: int
    rows: list[DeployRow]
    summary: str


class Report(TypedDict):
    """Everything the report shows; the HTML page, the Markdown file and --format json
    render this one value."""

    sextant: str
    generated_at: str
    group_id: str | None
    created_at: str
    workload: Document
    workload_hash: str
    recommendation: Recommendation
    summary: Summary
    claims: list[ClaimDict]
    runs: list[RunRow]
    scaling: Scaling
    interconnect: Interconnect
    memory: Memory
    communication: list[CommRow]
    parity: Parity
    compile: list[CompileRow]
    layouts: list[LayoutRow] | None
    environment: Environment
    deployment: Deployment | None
