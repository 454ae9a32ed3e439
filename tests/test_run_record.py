"""The typed run record: one constructor from the stored form, one writer back, and a refusal
that names the field when a stored value is not what sextant writes."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from sextant.core.errors import UserError
from sextant.results.record import RECORD_VERSION, RecordError, RunRecord
from sextant.results.store import ResultsStore
from sextant.strategy import Strategy
from tests.report.runs import make_run


def test_the_label_is_the_strategys() -> None:
    run = make_run("torch", parallel="dp", workers=2, precision="bf16", compress="powersgd")
    assert run.label == Strategy.from_dict(run.strategy.to_dict()).label == \
        "torch dp x2 bf16 compress=powersgd"


def test_json_form_round_trips_to_an_equal_record() -> None:
    run = make_run("jax", "compiled", "dp", 2, comm=0.02, sync_step=0.12)
    doc = json.loads(json.dumps(run.to_dict()))
    assert doc["schema"] == RECORD_VERSION
    assert RunRecord.from_dict(doc) == run
    assert run.ranks[1].step_time.median == pytest.approx(0.1)
    assert run.metrics.exposed_comm_share == pytest.approx(0.02 / 0.12)


def test_unknown_metrics_are_kept_as_written() -> None:
    doc = make_run().to_dict()
    doc["metrics"]["figure_from_a_newer_writer"] = [1, 2]
    run = RunRecord.from_dict(doc)
    assert run.metrics.extra["figure_from_a_newer_writer"] == (1, 2)
    assert run.to_dict()["metrics"]["figure_from_a_newer_writer"] == [1, 2]


def test_a_non_finite_figure_reads_as_missing_and_a_loss_keeps_its_step() -> None:
    doc = make_run().to_dict()
    doc["metrics"]["step_time_median_s"] = math.inf
    doc["losses"] = [5.0, None, 4.0]
    run = RunRecord.from_dict(doc)
    assert run.metrics.step_time_median_s is None
    assert run.losses == (5.0, None, 4.0)
    assert math.isnan(run.finite_losses[1])


@pytest.mark.parametrize(("where", "value", "message"), [
    ("metrics.step_time_median_s", "fast", "metrics.step_time_median_s is 'fast', not a number"),
    ("metrics.steps_timed", 2.5, "metrics.steps_timed is 2.5, not an integer"),
    ("strategy.framework", "caffe", "its strategy is not valid (unknown framework 'caffe'"),
    ("status", "exploded", "status 'exploded'; allowed: ok, failed, interrupted, diverged"),
    ("schema", RECORD_VERSION + 1, "written by a newer sextant"),
])
def test_a_value_sextant_never_writes_is_refused_by_name(where: str, value: object,
                                                         message: str) -> None:
    doc = make_run().to_dict()
    *tables, key = where.split(".")
    target = doc[tables[0]] if tables else doc
    target[key] = value
    with pytest.raises(RecordError, match=message.replace("(", r"\(").replace("[", r"\[")):
        RunRecord.from_dict(doc)


def test_a_row_stored_before_the_device_axis_reads_as_a_cpu_run(tmp_path: Path) -> None:
    """A schema-1 row without the fields added since (device, effective precision): the run
    reads as what it was, a CPU run at the precision asked for."""
    db = tmp_path / "r.db"
    with ResultsStore(db) as store:
        run_id = store.add(make_run())
    with sqlite3.connect(db) as conn:
        (raw,) = conn.execute("SELECT strategy_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        strategy = {k: v for k, v in json.loads(raw).items() if k != "device"}
        conn.execute("UPDATE runs SET strategy_json = ? WHERE id = ?",
                     (json.dumps(strategy), run_id))
    with ResultsStore(db) as store:
        run = store.get(run_id)
    assert run.strategy.device == "cpu" and run.metrics.effective_precision is None


def test_a_damaged_row_is_refused_with_its_id_and_field(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with ResultsStore(db) as store:
        run_id = store.add(make_run())
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET metrics_json = ? WHERE id = ?",
                     (json.dumps({"tokens_per_s": "many"}), run_id))
    with ResultsStore(db) as store, pytest.raises(UserError) as err:
        store.get(run_id)
    assert str(err.value) == (f"run {run_id} in {db} is unreadable: metrics.tokens_per_s is "
                              "'many', not a number")
