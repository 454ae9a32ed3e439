"""The claims check: every verdict branch of every claim, on constructed run records."""

from __future__ import annotations

import json

import pytest

from sextant.claims import HOLDS, INCONCLUSIVE, NOT_HOLD, NOT_MEASURED, check_claims
from sextant.claims.check import (
    claim_compile,
    claim_compression,
    claim_jax,
    claim_mixed_precision,
    claim_tf_memory,
    claim_workers,
    speedup,
)
from tests.report.runs import WORKLOAD, compare_group, make_run, with_ranks

MB = 2**20


def test_all_claims_in_fixed_order_and_json_able() -> None:
    claims = check_claims(compare_group())
    assert [c.id for c in claims] == ["compile", "jax-vs-eager", "mixed-precision",
                                      "compression", "workers-slower", "tf-memory",
                                      "tf-deploy", "torch-tools", "jax-deploy"]
    assert all(c.verdict in (HOLDS, NOT_HOLD, INCONCLUSIVE, NOT_MEASURED) for c in claims)
    json.dumps([c.to_dict() for c in claims])


def test_speedup_is_ratio_of_medians_with_a_bootstrap_interval() -> None:
    base, new = make_run(step=0.2, spread=0.1), make_run(step=0.1, spread=0.2)
    value, low, high = speedup(base, new)
    assert value == pytest.approx(2.0)
    # Narrower than the step-to-step range (0.18 / 0.12 to 0.22 / 0.08), around the value.
    assert 0.18 / 0.12 < low < 2.0 < high < 0.22 / 0.08
    assert speedup(base, new) == (value, low, high)  # seeded: the same runs, the same CI


# -- torch.compile ---------------------------------------------------------------------

def test_compile_holds() -> None:
    c = claim_compile([make_run(step=0.20), make_run(mode="compiled", step=0.16)], WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(1.25)
    assert c.low is not None and c.low < c.value < c.high
    assert "1.25x" in c.figure and "faster" in c.figure and "95% CI" in c.figure
    assert c.command == "sextant compare --workload gpt-tiny --steps 20 --frameworks torch"
    assert len(c.run_ids) == 2


def test_compile_straddling_the_threshold_is_inconclusive() -> None:
    at = claim_compile([make_run(step=0.22), make_run(mode="compiled", step=0.20)], WORKLOAD)
    assert at.verdict == INCONCLUSIVE and at.low < 1.10 < at.high
    # The same medians with a tight spread: the interval clears the threshold.
    tight = claim_compile([make_run(step=0.23, spread=0.01),
                           make_run(mode="compiled", step=0.20, spread=0.01)], WORKLOAD)
    assert tight.verdict == HOLDS
    below = claim_compile([make_run(step=0.21, spread=0.01),
                           make_run(mode="compiled", step=0.20, spread=0.01)], WORKLOAD)
    assert below.verdict == NOT_HOLD and below.high < 1.10


def test_one_trial_without_step_times_is_inconclusive() -> None:
    eager, compiled = make_run(step=0.30), make_run(mode="compiled", step=0.10)
    # An older record: medians only.
    eager, compiled = (with_ranks(run, step_times_s=()) for run in (eager, compiled))
    c = claim_compile([eager, compiled], WORKLOAD)
    assert c.value == pytest.approx(3.0) and c.verdict == INCONCLUSIVE and c.low is None


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
    c = claim_jax([make_run(step=0.20, spread=0.01),
                   make_run("jax", "compiled", step=0.19, spread=0.01)], WORKLOAD)
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
        runs[0].id, runs[1].id)


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
    assert c.verdict == INCONCLUSIVE  # one trial a side: no interval of exposed comm
    assert "exposed communication 0.25x" in c.figure and "compute 1.1" in c.figure
    assert c.details == ("torch dp x2 compress=powersgd vs torch dp x2: exposed comm "
                         "40.0 -> 10.0 ms, compute 80.0 -> 90.0 ms",)
    # Two trials a side (interleaved, as --repeats 2 stores them).
    runs += [_dp(step=0.12, comm=0.042, sync_step=0.12),
             _dp(step=0.10, comm=0.011, sync_step=0.10, compress="powersgd")]
    c = claim_compression(runs, WORKLOAD)
    assert c.verdict == HOLDS and c.value == pytest.approx(0.0105 / 0.041)  # trial means
    assert "95% CI of exposed communication 0.2" in c.figure


