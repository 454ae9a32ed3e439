"""The claims check: every verdict branch of every claim, on constructed run records."""

from __future__ import annotations

import json

import pytest

from sextant.claims import HOLDS, NOT_HOLD, NOT_MEASURED, check_claims
from sextant.claims.check import (
    claim_compile,
    claim_compression,
    claim_jax,
    claim_mixed_precision,
    claim_tf_memory,
    claim_workers,
    speedup,
)
from tests.report.runs import WORKLOAD, compare_group, make_run

MB = 2**20


def test_all_claims_in_fixed_order_and_json_able() -> None:
    claims = check_claims(compare_group())
    assert [c.id for c in claims] == ["compile", "jax-vs-eager", "mixed-precision",
                                      "compression", "workers-slower", "tf-memory"]
    assert all(c.verdict in (HOLDS, NOT_HOLD, NOT_MEASURED) for c in claims)
    json.dumps([c.to_dict() for c in claims])


def test_speedup_is_ratio_of_medians_with_p10_p90_range() -> None:
    base, new = make_run(step=0.2, spread=0.1), make_run(step=0.1, spread=0.2)
    value, low, high = speedup(base, new)
    assert value == pytest.approx(2.0)
    assert low == pytest.approx(0.18 / 0.12) and high == pytest.approx(0.22 / 0.08)


# -- torch.compile ---------------------------------------------------------------------

