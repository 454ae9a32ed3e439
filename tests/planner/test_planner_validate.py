"""`plan validate` against measured runs, read from a real results store."""

from __future__ import annotations

import json

import pytest

from sextant.core.errors import UserError
from sextant.planner import validate as val
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore

WORKLOAD = {
    "name": "gpt-tiny",
    "seed": 0,
    "steps": 50,
    "global_batch": 16,
    "model": {
        "family": "gpt",
        "vocab_size": 256,
        "seq_len": 64,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "d_ff": 256,
    },
}


def _run(parallel, workers, step, **strategy):
    return RunRecord.from_dict({
        "strategy": {"framework": "torch", "parallel": parallel, "workers": workers,
                     **strategy},
        "workload": WORKLOAD,
        "metrics": {
            "step_time_median_s": step,
            "step_time_p10_s": step * 0.9,
            "step_time_p90_s": step * 1.1,
            "exposed_comm_share": 0.1,
        },
    })


def _store(path, *runs):
    with ResultsStore(path) as store:
        for run in runs:
            store.add(run)
    return path


@pytest.fixture
def calibration(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps(
            {
                "schema": 1,
                "host": {"cores": 2, "memory_bytes": 8e9},
                "gemm": {"numpy": {"flops_all_threads": 100e9, "flops_1_thread": 55e9}},
                "memory_bw_bytes_per_s": 15e9,
                "allreduce": {"alpha_s": 200e-6, "beta_s_per_byte": 1e-9},
            }
        )
    )
    return path


def test_single_run_fits_efficiency_and_dp_run_is_predicted(tmp_path, calibration):
    db = _store(tmp_path / "r.db", _run("single", 1, 0.030), _run("dp", 2, 0.029),
                _run("tp", 2, 0.05, tp=2))
    rows = val.validate(db=db, calibration=calibration)
    by_id = {r["id"]: r for r in rows}
    assert "skipped" in by_id[3]
    assert by_id[1]["efficiency_source"] == "fit" and abs(by_id[1]["error"]) < 1e-6
    assert by_id[2]["efficiency_source"] == "from single run"
    assert (
        by_id[2]["predicted_s"] > 0
        and by_id[2]["predicted_no_overlap_s"] >= by_id[2]["predicted_s"]
    )


def test_missing_calibration_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    db = _store(tmp_path / "r.db", _run("single", 1, 0.03))
    with pytest.raises(UserError, match="sextant calibrate"):
        val.validate(db=db)


def test_empty_or_missing_store(tmp_path):
    with pytest.raises(UserError, match="sextant compare"):
        val.load_runs(tmp_path / "nothing.db")
