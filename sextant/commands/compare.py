"""`sextant compare`: run the workload on every installed framework and strategy, side by
side, then write the report."""

from __future__ import annotations

import argparse
import dataclasses
import uuid
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.text import Text

from sextant.backends import available, get_backend, require
from sextant.backends.base import not_installed
from sextant.backends.base import REGISTRY
from sextant.cluster import emulated
from sextant.commands.common import (
    DEFAULT_WORKLOAD,
    GPU_WORKLOAD,
    RunProgress,
    add_device_args,
    add_optional_verbs,
    add_run_args,
    inherit_parent_flags,
    open_store,
    runs_dir,
)
from sextant.commands.export import add_deploy_verb
from sextant.commands.run import LaunchFlags, load_with_steps, ray_cluster, ray_launcher, \
    trainable_line
from sextant.commands.trials import (
    DEFAULT_REPEATS,
    add_repeats_arg,
    by_config,
    disturbed_lines,
    iteration_table,
    trials_table,
)
from sextant.core.devices import Inventory, check_ranks_fit, detect, resolve_device
from sextant.core.display import console
from sextant.core.fields import add_flags
from sextant.core.errors import RunFailed, UserError
from sextant.monitor import add_monitor_args
from sextant.results.record import RunRecord
from sextant.runner import execute
from sextant.strategy import MIXED_PRECISIONS, PRECISION_HELP, Strategy
from sextant.workloads.spec import Workload
from sextant.sources import workload_source


def register(sub: Any) -> None:
    p = sub.add_parser("compare", help="run the workload on every installed framework and "
                                       "strategy, side by side, and write the report",
                       description="Run one workload on every installed framework and its "
                                   "default strategies (same weights, same batches), print "
                                   "the comparison and write the HTML report.")
    _add_compare_args(p)
    # None: gpt-tiny, or llama-tiny for `compare layouts` (an explicit gpt-tiny is refused there).
    p.set_defaults(func=cmd_compare, workload=None)
    verbs = add_optional_verbs(
        p, "optional; without one, compare the frameworks")
    for name, summary, description in (
        ("levers", "pull each distributed-training lever on one framework",
         "Pull each distributed-training lever (sharding, accumulation, bf16, compression) on "
         "one framework (the first of --frameworks, default torch) and show what each changed "
         "against plain data parallel; and LoRA (rank 8, alpha 16, PEFT's default targets) "
         "against full fine-tuning of the same model."),
        ("layouts", "run the parallelism spectrum on a Llama-shaped workload",
         "Run the parallelism spectrum (dp, fsdp, tp, pp, dp x tp) on torch and jax over a "
         "Llama-shaped workload (default llama-tiny) and show step time, communication, memory "
         "per rank and the lines of sextant code each layout needed."),
    ):
        verb = verbs.add_parser(name, help=summary, description=description)
        _add_compare_args(verb)
        inherit_parent_flags(verb)
    add_deploy_verb(verbs)


def _add_compare_args(p: argparse.ArgumentParser) -> None:
    """The flags of `compare` and of its verbs (which take them after the verb too)."""
    add_run_args(p)
    add_monitor_args(p)
    add_repeats_arg(p, DEFAULT_REPEATS)
    p.add_argument("--frameworks", default=None,
                   help=f"comma-separated subset of: {', '.join(REGISTRY)} (default: all installed)")
    p.add_argument("--workers", type=int, default=None,
                   help="workers of the data-parallel rows (default: 2 on CPU cores, every "
                        "visible GPU on a GPU host)")
    add_device_args(p, defaults={"precision": None},
                    helps={"precision": PRECISION_HELP + "; default: bf16 on GPUs, what GPU "
                                                         "users train with; fp32 on CPU cores"})
    p.add_argument("--report", type=Path, default=None,
                   help="where to write the HTML report (default: next to the results database)")
    p.add_argument("--no-report", action="store_true", help="do not write the report")
    p.add_argument("--launcher", default="local", choices=("local", "ray"),
                   help="local (default: processes on this machine, or on the hosts of "
                        "--cluster) or ray (each run one placement group on a Ray cluster; "
                        "see docs/multi-host.md)")
    add_flags(p, LaunchFlags, ("ray",))
    p.add_argument("--no-calibrate", action="store_true",
                   help="do not calibrate this machine (about 25 s, once, before the first "
                        "report) for the planner's prediction on the scaling chart")