def test_compile_holds() -> None:
    c = claim_compile([make_run(step=0.20), make_run(mode="compiled", step=0.16)], WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(1.25)
    assert c.low is not None and c.low < c.value < c.high
    assert "1.25x" in c.figure and "faster" in c.figure and "range" in c.figure
    assert c.command == "sextant compare --workload gpt-tiny --steps 20 --frameworks torch"
    assert len(c.run_ids) == 2


def test_compile_at_threshold_holds_below_does_not() -> None:
    at = claim_compile([make_run(step=0.22), make_run(mode="compiled", step=0.20)], WORKLOAD)
    assert at.verdict == HOLDS
    below = claim_compile([make_run(step=0.21), make_run(mode="compiled", step=0.20)],
                          WORKLOAD)
    assert below.verdict == NOT_HOLD


def test_compile_slower_does_not_hold() -> None:
    c = claim_compile([make_run(step=0.20), make_run(mode="compiled", step=0.25)], WORKLOAD)
    assert c.verdict == NOT_HOLD and "slower" in c.figure


def test_compile_not_measured_without_both_runs() -> None:
    c = claim_compile([make_run(step=0.20), make_run("jax", "compiled", step=0.1)], WORKLOAD)
    assert c.verdict == NOT_MEASURED and "torch compiled" in c.reason and c.figure == "-"
    # A data-parallel compiled run is not a one-process comparison.
    c = claim_compile([make_run(step=0.2), make_run(mode="compiled", parallel="dp", workers=2)],
                      WORKLOAD)
    assert c.verdict == NOT_MEASURED


# -- JAX vs eager PyTorch ----------------------------------------------------------------

def test_jax_holds() -> None:
    c = claim_jax([make_run(step=0.20), make_run("jax", "compiled", step=0.08)], WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(2.5)
    assert "60% less" in c.figure
    assert c.command.endswith("--frameworks torch,jax")


def test_jax_small_saving_does_not_hold() -> None:
    c = claim_jax([make_run(step=0.20), make_run("jax", "compiled", step=0.19)], WORKLOAD)
    assert c.verdict == NOT_HOLD


def test_jax_slower_does_not_hold() -> None:
    c = claim_jax([make_run(step=0.20), make_run("jax", "compiled", step=0.30)], WORKLOAD)
    assert c.verdict == NOT_HOLD and "more time" in c.figure


def test_jax_not_measured() -> None:
    c = claim_jax([make_run(step=0.20)], WORKLOAD)
    assert c.verdict == NOT_MEASURED and "jax" in c.reason
    c = claim_jax([make_run("jax", "compiled", step=0.1)], WORKLOAD)
    assert c.verdict == NOT_MEASURED and "torch eager" in c.reason


# -- mixed precision ---------------------------------------------------------------------

def test_mixed_precision_holds() -> None:
    runs = [make_run(step=0.20), make_run(step=0.10, precision="bf16")]
    c = claim_mixed_precision(runs, WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(2.0)
    assert c.command == "sextant runs show {}; sextant runs show {}".format(
        runs[0]["id"], runs[1]["id"])


def test_mixed_precision_does_not_hold() -> None:
    c = claim_mixed_precision([make_run(step=0.20), make_run(step=0.18, precision="bf16")],
                              WORKLOAD)
    assert c.verdict == NOT_HOLD


def test_mixed_precision_takes_the_middle_pair() -> None:
    runs = [make_run(step=0.20), make_run(step=0.18, precision="bf16"),
            make_run("jax", "compiled", step=0.2), make_run("jax", "compiled", step=0.1,
                                                            precision="bf16"),
            make_run("torch", "eager", "dp", 2, step=0.2),
            make_run("torch", "eager", "dp", 2, step=0.08, precision="bf16")]
    c = claim_mixed_precision(runs, WORKLOAD)
    assert c.value == pytest.approx(2.0) and c.verdict == HOLDS and len(c.details) == 3


def test_mixed_precision_not_measured() -> None:
    assert claim_mixed_precision([make_run()], WORKLOAD).verdict == NOT_MEASURED
    # bf16 without an fp32 run of the same configuration: nothing to compare.
    c = claim_mixed_precision([make_run(step=0.2),
                               make_run("torch", "eager", "dp", 2, precision="bf16")], WORKLOAD)
    assert c.verdict == NOT_MEASURED and "bf16" in c.reason


# -- compression -------------------------------------------------------------------------

def _dp(**kw):
    return make_run("torch", "eager", "dp", 2, **kw)


def test_compression_holds() -> None:
    runs = [_dp(step=0.12, comm=0.04, sync_step=0.12),
            _dp(step=0.10, comm=0.01, sync_step=0.10, compress="powersgd")]
    c = claim_compression(runs, WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(0.25)
    assert "exposed communication 0.25x" in c.figure and "compute 1.1" in c.figure
    assert c.details == ("torch dp x2 compress powersgd vs torch dp x2: exposed comm "
                         "40.0 -> 10.0 ms, compute 80.0 -> 90.0 ms",)


def test_compression_without_cpu_cost_does_not_hold() -> None:
    runs = [_dp(step=0.12, comm=0.04, sync_step=0.12),
            _dp(step=0.09, comm=0.02, sync_step=0.09, compress="bf16")]
    assert claim_compression(runs, WORKLOAD).verdict == NOT_HOLD
    more_comm = [_dp(step=0.12, comm=0.04, sync_step=0.12),
                 _dp(step=0.2, comm=0.05, sync_step=0.2, compress="fp16")]
    assert claim_compression(more_comm, WORKLOAD).verdict == NOT_HOLD


def test_compression_not_measured() -> None:
    assert claim_compression([_dp(comm=0.04, sync_step=0.1)], WORKLOAD).verdict == NOT_MEASURED
    no_comm = [_dp(comm=0.04, sync_step=0.1), _dp(compress="powersgd")]
    assert claim_compression(no_comm, WORKLOAD).verdict == NOT_MEASURED
    no_plain = [_dp(comm=0.01, sync_step=0.1, compress="powersgd")]
    assert claim_compression(no_plain, WORKLOAD).verdict == NOT_MEASURED


# -- adding workers ----------------------------------------------------------------------

def test_workers_slower_holds_for_the_slowest_framework() -> None:
    runs = [make_run(step=0.2), make_run("torch", "eager", "dp", 2, step=0.12),
            make_run("jax", "compiled", step=0.08), make_run("jax", "compiled", "dp", 2,
                                                             step=0.3)]
    c = claim_workers(runs, WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(0.08 / 0.3)
    assert "jax compiled dp x2" in c.figure and len(c.details) == 2
    assert c.command.endswith("--frameworks torch,jax")


def test_workers_faster_does_not_hold() -> None:
    runs = [make_run(step=0.2), make_run("torch", "eager", "dp", 4, step=0.06)]
    c = claim_workers(runs, WORKLOAD)
    assert c.verdict == NOT_HOLD and c.value == pytest.approx(0.2 / 0.06)
    assert c.command.endswith("--frameworks torch --workers 4")


def test_workers_within_noise_does_not_hold() -> None:
    runs = [make_run(step=0.2), make_run("torch", "eager", "dp", 2, step=0.205)]
    assert claim_workers(runs, WORKLOAD).verdict == NOT_HOLD


def test_workers_not_measured() -> None:
    assert claim_workers([make_run(step=0.2)], WORKLOAD).verdict == NOT_MEASURED
    # torch compiled single vs torch eager dp: not the same mode.
    runs = [make_run(mode="compiled"), make_run("torch", "eager", "dp", 2)]
    assert claim_workers(runs, WORKLOAD).verdict == NOT_MEASURED


# -- TensorFlow memory -------------------------------------------------------------------

def test_tf_memory_holds() -> None:
    runs = [make_run(rss=300 * MB), make_run("jax", "compiled", rss=450 * MB),
            make_run("tensorflow", "compiled", rss=200 * MB)]
    c = claim_tf_memory(runs, WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(200 / 300)
    assert len(c.details) == 2


def test_tf_memory_does_not_hold_when_one_framework_is_leaner() -> None:
    runs = [make_run(rss=300 * MB), make_run("jax", "compiled", rss=450 * MB),
            make_run("tensorflow", "compiled", rss=350 * MB)]
    c = claim_tf_memory(runs, WORKLOAD)
    assert c.verdict == NOT_HOLD and c.value == pytest.approx(350 / 300)


def test_tf_memory_compares_same_strategy_and_leanest_mode() -> None:
    runs = [make_run(rss=300 * MB), make_run(mode="compiled", rss=250 * MB),
            make_run("tensorflow", "compiled", rss=240 * MB),
            make_run("tensorflow", "compiled", "dp", 2, rss=100 * MB),
            make_run("torch", "eager", "dp", 2, rss=400 * MB)]
    c = claim_tf_memory(runs, WORKLOAD)
    # single: 240 / 250 (the leaner torch mode) = 0.96 is not 5% less: does not hold.
    assert c.verdict == NOT_HOLD and c.value == pytest.approx(240 / 250)
    assert len(c.details) == 2
    dp = claim_tf_memory(runs[3:], WORKLOAD)
    assert dp.verdict == HOLDS and dp.low is not None and dp.low <= dp.value <= dp.high


def test_tf_memory_not_measured() -> None:
    c = claim_tf_memory([make_run(), make_run("jax", "compiled")], WORKLOAD)
    assert c.verdict == NOT_MEASURED and "TensorFlow" in c.reason
    c = claim_tf_memory([make_run(), make_run("tensorflow", "compiled", "dp", 2)], WORKLOAD)
    assert c.verdict == NOT_MEASURED and "same parallel strategy" in c.reason


# -- selection ---------------------------------------------------------------------------

def test_failed_runs_and_other_workloads_are_ignored() -> None:
    runs = [make_run(step=0.2), make_run(mode="compiled", step=0.1, status="failed"),
            make_run(mode="compiled", step=0.05, workload_hash="other"),
            make_run(mode="compiled", step=0.19)]
    compile_claim = check_claims(runs, workload_hash="w1")[0]
    assert compile_claim.verdict == NOT_HOLD and compile_claim.run_ids == (
        runs[0]["id"], runs[3]["id"])


def test_default_workload_is_the_last_runs() -> None:
    runs = [make_run(step=0.2, workload_hash="old"), make_run(mode="compiled", step=0.1,
                                                              workload_hash="old"),
            make_run(step=0.2, workload_hash="new")]
    assert check_claims(runs)[0].verdict == NOT_MEASURED
    assert check_claims(runs, workload_hash="old")[0].verdict == HOLDS


def test_command_quotes_the_workload_name() -> None:
    workload = dict(WORKLOAD, name="my model; rm -rf /")
    c = claim_compile([make_run()], workload)
    assert "--workload 'my model; rm -rf /'" in c.command


def test_no_runs_gives_not_measured_everywhere() -> None:
    assert {c.verdict for c in check_claims([])} == {NOT_MEASURED}
