"""The checks' judgements on constructed records: every threshold and message, in microseconds.
(tests/checks/test_real_runs.py provokes each failure with real runs.)"""

from __future__ import annotations

import json
import math

import pytest

from sextant.checks import analyse
from sextant.checks.result import CHECKS, CheckResult, worst
from sextant.results.record import RunRecord
from sextant.commands.check import exit_code


def fingerprint(**over):
    fp = {"sextant": "0.1.0", "python": "3.11.9", "framework": "torch",
          "framework_version": "2.5.1", "numpy": "2.1.0", "threads": 1, "device": "cpu",
          "cpu_affinity": [0], "omp_num_threads": "1"}
    return {**fp, **over}


def rank(r, *, rows=8, step=0.1, data=0.001, fp=None, steps=10, details=None):
    return {"rank": r, "step_times_s": [step] * steps, "data_wait_median_s": data,
            "rows_per_step": [rows] * steps, "fingerprint": fp or fingerprint(cpu_affinity=[r]),
            "details": details or {}}


def record(ranks, *, step=0.1, losses=None, warm=1, steps=10, samples_per_s=160.0):
    return RunRecord.from_dict({
        "strategy": {"framework": "torch"},
        "metrics": {"step_time_median_s": step, "samples_per_s": samples_per_s},
        "workload": {"steps": steps, "measure": {"warmup_steps": warm}},
        "ranks": ranks,
        "losses": losses if losses is not None else [5.0 - 0.1 * i for i in range(steps)],
        "run_dir": "/nowhere"})


def step_events(ends_by_rank):
    """{rank: [end time of step 1, 2, ...]} -> steps_by_rank structure."""
    return {r: [{"event": "step", "rank": r, "step": i + 1, "time": t}
                for i, t in enumerate(ends)] for r, ends in ends_by_rank.items()}


def lockstep(n_ranks=2, steps=10, lag=None):
    lag = lag or {}
    return step_events({r: [i * 0.1 + lag.get(r, 0.0) for i in range(steps)]
                        for r in range(n_ranks)})


# --- mvp -----------------------------------------------------------------------------------

def test_mvp_passes_when_loss_decreases() -> None:
    res = analyse.check_mvp(record([rank(0)]))
    assert res.status == "pass" and res.measured > 0


def test_mvp_fails_on_flat_loss_nan_and_crash() -> None:
    flat = analyse.check_mvp(record([rank(0)], losses=[5.0, 5.1, 5.0, 5.2]))
    assert flat.status == "fail" and "does not decrease" in flat.summary
    nan = analyse.check_mvp(record([rank(0)], losses=[5.0, math.nan, 4.0]))
    assert nan.status == "fail" and "step 2" in nan.summary
    crash = analyse.check_mvp(None, "rank 0 was killed by SIGKILL")
    assert crash.status == "fail" and "SIGKILL" in crash.summary and crash.hint


# --- versions ------------------------------------------------------------------------------

def test_versions_ignore_per_rank_fields() -> None:
    ranks = [rank(0, fp=fingerprint(cpu_affinity=[0], device="cuda:0")),
             rank(1, fp=fingerprint(cpu_affinity=[1], device="cuda:1"))]
    assert analyse.check_versions(record(ranks)).status == "pass"


def test_versions_name_the_rank_and_field() -> None:
    ranks = [rank(0), rank(1, fp=fingerprint(cpu_affinity=[1], framework_version="0.0.0-mismatch")),
             rank(2, fp=fingerprint(cpu_affinity=[2]))]
    res = analyse.check_versions(record(ranks))
    assert res.status == "fail"
    assert "rank 1" in res.summary and "framework_version" in res.summary
    assert "0.0.0-mismatch" in res.summary and "2.5.1" in res.summary
    assert res.details["differences"][0]["ranks"] == [1]


def test_a_nested_difference_reads_as_the_rank_wrote_it() -> None:
    ranks = [rank(0, fp=fingerprint(precision={"effective": "fp32"})),
             rank(1, fp=fingerprint(cpu_affinity=[1], precision={"effective": "bf16"}))]
    res = analyse.check_versions(record(ranks))
    assert "precision {'effective': 'bf16'} on rank 1" in res.summary
    json.dumps(res.details)  # `sextant check --json` writes them


# --- loader --------------------------------------------------------------------------------

def test_loader_threshold() -> None:
    ok = analyse.check_loader(record([rank(0, data=0.005), rank(1, data=0.009)]))
    assert ok.status == "pass" and ok.measured == pytest.approx(0.09)
    slow = analyse.check_loader(record([rank(0, data=0.03), rank(1, data=0.04)]))
    assert slow.status == "warn" and "rank 1" in slow.summary and "40%" in slow.summary
    assert "prefetch" in slow.hint.lower() or "num_workers" in slow.hint
    assert analyse.check_loader(record([rank(0, data=0.03)]), threshold=0.5).status == "pass"


# --- balance -------------------------------------------------------------------------------

def test_balance_healthy() -> None:
    res = analyse.check_balance(record([rank(0), rank(1)]), lockstep(lag={1: 0.002}))
    assert res.status == "pass"


def test_balance_names_data_skew() -> None:
    res = analyse.check_balance(record([rank(0), rank(1, rows=16)]), lockstep())
    assert res.status == "fail" and res.summary.startswith("data skew")
    assert "rank 1 gets 16 rows" in res.summary and "straggler" not in res.summary


