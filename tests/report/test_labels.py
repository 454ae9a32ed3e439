"""One run label: `Strategy.label`, whether the record came from the store or was built."""

from __future__ import annotations

from sextant.claims import run_label
from sextant.strategy import Strategy
from tests.report.runs import make_run


def test_a_record_without_a_label_is_named_by_its_strategy() -> None:
    run = make_run("torch", parallel="dp", workers=2, precision="bf16", compress="powersgd")
    assert run["label"] == "torch dp x2 bf16 compress=powersgd"
    del run["label"]
    assert run_label(run) == Strategy.from_dict(run["strategy"]).label == \
        "torch dp x2 bf16 compress=powersgd"


def test_a_record_too_incomplete_for_a_strategy_still_has_a_name() -> None:
    assert run_label({"framework": "jax", "strategy": {"mode": "compiled", "bogus": 1}}) == \
        "jax compiled"
    assert run_label({"strategy": {"framework": "caffe"}}) == "caffe eager"