def _frameworks(spec: str | None) -> list[str]:
    if spec is None:
        return list(REGISTRY)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names:
        raise UserError(
            f"unknown framework {unknown[0] if unknown else spec!r} in --frameworks; "
            f"allowed: {', '.join(REGISTRY)}"
        )
    return names


# The levers `compare levers` pulls, each against plain data parallel (fp32, no
# accumulation, no compression). A lever the framework does not support is skipped.
LEVERS: tuple[dict[str, Any], ...] = (
    {"parallel": "dp-manual"}, {"parallel": "zero1"}, {"parallel": "zero2"}, {"parallel": "zero3"}, {"parallel": "fsdp"},
    {"grad_accum": 4}, {"precision": "bf16"},
    {"compress": "bf16"}, {"compress": "fp16"}, {"compress": "powersgd"},
)


LORA_LEVER_RANK, LORA_LEVER_ALPHA = 8, 16.0
"""LoRA as `compare levers` pulls it: PEFT's defaults (rank 8, alpha 16) on PEFT's default
targets for the family (llama: q and v; gpt: the fused qkv, GPT-2's c_attn)."""
LORA_LEVER_TARGETS = {"llama": ("q", "v"), "gpt": ("qkv",)}


def lora_lever(workload: Workload) -> Workload | None:
    """The workload fine-tuned with LoRA instead of fully: the lever row set against full
    fine-tuning on the base strategy. None where it does not apply (an mlp, or a workload
    that already is LoRA)."""
    targets = LORA_LEVER_TARGETS.get(workload.model.family)
    if targets is None or workload.finetune.lora:
        return None
    spec = dataclasses.replace(workload.finetune, method="lora", targets=targets,
                               rank=LORA_LEVER_RANK, alpha=LORA_LEVER_ALPHA)
    return workload.replace(finetune=spec)


def lever_label(record: RunRecord) -> str:
    """A lever row's name: the strategy's label, with the LoRA lever named (its strategy is
    the baseline's; what changed is the workload)."""
    finetune = record.workload.get("finetune") or {}
    if finetune.get("method") != "lora":
        return record.label
    return f"{record.label} lora r{finetune.get('rank')} ({','.join(finetune.get('targets', ()))})"


def lever_strategies(framework: str, workers: int, device: str = "cpu") -> list[Strategy]:
    backend = get_backend(framework)
    if not available(framework):
        raise UserError(not_installed(backend))
    mode = backend.capabilities().modes[0]
    base: dict[str, Any] = {"framework": framework, "mode": mode, "parallel": "dp",
                            "workers": workers, "device": device}
    out = [Strategy(**base)]
    for lever in LEVERS:
        fields = {**base, **lever}
        if "compress" in lever and framework == "jax":
            fields["parallel"] = "dp-manual"  # jax compresses in its hand-written pmean
        out += _if_supported(fields)
    return out


def _if_supported(fields: dict[str, Any]) -> list[Strategy]:
    """[the strategy] if it is valid and its backend runs it, else []."""
    try:
        strategy = Strategy(**fields)
        require(strategy)
    except UserError:
        return []
    return [strategy]


# The layouts `compare layouts` runs for each framework, `workers` being the degree of
# each one-dimensional layout; dp x tp doubles it. Unsupported ones are skipped.
LAYOUTS: tuple[dict[str, Any], ...] = (
    {"parallel": "single"}, {"parallel": "dp"}, {"parallel": "fsdp"}, {"parallel": "tp"},
    {"parallel": "tp-manual"}, {"parallel": "pp"}, {"parallel": "tp", "dp_x": 2},
)


def layout_strategies(frameworks: list[str], workers: int, device: str = "cpu",
                      max_ranks: int | None = None) -> list[Strategy]:
    """`max_ranks`: the host's GPUs, on GPU ranks (layouts needing more are left out)."""
    out = []
    for framework in frameworks:
        backend = get_backend(framework)
        if not available(framework):
            continue
        mode = backend.capabilities().modes[0]
        for layout in LAYOUTS:
            parallel = layout["parallel"]
            n = 1 if parallel == "single" else workers * layout.get("dp_x", 1)
            if max_ranks is not None and n > max_ranks:
                continue
            fields: dict[str, Any] = {"framework": framework, "mode": mode,
                                      "parallel": parallel, "workers": n, "device": device}
            if parallel in ("tp", "tp-manual"):
                fields["tp"] = workers
            if parallel == "pp":
                fields.update(pp=workers, microbatches=2 * workers)
            out += _if_supported(fields)
    return out