def test_balance_names_a_straggler_from_its_finish_lag() -> None:
    # Ranks wait for each other at the all-reduce, so step times are equal; the slow rank
    # finishes each step later than the others.
    res = analyse.check_balance(record([rank(0), rank(1)]), lockstep(lag={1: 0.05}))
    assert res.status == "warn" and res.summary.startswith("straggler")
    assert "rank 1 is slow: same rows" in res.summary and "50.0 ms" in res.summary


def test_balance_names_a_rank_with_a_slow_loader() -> None:
    res = analyse.check_balance(record([rank(0), rank(1, data=0.03), rank(2)]), lockstep(3))
    assert res.status == "warn" and "rank 1" in res.summary and "batches" in res.summary


def test_balance_needs_two_ranks() -> None:
    assert analyse.check_balance(record([rank(0)]), lockstep(1)).status == "skip"


# --- scaling -------------------------------------------------------------------------------

def rec_tp(x):
    return record([rank(0)], samples_per_s=x)


def test_scaling_efficiency_and_drop() -> None:
    ok = analyse.check_scaling([(1, rec_tp(100.0), None), (2, rec_tp(180.0), None)])
    assert ok.status == "pass" and ok.measured == pytest.approx(0.9)
    drop = analyse.check_scaling([(1, rec_tp(100.0), None), (2, rec_tp(150.0), None),
                                  (4, rec_tp(120.0), None)])
    assert drop.status == "warn" and "2 -> 4 workers" in drop.summary
    assert drop.measured == pytest.approx(0.3)
    noise = analyse.check_scaling([(1, rec_tp(100.0), None), (2, rec_tp(95.0), None)])
    assert noise.status == "pass"
    assert analyse.check_scaling([(1, rec_tp(100.0), None)]).status == "skip"
    assert analyse.check_scaling([(1, rec_tp(1.0), None), (2, None, "boom")]).status == "fail"


# --- interconnect --------------------------------------------------------------------------

def test_bus_bandwidth_definitions() -> None:
    ar = analyse.bandwidths("allreduce", [2**20], [0.001], world=4)[0]
    assert ar["algbw_bytes_per_s"] == pytest.approx(2**20 / 0.001)
    assert ar["busbw_bytes_per_s"] == pytest.approx(2**20 / 0.001 * 2 * 3 / 4)
    ag = analyse.bandwidths("allgather", [2**20], [0.001], world=4)[0]
    assert ag["busbw_bytes_per_s"] == pytest.approx(2**20 / 0.001 * 3 / 4)


def test_interconnect_threshold_names_the_slower_collective() -> None:
    m = {"world": 2, "collectives": {
        "allreduce": {"sizes_bytes": [1024, 2**20], "times_s": [1e-4, 1e-3]},   # 8.4 Gb/s
        "allgather": {"sizes_bytes": [1024, 2**20], "times_s": [1e-4, 1e-3]}}}  # 4.2 Gb/s
    warn = analyse.check_interconnect(m, threshold_gbps=10)
    assert warn.status == "warn" and warn.summary.startswith("allgather bus bandwidth 4.19")
    assert analyse.check_interconnect(m, threshold_gbps=4).status == "pass"
    fail = analyse.check_interconnect(None, error="all-reduce calibration worker rank 1 timed out")
    assert fail.status == "fail" and "rank 1" in fail.summary


# --- checkpoint ----------------------------------------------------------------------------

def test_checkpoint_judgement() -> None:
    full = record([rank(0)])
    resumed = record([rank(0)], losses=full.losses[5:])
    assert analyse.check_checkpoint(full, full, resumed, 5).status == "pass"
    off = record([rank(0)], losses=[x + 1e-3 for x in full.losses[5:]])
    assert analyse.check_checkpoint(full, full, off, 5).status == "fail"
    restarted = record([rank(0, details={"notes": [
        "checkpoint step-00000005 refused: x.distcp does not match its checksum (corrupted)"]})],
        losses=full.losses)
    res = analyse.check_checkpoint(full, full, restarted, 5)
    assert res.status == "fail" and "step 0" in res.summary and "corrupted" in res.summary
    assert analyse.check_checkpoint(full, None, None, 5, error="saving run: boom").status == "fail"


def test_checkpoint_not_available_is_reported_not_run(monkeypatch, tmp_path) -> None:
    from sextant.checks import suite
    from sextant.strategy import Strategy
    from tests.helpers import short

    monkeypatch.setattr(suite, "checkpoint_supported", lambda s: False)
    opts = suite.CheckOptions(workload=short("gpt-tiny", 4), runs_dir=tmp_path)
    res = suite.run_checkpoint_check(opts.workload, Strategy(framework="torch"), None, opts)
    assert res.status == "skip"
    assert res.summary.startswith("not run: checkpointing not available for torch")


# --- results and exit codes ------------------------------------------------------------------

def test_exit_codes() -> None:
    def r(status):
        return CheckResult(check="x", status=status, summary="")
    assert exit_code([r("pass"), r("skip")]) == 0
    assert exit_code([r("pass"), r("warn")]) == 0
    assert exit_code([r("pass"), r("warn")], strict=True) == 3
    assert exit_code([r("warn"), r("fail")]) == 3
    assert worst([r("pass"), r("warn"), r("skip")]) == "warn"
    assert CHECKS[0] == "mvp"
