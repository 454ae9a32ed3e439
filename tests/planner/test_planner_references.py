"""The published reference points of docs/validation.md."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sextant.planner.references import run_references

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


@pytest.fixture(scope="module")
def rows():
    return run_references()


def test_at_least_ten_references_with_finite_errors(rows):
    assert len(rows) >= 10
    assert len({r.source.split(",")[0] for r in rows}) >= 5
    for r in rows:
        assert math.isfinite(r.planner) and r.published > 0 and r.command


def test_exact_formulas_reproduce_the_papers(rows):
    by_id = {r.id: r for r in rows}
    for key in ("zero-fig1-stage0", "zero-fig1-stage1", "zero-fig1-stage2", "zero-gpt2-states"):
        assert abs(by_id[key].error) < 0.005


def test_every_reference_is_in_the_docs(rows):
    if not DOC.is_file():
        pytest.skip("docs/validation.md not written")
    text = DOC.read_text()
    missing = [r.id for r in rows if r.id not in text]
    assert not missing, f"docs/validation.md lacks {missing}"


def test_docs_table_is_the_current_output(rows):
    from sextant.planner.references import references_markdown

    if not DOC.is_file():
        pytest.skip("docs/validation.md not written")
    text = DOC.read_text()
    stale = [line for line in references_markdown(rows).splitlines() if line and line not in text]
    assert not stale, "docs/validation.md is stale: rerun `sextant plan references --markdown`"


def test_formula_points_are_exact_and_summary_counts_both_kinds(rows):
    from sextant.planner.references import summary

    formula = [r for r in rows if r.kind == "formula"]
    assert len(formula) >= 20
    assert all(abs(r.error) <= 0.005 for r in formula), [
        r.id for r in formula if abs(r.error) > 0.005
    ]
    assert len(rows) >= 60
    line = summary(rows)
    assert "formula-defined within 0.5%" in line
    assert "tuning " in line and "held-out " in line


def test_not_comparable_rows_are_shown_but_not_counted():
    from sextant.planner.references import Row, summary

    def row(kind, error):
        return Row(id="x", source="s", source_key="s", split="tuning", quantity="q", unit="u",
                   published=1.0, planner=1.0 + error, planner_other=None, error=error,
                   kind=kind, quote="", setting="", command="")

    rows = [row("end-to-end", 0.05), row("end-to-end", 0.2), row("not comparable", -0.6)]
    line = summary(rows)
    assert "tuning 1/2 within 10% (50.0%)" in line
    assert "1 not comparable (shown, not counted)" in line
    assert "max 20.0%" in line  # the -60% row is in no ratio and no maximum


def test_published_interleaving_choices():
    from sextant.planner.estimate import Layout
    from sextant.planner.evaluators import interleaves as _interleaves

    # 529.6B of Narayanan et al. Table 1: 105 layers over 35 stages, 280 micro-batches.
    assert _interleaves(105, Layout(dp=9, tp=8, pp=35), 2520) == [3]
    # 1T: 2 layers per stage.
    assert _interleaves(128, Layout(dp=6, tp=8, pp=64), 3072) == [2]
    assert _interleaves(48, Layout(dp=32, tp=8, pp=2), 1536) == [2, 3, 4, 6, 8, 12, 24]
    # No pipeline, or micro-batches not a multiple of p: non-interleaved only.
    assert _interleaves(40, Layout(dp=32, tp=8, pp=1), 1024) == [1]
    assert _interleaves(48, Layout(dp=4, tp=8, pp=2), 6) == [1]


def test_an_unstated_micro_batch_is_the_fastest_that_fits():
    # Narayanan et al. Table 1 does not state b: the rows take the fastest fitting size among
    # those the search tries (divisors of the rank's share of the batch), as they take v.
    from sextant.planner.estimate import Layout
    from sextant.planner.models import megatron_gpt
    from sextant.planner.evaluators import megatron_choice

    shape = megatron_gpt(n_layers=40, d_model=6144, n_heads=48, global_batch=1024)
    layout = Layout(dp=32, tp=8, pp=1)
    fixed = megatron_choice(shape, layout, 1024, interleave="searched")
    searched = megatron_choice(shape, layout, 1024, interleave="searched", micro_batch="searched")
    assert fixed[1:] == (1, 1)
    assert searched[0] < fixed[0]
    assert (1024 // 32) % searched[1] == 0 and searched[1] > 1
    # A deep pipeline keeps b small: the bubble grows with it (529.6B on 35 stages).
    deep = megatron_gpt(n_layers=105, d_model=20480, n_heads=128, global_batch=2520)
    step, mbs, v = megatron_choice(
        deep, Layout(dp=9, tp=8, pp=35), 2520, interleave="searched", micro_batch="searched"
    )
    assert (mbs, v) == (1, 3)


def test_a_bounded_input_gives_an_interval_and_its_distance():
    from sextant.planner.references import interval_error

    assert interval_error(882.0, 960.0, 900.0) == 0.0
    assert interval_error(960.0, 882.0, 829.0) == pytest.approx((882.0 - 829.0) / 829.0)
    assert interval_error(7391.0, 8395.0, 9000.0) == pytest.approx((8395.0 - 9000.0) / 9000.0)


def test_torchtitan_h100_throughput_rows_span_the_sxm_and_nvl_peaks(rows):
    # torchtitan's performance.md: the GPUs' peak "is between SXM and NVL". Throughput rows
    # are predicted at both ends (the NVL's 835.5 TFLOP/s is the lower), memory rows once.
    spans = {r.id: r for r in rows if r.planner_other is not None}
    assert sorted(spans) == [
        "torchtitan-h100-llama3-70b-2d-fp8-256",
        "torchtitan-h100-llama3-8b-fsdp-128",
        "torchtitan-h100-llama3-8b-fsdp-8",
        "torchtitan-h100-llama3-8b-fsdp-compile-128",
        "torchtitan-h100-llama3-8b-fsdp-compile-8",
    ]
    for r in spans.values():
        assert r.planner_other < r.planner
        assert r.planner / r.planner_other < 989.4 / 835.5 + 1e-9


def test_the_summary_share_never_rounds_up_to_a_threshold():
    from sextant.planner.references import _share

    assert _share(47, 59) == "79.6%"
    assert _share(48, 59) == "81.3%"
    assert _share(59, 59) == "100.0%"
    assert _share(0, 0) == "0.0%"


def _raw():
    import tomllib

    from sextant.planner.references import DATA

    return tomllib.loads(DATA.read_text())


ADDED_AFTER_THE_SPLIT = {
    "maxtext-readme", "scaling-book", "llm-foundry-benchmarks", "peft-readme", "lora-2021",
    "nccl-tests-100", "nccl-tests-119", "nccl-1048", "nccl-812",
}
"""Sources entered after the split, each held out (docs/validation.md, "Held-out set")."""


def test_every_record_names_a_source_with_a_split_and_a_known_evaluator():
    from sextant.planner.evaluators import EVALUATORS
    from sextant.planner.references import SPLITS, load

    sources, refs = load()
    assert {s.split for s in sources.values()} == set(SPLITS)
    for r in refs:
        assert r.source in sources and r.evaluator in EVALUATORS and r.where is not None
    # About a third of the counted rows of the sources at the split are held out, and every
    # source added after it is held out.
    added = ADDED_AFTER_THE_SPLIT
    counted = [r for r in refs if r.kind in ("end-to-end", "collective")]
    original = [r for r in counted if r.source not in added]
    held = [r for r in original if sources[r.source].split == "held-out"]
    assert 0.25 <= len(held) / len(original) <= 1 / 3
    assert all(sources[k].split == "held-out" for k in added)
    assert sum(r.source in added for r in refs) >= 20


ADDED_TO_TUNING_SOURCES = {
    "torchtitan-h100-llama3-8b-fsdp-compile-8",
    "torchtitan-h100-llama3-8b-fsdp-compile-128",
}
"""Rows read later from a source already on the tuning side (the compiled half of the pair that
sets efficiency.EAGER_ELEMENTWISE_PASSES): the split was made once and is not redone."""


def test_the_split_follows_the_rule_blind_to_errors():
    # Sources in SHA-256 order of their key; one with counted rows is held out while the
    # held-out counted rows stay within a third (docs/validation.md, "Held-out set").
    import hashlib

    from sextant.planner.references import load

    sources, refs = load()
    added = ADDED_AFTER_THE_SPLIT
    rows: dict[str, int] = {}
    for r in refs:
        counted = r.kind in ("end-to-end", "collective")
        if counted and r.source not in added and r.id not in ADDED_TO_TUNING_SOURCES:
            rows[r.source] = rows.get(r.source, 0) + 1
    total, held = sum(rows.values()), set()
    n = 0
    for key in sorted(set(sources) - added, key=lambda k: hashlib.sha256(k.encode()).hexdigest()):
        if rows.get(key) and n + rows[key] <= total / 3:
            held.add(key)
            n += rows[key]
    assert {k for k, s in sources.items() if s.split == "held-out"} - added == held


def test_a_bad_record_is_one_clear_error():
    from sextant.core.errors import UserError
    from sextant.planner.references import parse

    raw = _raw()
    raw["reference"] = [dict(raw["reference"][0], colour="red")]
    with pytest.raises(UserError, match=r"unknown keys \['colour'\]"):
        parse(raw)
    raw = _raw()
    raw["reference"] = [dict(raw["reference"][0], evaluator="guess")]
    with pytest.raises(UserError, match="evaluator 'guess' is unknown"):
        parse(raw)
    raw = _raw()
    raw["sources"]["zero-2020"]["split"] = "both"
    with pytest.raises(UserError, match="split must be one of"):
        parse(raw)
    raw = _raw()
    raw["reference"] = raw["reference"][:1] * 2
    with pytest.raises(UserError, match="appears twice"):
        parse(raw)


def test_shares_are_per_split(rows):
    from sextant.planner.references import shares

    s = shares(rows)
    assert s["formula"][0] == s["formula"][1]
    counted = [r for r in rows if r.kind in ("end-to-end", "collective")]
    pre = [r for r in counted if r.group == "pre-training"]
    tuning = [r for r in pre if r.split == "tuning"]
    held = [r for r in pre if r.split == "held-out"]
    assert s["tuning"][1] == len(tuning) and s["held-out"][1] == len(held)
    assert s["held-out"][0] == sum(abs(r.error) <= 0.10 for r in held)
    # The fine-tuning group is counted apart, so the pre-training shares stay comparable.
    tuned = [r for r in counted if r.group == "fine-tuning"]
    assert tuned and s["fine-tuning"] == (sum(abs(r.error) <= 0.10 for r in tuned), len(tuned))


def test_plan_references_prints_one_split(capsys):
    import json

    from sextant.cli import main

    assert main(["plan", "references", "--split", "held-out", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["split"] for r in rows} == {"held-out"}
    with pytest.raises(SystemExit) as exc:
        main(["plan", "references", "--split", "both"])
    assert exc.value.code == 2


def test_maxtext_shapes_match_the_published_sizes(rows):
    # MaxText's global_parameter_scale models: the planner's parameter count of each record's
    # shape is within 5 % of the size the table names (16B ... 512B).
    from sextant.planner.evaluators import parameters_b
    from sextant.planner.references import load

    for r in load()[1]:
        if r.source == "maxtext-readme":
            size = float(r.id.split("-")[2].rstrip("b"))
            assert parameters_b(model=r.query["model"]) == pytest.approx(size, rel=0.05), r.id


def test_an_evaluator_answers_its_query_or_says_what_is_allowed():
    from sextant.core.errors import UserError
    from sextant.planner.evaluators import evaluate

    assert evaluate("model_states_gb", {"params": 7.5e9, "dp": 64, "zero": 0}) == 120.0
    with pytest.raises(UserError, match="unknown evaluator 'guess'; allowed: .*pinned"):
        evaluate("guess", {})
    query = {"model": "llama3-8b", "layout": {"dp": 8}, "accelerator": "h100-sxm",
             "network": "ib-ndr", "batch": 8, "figure": "speed"}
    with pytest.raises(UserError, match="unknown figure 'speed'; allowed: .*mfu"):
        evaluate("pinned", query)


def test_per_source_shares_add_up_to_the_split_shares(rows):
    from sextant.planner.references import by_source, shares

    s = shares(rows)
    for split in ("tuning", "held-out"):
        parts = [(h, n) for _, sp, h, n in by_source(rows) if sp == split]
        assert (sum(h for h, _ in parts), sum(n for _, n in parts)) == s[split]


def test_maxtext_rows_are_counted_as_maxtext_counts_them():
    """MaxText's README MFU is its own TFLOP count over the peak: 6 x every parameter
    x tokens + 12 H L D S^2 B for the attention (train.py at the v5e table's commit),
    halved for causality at the v5p table's commit (maxtext_utils.py)."""
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
    from sextant.planner.evaluators import pinned
    from sextant.planner.profiles import profile

    model = {"name": "m", "n_layers": 8, "d_model": 1024, "n_heads": 8, "n_kv_heads": 8,
             "d_ff": 4096, "vocab_size": 32000, "seq_len": 2048, "gated_mlp": True,
             "tied_embeddings": False, "learned_positions": False, "biases": False,
             "layernorm": False, "dropout": False}
    query = {"model": model, "layout": {"dp": 8, "zero": 3, "mbs": 2}, "accelerator": "tpu-v5e",
             "network": "ethernet-100g", "batch": 16}
    shape = _shape_of(model, 16)
    opts = PlanOptions(global_batch=16, stack=profile("maxtext"),
                       compute_efficiency=load_catalogue(calibration=None)
                       .accelerator("tpu-v5e").kernel_efficiency)
    hw = resolve_hardware(load_catalogue(calibration=None), "tpu-v5e", "ethernet-100g",
                          options=opts)
    step = evaluate_one(shape.cost(), hw, opts, Layout(dp=8, zero=3, mbs=2)).step
    per_device = 16 / 8  # sequences per chip and step
    s, heads, layers, head_dim = 2048, 8, 8, 128
    weights = 6 * shape.total_params() * s * per_device
    attention = 12 * heads * layers * head_dim * s**2 * per_device
    peak = hw.accelerator.peak("bf16")
    for figure, attn in (("mfu_maxtext_2023", attention), ("mfu_maxtext_2024", attention / 2)):
        expected = (weights + attn) / step / peak
        assert pinned(**query, figure=figure) == pytest.approx(expected, rel=1e-9)
    assert pinned(**query, figure="mfu_6n") < pinned(**query, figure="mfu")


def _shape_of(model, batch):
    from sextant.planner.evaluators import _shape

    return _shape(model, batch)