def test_compression_without_cpu_cost_does_not_hold() -> None:
    runs = [_dp(step=0.12, comm=0.04, sync_step=0.12),
            _dp(step=0.09, comm=0.02, sync_step=0.09, compress="bf16")] * 2
    assert claim_compression(runs, WORKLOAD).verdict == NOT_HOLD
    more_comm = [_dp(step=0.12, comm=0.04, sync_step=0.12),
                 _dp(step=0.2, comm=0.05, sync_step=0.2, compress="fp16")] * 2
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


def test_workers_within_noise_is_inconclusive_or_does_not_hold() -> None:
    runs = [make_run(step=0.2), make_run("torch", "eager", "dp", 2, step=0.205)]
    assert claim_workers(runs, WORKLOAD).verdict == INCONCLUSIVE  # CI straddles 0.95
    runs = [make_run(step=0.2, spread=0.01),
            make_run("torch", "eager", "dp", 2, step=0.205, spread=0.01)]
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
    assert compile_claim.value == pytest.approx(0.2 / 0.19) and compile_claim.run_ids == (
        runs[0].id, runs[3].id)


def test_runs_without_a_workload_hash_are_matched_by_their_workload() -> None:
    runs = [make_run(step=0.2).replace(workload_hash=""),
            make_run(mode="compiled", step=0.1).replace(workload_hash="")]
    assert check_claims(runs)[0].verdict == HOLDS


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


# -- repeated trials and disturbed runs ------------------------------------------------

def _trials(step: float, n: int, mode: str = "eager", group: str = "g1", **kw):
    return [make_run(mode=mode, step=step * (1 + 0.02 * i), **kw).replace(group_id=group)
            for i in range(n)]


def test_trials_of_a_group_are_pooled_and_other_groups_are_not() -> None:
    eager = _trials(0.20, 3)
    compiled = _trials(0.16, 3, mode="compiled")
    other = _trials(0.01, 3, mode="compiled", group="g2")  # another compare: never pooled
    c = claim_compile(eager + other + compiled, WORKLOAD)
    assert c.verdict == HOLDS
    assert c.value == pytest.approx(0.2 * 1.02 / (0.16 * 1.02))
    assert c.low < c.value < c.high


def test_trials_that_disagree_make_the_verdict_inconclusive() -> None:
    # Each trial is tight, but the trials of compiled disagree by 40%: the between-trial
    # level of the bootstrap widens the interval across the threshold.
    eager = [make_run(step=0.20, spread=0.01) for _ in range(3)]
    compiled = [make_run(mode="compiled", step=s, spread=0.01) for s in (0.14, 0.20, 0.17)]
    c = claim_compile(eager + compiled, WORKLOAD)
    assert c.verdict == INCONCLUSIVE and c.low < 1.10 < c.high


def test_disturbed_runs_are_left_out_of_verdicts() -> None:
    eager = make_run(step=0.20, spread=0.01)
    quiet = make_run(mode="compiled", step=0.21, spread=0.01)
    burst = make_run(mode="compiled", step=0.10, spread=0.01)  # a lucky, disturbed trial
    burst = burst.with_metrics(disturbed=True)
    c = check_claims([eager, quiet, burst])[0]
    assert burst.id not in c.run_ids and quiet.id in c.run_ids
    # compiled lost one of its two trials: its interval covers one run only, no verdict.
    assert c.verdict == INCONCLUSIVE and "lost a trial" in c.reason
    # The disturbed run belonged to an earlier compare: nothing lost here, a verdict.
    c = check_claims([burst.replace(group_id="earlier"), eager, quiet])[0]
    assert c.verdict == NOT_HOLD and burst.id not in c.run_ids
    # Only disturbed runs of compiled: measured, but no verdict.
    c = check_claims([eager, burst])[0]
    assert c.verdict == INCONCLUSIVE and "disturbed" in c.reason