def layouts_not_run(frameworks: list[str]) -> list[str]:
    """One line per installed framework that skips a layout, with its backend's reason."""
    out = []
    for name in frameworks:
        if not available(name):
            continue
        caps = get_backend(name).capabilities()
        skipped = [p for p in dict.fromkeys(layout["parallel"] for layout in LAYOUTS)
                   if p not in caps.parallel]
        if skipped:
            reasons = dict(caps.why_not)
            why = "; ".join(dict.fromkeys(reasons[p] for p in skipped if p in reasons))
            out.append(f"{name} does not run {', '.join(skipped)}" + (f": {why}" if why else ""))
    return out


def layout_table(records: Sequence[RunRecord]) -> Any:
    """The parallelism spectrum: per layout, what it cost and what it needed (the figures of
    the report's section, sextant.report.model.layout_rows), beside its speed and loss."""
    from rich.table import Table

    from sextant.core.display import fmt_loss, fmt_ms, fmt_share
    from sextant.report.model import layout_rows

    table = Table(title="parallel layouts (per rank; comm: payload bytes of the collectives one "
                        "step issued, counted (torch) or read from the compiled HLO (jax); "
                        "idle: a pipeline stage's share of the step without its own compute)",
                  title_justify="left", header_style="bold")
    for col in ("run", "step ms", "vs single", "exposed comm", "comm MB/step", "params MB",
                "opt MB", "idle", "code lines", "final loss", "Δ loss"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    rows = layout_rows(records)
    singles = {row["framework"]: row["step_time_s"] for row in rows
               if row["parallel"] == "single"}
    base = records[0].metrics.final_loss
    for rec, row in zip(records, rows):
        m = rec.metrics
        single = singles.get(row["framework"])
        comm, params, opt = (row[k] for k in ("comm_bytes_per_step", "param_bytes",
                                                "optimizer_bytes"))
        step = row["step_time_s"]
        table.add_row(
            rec.label, fmt_ms(step),
            "-" if not single or step is None else f"{step / single:.2f}x",
            fmt_share(m.exposed_comm_share),
            "-" if comm is None else f"{comm / 2**20:.2f}",
            "-" if params is None else f"{params / 2**20:.3f}",
            f"{opt / 2**20:.3f}" if opt else "-",
            "-" if row["stage_idle_share"] is None else f"{row['stage_idle_share']:.0%}",
            "-" if row["code_lines"] is None else str(row["code_lines"]),
            fmt_loss(m.final_loss),
            "base" if rec is records[0] else _delta(m.final_loss, base),
        )
    return table


def _delta(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{value - base:+.1e}"


def lever_table(records: Sequence[RunRecord]) -> Any:
    """What each lever changed against the first (baseline) record."""
    from rich.table import Table

    from sextant.core.display import fmt_bytes_mb, fmt_loss, fmt_ms, fmt_share

    base = records[0]
    table = Table(title=f"levers against {base.label}", title_justify="left",
                  header_style="bold")
    # Per rank: MB sent per step (planned, ring algorithms), parameter and optimizer-state
    # bytes held (read from the framework's objects), peak RSS of the largest worker.
    for col in ("run", "step ms", "Δ step", "comm", "sent MB", "params MB", "opt MB",
                "RSS MB", "final loss", "Δ loss"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    for rec in records:
        m, r0 = rec.metrics, rec.ranks[0]
        acc = r0.memory_accounting
        planned = (r0.comm.get("planned_bytes_per_step") or {}).get("total")
        step, base_step = m.step_time_median_s, base.metrics.step_time_median_s
        table.add_row(
            lever_label(rec), fmt_ms(step),
            "base" if rec is base else (f"{step / base_step - 1:+.0%}" if step and base_step
                                        else "-"),
            fmt_share(m.exposed_comm_share),
            "-" if planned is None or planned != planned else f"{planned / 2**20:.2f}",
            f"{acc['params'] / 2**20:.2f}" if acc.get("params") is not None else "-",
            f"{acc['optimizer_state'] / 2**20:.2f}" if acc.get("optimizer_state") else "-",
            fmt_bytes_mb(m.peak_rss_bytes), fmt_loss(m.final_loss),
            "base" if rec is base else _delta(m.final_loss, base.metrics.final_loss),
        )
    return table


def _framework_strategies(args: argparse.Namespace, out: Any, device: str = "cpu",
                          inventory: Inventory | None = None) -> list[Strategy]:
    """The default comparison's rows for this host (`compare_rows`); what is not run is
    printed with its reason (not installed, opt-in, more GPUs than the host has, ...)."""
    explicit = args.frameworks is not None
    names: list[str] = []
    for name in _frameworks(args.frameworks):
        backend = get_backend(name)
        if not available(name):
            message = not_installed(backend)
            if explicit:
                raise UserError(message)
            out.print(message, markup=False)
            continue
        if backend.OPT_IN and not explicit:
            out.print(f"{name}: opt-in, not run by default (--frameworks ...,{name}): "
                      f"{backend.OPT_IN}", markup=False)
            continue
        names.append(name)
    strategies, skipped = compare_rows(names, device, inventory or Inventory(),
                                       workers=args.workers,
                                       precision=getattr(args, "precision", None))
    for line in skipped:
        out.print(Text(line, style="dim"))
    return strategies


GPU_PRECISION = "bf16"
"""What `compare` trains in on GPUs unless told: what GPU users train with."""
CPU_PRECISION = "fp32"
GPU_SHARDED = ("fsdp",)
"""Sharded data parallelism `compare` adds on a host with several GPUs."""


def default_workers(device: str, inventory: Inventory) -> int:
    """The data-parallel rows' workers unless told: every visible GPU, or 2 on CPU cores."""
    return inventory.count if device == "gpu" else 2


def compare_rows(frameworks: Sequence[str], device: str, inventory: Inventory, *,
                 workers: int | None = None, precision: str | None = None
                 ) -> tuple[list[Strategy], list[str]]:
    """(strategies, not-run lines): every framework's compare_matrix rows for this host.

    On CPU cores: the matrix at `workers` (default 2) in fp32. On GPUs (one rank each): the
    single-device rows (and compiled) on one GPU; with N >= 2 GPUs, the data-parallel rows
    over N (default: every visible GPU) and the sharded ones (GPU_SHARDED), in bf16 unless
    told. A row that cannot run here is listed with its reason, never failed."""
    on_gpu = device == "gpu"
    precision = precision or (GPU_PRECISION if on_gpu else CPU_PRECISION)
    n = workers or default_workers(device, inventory)
    width = max(2, n) if on_gpu else n  # on one GPU the dp rows are listed as not run
    strategies: list[Strategy] = []
    skipped: list[str] = []
    for name in frameworks:
        backend = get_backend(name)
        rows = list(backend.compare_matrix(width))
        if on_gpu and n >= 2:
            mode = backend.capabilities().modes[0]
            rows += [{"mode": mode, "parallel": p, "workers": n} for p in GPU_SHARDED
                     if p in backend.capabilities().parallel]
        for fields in rows:
            fields = {**fields, "precision": precision, "device": device}
            try:
                strategy = Strategy(framework=name, **fields)
                if on_gpu and strategy.workers > inventory.count:
                    raise UserError(f"needs {strategy.workers} GPUs, one per rank; this host "
                                    f"has {inventory.describe()}")
                require(strategy)
            except UserError as exc:
                label = f"{name} {fields['mode']} {fields['parallel']} x{fields['workers']}"
                skipped.append(f"not run: {label}: {exc}")
                continue
            if strategy not in strategies:
                strategies.append(strategy)
    if strategies and precision in MIXED_PRECISIONS:
        # The mixed-precision agreement rule's anchor: the reference row in fp32 (shown, never
        # ranked against the others).
        strategies.append(dataclasses.replace(strategies[0], precision="fp32"))
    return strategies, skipped


def _chosen_strategies(args: argparse.Namespace, out: Any, device: str,
                       inventory: Inventory) -> list[Strategy]:
    """The runs of this comparison: the levers, the layouts, or every framework's rows."""
    workers = args.workers or default_workers(device, inventory)
    if args.verb is not None:
        check_ranks_fit(device, workers, inventory)
    if args.verb == "levers":
        return lever_strategies(_frameworks(args.frameworks or "torch")[0], workers, device)
    if args.verb == "layouts":
        return layout_strategies(_frameworks(args.frameworks), workers, device,
                                 inventory.count if device == "gpu" else None)
    strategies = _framework_strategies(args, out, device, inventory)
    if device == "gpu":
        out.print(f"on {inventory.describe()}: one rank per GPU, "
                  f"{strategies[0].precision if strategies else args.precision} "
                  + ("(the GPU default; --precision fp32 for true fp32)"
                     if args.precision is None else ""), markup=False)
    return strategies


def _compared_workload(args: argparse.Namespace, device: str) -> Workload:
    """The workload of this comparison: --workload, else the one that measures what the verb
    compares on this device (a Llama shape for the layouts, GPT-2-small on a GPU, where
    gpt-tiny measures only launch overhead)."""
    if args.workload is None:
        args.workload = ("llama-tiny" if args.verb == "layouts"
                         else GPU_WORKLOAD if device == "gpu" else DEFAULT_WORKLOAD)
    workload = load_with_steps(args)
    if args.verb == "layouts" and workload.model.family != "llama":
        raise UserError(f"compare layouts splits a Llama-shaped model; workload "
                        f"{workload.name!r} is a {workload.model.family} model (try --workload "
                        "llama-tiny)")
    return workload


def _measure_cluster_links(name: str, out: Any) -> None:
    """The planner's fit of an emulated cluster's links, measured once per cluster."""
    cluster = emulated.load(name)
    if emulated.link_fit(cluster.name) is None:
        out.print(f"measuring the links of cluster {cluster.name} for the planner (about "
                  f"15 s, once)", markup=False)
        emulated.measure_link(cluster)


def _run_interleaved(args: argparse.Namespace, workload: Workload, strategies: list[Strategy],
                     store: Any, group: str, out: Any) -> tuple[list[RunRecord], list[str]]:
    """(records, failures): `--repeats` trials of every strategy, interleaved (A B C, A B C,
    ...) so that drift and bursts of other programs hit every configuration alike instead of
    all the trials of one. A failed run is listed and the others go on."""
    n = args.repeats
    records: list[RunRecord] = []
    failures: list[str] = []
    schedule = [(t, s) for t in range(1, n + 1) for s in strategies]
    ray = getattr(args, "ray_cluster", None)
    with RunProgress(out, tensorboard=args.tensorboard) as progress:
        for trial, strategy in schedule:
            shown = strategy.label + (f" #{trial}" if n > 1 else "")
            progress.start(shown, workload.steps, workload=workload)
            try:
                record = execute(workload, strategy, runs_dir=runs_dir(store), store=store,
                                 group_id=group, on_event=progress.on_event,
                                 workload_file=workload_source(args.workload),
                                 timeout_s=args.timeout,
                                 collective_timeout_s=args.collective_timeout,
                                 cluster=args.cluster, trial=(trial, n),
                                 launcher=None if ray is None else ray_launcher(
                                     args, strategy, ray, workload.name))
            except RunFailed as exc:
                progress.finish(shown, None, error=str(exc))
                failures.append(str(exc))
                continue
            progress.finish(shown, record)
            records.append(record)
    return records, failures


def _print_comparison(args: argparse.Namespace, workload: Workload,
                      records: list[RunRecord], out: Any) -> None:
    """The table of what was compared: the levers, the layouts, or the frameworks with the
    report's headline."""
    if args.verb == "levers":
        groups: dict[str, list[RunRecord]] = {}
        for rec in records:
            groups.setdefault(lever_label(rec), []).append(rec)
        out.print(lever_table([g[-1] for g in groups.values()]))
    elif args.verb == "layouts":
        out.print(layout_table([g[-1] for g in by_config(records)]))
        for line in layouts_not_run(_frameworks(args.frameworks)):
            out.print(Text(line, style="dim"))
    else:
        out.print(trials_table(
            records, f"{escape(workload.name)} - speed-up and max |Δloss| against "
                     f"{records[0].label}"
        ))
        out.print(iteration_table(records))
        _print_headline(records, out)


def _write_report(args: argparse.Namespace, store: Any, group: str,
                  records: list[RunRecord], out: Any) -> None:
    """The HTML report of this comparison's group, after calibrating this machine once where
    a run had several workers (the planner's prediction on the scaling chart)."""
    from sextant.report import write_report

    if not args.no_calibrate and any(r.strategy.workers > 1 for r in records):
        ensure_calibration(store.path.parent, out)
    path = args.report or store.path.parent / "report.html"
    write_report(store, path, group_id=group)
    out.print(f"report: {path.resolve()}")


def cmd_compare(args: argparse.Namespace) -> int:
    inventory = detect()
    device = resolve_device(args.device, inventory)
    workload = _compared_workload(args, device)
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1. Received: {args.workers}")
    out = console()
    strategies = _model_supported(workload, _chosen_strategies(args, out, device, inventory),
                                  out, explicit=args.frameworks is not None)
    if not strategies:
        raise UserError("no framework is installed; pip install 'sextant[torch]'")
    if args.ray_address is not None and args.launcher != "ray":
        raise UserError("--ray-address goes with --launcher ray")
    # Found once, before any run: every row runs on the same Ray cluster.
    args.ray_cluster = ray_cluster(args) if args.launcher == "ray" else None
    if args.cluster is not None:
        _measure_cluster_links(args.cluster, out)
    group = uuid.uuid4().hex[:12]
    with open_store(args) as store:
        n = args.repeats
        out.print(f"[bold]{escape(workload.name)}[/bold]: {len(strategies)} configurations"
                  + (f" x {n} interleaved trials" if n > 1 else "")
                  + f", {workload.steps} steps each, global batch {workload.global_batch}")
        records, failures = _run_interleaved(args, workload, strategies, store, group, out)
        if args.verb == "levers":
            more, failed = _run_lora_lever(args, workload, strategies[0], store, out)
            records, failures = records + more, failures + failed
        if records:
            _print_comparison(args, workload, records, out)
            line = trainable_line(workload, records)
            if line:
                out.print(line, markup=False)
        for line in disturbed_lines(records):
            out.print(Text(line, style="yellow"))
        if records:
            out.print(f"stored runs {records[0].id}-{records[-1].id} (group {group}) "
                      f"in {store.path}")
        if records and not args.no_report:
            _write_report(args, store, group, records, out)
    for failure in failures:
        out.print(Text("failed: ", style="red") + Text(failure))
    return 1 if failures else 0


def _run_lora_lever(args: argparse.Namespace, workload: Workload, base: Strategy,
                    store: Any, out: Any) -> tuple[list[RunRecord], list[str]]:
    """LoRA against full fine-tuning: the baseline strategy on the workload fine-tuned with
    LoRA (lora_lever), stored in a group of its own, since the report's comparisons are of
    one workload. Nothing where LoRA does not apply or the framework has no LoRA."""
    lora = lora_lever(workload)
    if lora is None or not _model_supported(lora, [base], out, explicit=False):
        return [], []
    return _run_interleaved(args, lora, [base], store, uuid.uuid4().hex[:12], out)


def _model_supported(workload: Workload, strategies: list[Strategy], out: Any,
                     explicit: bool) -> list[Strategy]:
    """The rows whose framework has every model part the workload uses (Qwen2's biases,
    GPT-2's tied head, LoRA); the others are printed with the reason, or refused when the
    frameworks were named."""
    from sextant.runner import check_model_features

    kept, said = [], set()
    for strategy in strategies:
        try:
            check_model_features(workload, strategy)
        except UserError as exc:
            if explicit:
                raise
            if str(exc) not in said:
                said.add(str(exc))
                out.print(Text(f"not run: {exc}", style="dim"))
            continue
        kept.append(strategy)
    return kept


def _print_headline(records: list[RunRecord], out: Any) -> None:
    """The report's headline and claim verdicts, in the terminal."""
    from sextant.report.model import build_report, headline_text

    report = build_report(records)
    title, sentence = headline_text(report["summary"])
    out.print(Text(f"{title}: ", style="bold") + Text(sentence))
    for claim in report["claims"]:
        if claim["verdict"] != "not measured":
            out.print(Text(f"  {claim['claim']}: ", style="dim") + Text(claim["verdict"])
                      + Text(f" ({claim['figure']})", style="dim"))


def ensure_calibration(results_dir: Path, out: Any) -> None:
    """Calibrate this machine once (calibration.json next to the results database), so the
    report can draw the planner's prediction beside the measured scaling."""
    from sextant.planner.local import load_machine

    if load_machine(None, results_dir) is not None:
        return
    from sextant.planner.calibrate import calibrate

    out.print("calibrating this machine for the planner's prediction (about 25 s, once; "
              "--no-calibrate skips it)", markup=False)
    try:
        calibrate(out=results_dir / "calibration.json")
    except (RunFailed, UserError) as exc:  # the report is still worth writing without it
        out.print(Text("calibration failed, no prediction drawn: ", style="yellow") + Text(str(exc)))
