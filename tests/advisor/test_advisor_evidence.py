"""Measured evidence from run records, and how it changes the advice."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sextant.advisor import advise, evidence_from_runs, render_markdown, to_dict
from sextant.advisor.evidence import evidence_from_deployments
from sextant.core.errors import UserError
from sextant.results.deploy import DeployRecord, Latency
from tests.advisor.util import profile, run


def _by(evidence, candidate, metric):
    return next(e for e in evidence if e.candidate == candidate and e.metric == metric)


def test_throughput_ratio_against_the_fastest_at_matched_configs() -> None:
    runs = [
        run(1, "torch", 1000.0), run(2, "torch", 1200.0, mode="compiled", compile_time_s=30),
        run(3, "jax", 2400.0, mode="compiled", compile_time_s=10),
        run(4, "tensorflow", 600.0),
        run(5, "jax", 9999.0, workload_hash="other"),  # alone on its workload: not compared
    ]
    ev = evidence_from_runs(runs)
    assert _by(ev, "jax", "throughput_ratio").value == 1.0
    assert _by(ev, "pytorch", "throughput_ratio").value == pytest.approx(0.5)  # best mode
    assert _by(ev, "pytorch+deepspeed", "throughput_ratio").value == pytest.approx(0.5)
    assert _by(ev, "tensorflow", "throughput_ratio").value == pytest.approx(0.25)
    assert all(e.source == "measured" for e in ev)
    assert set(_by(ev, "pytorch", "throughput_ratio").run_ids) == {"2", "3", "4"}
    assert _by(ev, "pytorch", "compile_time_s").value == 30
    assert not [e for e in ev if e.candidate == "mlx"]


def test_scaling_memory_and_comm() -> None:
    runs = [
        run(1, "torch", 1000.0, peak_rss_bytes=3 * 2**30),
        run(2, "torch", 1500.0, parallel="dp", workers=2, exposed_comm_share=0.2),
        run(3, "torch", 2000.0, parallel="dp", workers=4, exposed_comm_share=0.4),
        run(4, "jax", 1000.0, peak_rss_bytes=2**30),
        run(5, "jax", 3800.0, parallel="dp", workers=4, exposed_comm_share=None),
    ]
    ev = evidence_from_runs(runs)
    assert _by(ev, "pytorch", "scaling_efficiency").value == pytest.approx(0.5)  # largest dp
    assert _by(ev, "jax", "scaling_efficiency").value == pytest.approx(0.95)
    # 3x jax's memory single-process, equal at dp x4 (1 GiB each): geometric mean sqrt(3).
    assert _by(ev, "pytorch", "memory_ratio").value == pytest.approx(3.0 ** 0.5)
    assert _by(ev, "jax", "memory_ratio").value == 1.0
    assert _by(ev, "pytorch", "peak_rss_bytes").value == 3 * 2**30
    assert _by(ev, "pytorch", "exposed_comm_share").value == pytest.approx(0.3)
    assert not [e for e in ev if e.candidate == "jax" and e.metric == "exposed_comm_share"]
    # dp x4: torch 2000 vs jax 3800 also compared, geometric mean with single (1.0 each)
    assert _by(ev, "pytorch", "throughput_ratio").value == pytest.approx((2000 / 3800) ** 0.5)


def test_bad_and_irrelevant_runs() -> None:
    keras = evidence_from_runs([run(1, "keras", 10.0), run(2, "torch", 5.0)])
    assert keras and all(e.run_ids == ("2",) for e in keras)  # keras stands for no stack
    only_failed = [run(1, "torch", 10.0), run(2, "jax", 50.0, status="failed")]
    assert not [e for e in evidence_from_runs(only_failed) if e.metric == "throughput_ratio"]
    assert evidence_from_runs([run(1, "torch", None), run(2, "jax", 0.0)]) == [
        e for e in evidence_from_runs([run(1, "torch", None), run(2, "jax", 0.0)])
        if e.metric != "throughput_ratio"
    ]


def test_evidence_does_not_depend_on_run_order() -> None:
    runs = [run(i, fw, 100.0 + 37 * i, parallel=par, workers=w)
            for i, (fw, par, w) in enumerate([("torch", "single", 1), ("jax", "single", 1),
                                              ("tensorflow", "single", 1), ("torch", "dp", 2),
                                              ("jax", "dp", 2)])]
    shuffled = runs[:]
    random.Random(4).shuffle(shuffled)
    assert evidence_from_runs(runs) == evidence_from_runs(shuffled)


def test_measured_throughput_changes_compute_cost() -> None:
    p = profile()
    plain = {r.candidate: r.cost for r in advise(p).ranking}
    ev = evidence_from_runs([run(1, "torch", 1000.0), run(2, "jax", 2000.0)])
    measured = advise(p, ev)
    costs = {r.candidate: r.cost for r in measured.ranking}
    assert costs["pytorch"].compute_usd == pytest.approx(2 * plain["pytorch"].compute_usd)
    assert costs["pytorch"].throughput_source == "measured"
    assert costs["jax"].compute_usd == pytest.approx(plain["jax"].compute_usd)
    assert costs["tensorflow"].throughput_source == "rule of thumb"
    assert any("measured for pytorch, pytorch+deepspeed, jax" in a for a in measured.assumptions)
    # Output labels measured and rule-of-thumb evidence differently.
    md = render_markdown(measured)
    assert "| pytorch | throughput_ratio | 0.50x | measured |" in md
    data = to_dict(measured)
    assert {e["source"] for e in data["evidence"]} == {"measured"}


def test_evidence_rules_fire_on_measurements() -> None:
    ev = evidence_from_runs([
        run(1, "torch", 1000.0), run(2, "torch", 1000.0, parallel="dp", workers=2),
        run(3, "jax", 1000.0, mode="compiled", compile_time_s=300.0),
    ])
    advice = advise(profile(purpose="research"), ev)
    fired = {f.id: f for f in advice.fired}
    assert fired["measured.poor-scaling"].source == "measured"
    assert dict(fired["measured.poor-scaling"].effect) == {"pytorch": -1.0,
                                                          "pytorch+deepspeed": -1.0}
    assert "50%" in fired["measured.poor-scaling"].detail
    assert dict(fired["measured.slow-compile"].effect) == {"jax": -0.5}
    pytorch = next(r for r in advice.ranking if r.candidate == "pytorch")
    assert ("measured.poor-scaling", -1.0, "measured") in pytorch.reasons
    # On one device scaling does not matter: the rule's condition does not hold.
    assert "measured.poor-scaling" not in {f.id for f in advise(profile(devices=1), ev).fired}


def test_deepspeed_runs_are_the_evidence_for_pytorch_deepspeed() -> None:
    runs = [run(1, "torch", 1000.0, parallel="zero2", workers=2),
            run(2, "deepspeed", 800.0, parallel="zero2", workers=2)]
    ev = evidence_from_runs(runs)
    assert _by(ev, "pytorch", "throughput_ratio").value == 1.0
    assert _by(ev, "pytorch+deepspeed", "throughput_ratio").value == pytest.approx(0.8)
    assert _by(ev, "pytorch+deepspeed", "throughput_ratio").run_ids == ("1", "2")
    # torch no longer stands in for it: every pytorch+deepspeed fact rests on run 2.
    assert all("2" in e.run_ids for e in ev if e.candidate == "pytorch+deepspeed")
    # A failed deepspeed run is no evidence: torch stands in again.
    ev = evidence_from_runs([runs[0], runs[1].replace(status="failed")])
    assert _by(ev, "pytorch+deepspeed", "peak_rss_bytes").run_ids == ("1",)


def test_disturbed_runs_are_no_evidence_of_speed() -> None:
    """A run another program slowed (metrics.disturbed) says nothing about its stack's speed,
    as in the report's verdicts; its memory still counts."""
    quiet = [run(1, "torch", 1000.0), run(2, "paddle", 500.0),
             run(3, "paddle", 900.0, parallel="dp", workers=2)]
    slowed = run(4, "torch", 100.0, parallel="dp", workers=2, peak_rss_bytes=2**31,
                 disturbed=True)
    ev = {(e.candidate, e.metric): e for e in evidence_from_runs(quiet + [slowed])}
    assert ev[("pytorch", "throughput_ratio")].run_ids == ("1", "2")
    assert ("pytorch", "scaling_efficiency") not in ev   # its only dp run was disturbed
    assert ev[("pytorch", "peak_rss_bytes")].value == 2**31
    # Without the flag, the same slowed run would make torch look 10x slower at dp x2.
    slowed = run(4, "torch", 100.0, parallel="dp", workers=2, peak_rss_bytes=2**31)
    ev = {(e.candidate, e.metric): e for e in evidence_from_runs(quiet + [slowed])}
    assert ev[("pytorch", "scaling_efficiency")].value < 0.1


def test_measurements_count_only_for_the_hardware_they_were_taken_on() -> None:
    from sextant.advisor.evidence import applicable, hardware_class

    cpu = [run(1, "torch", 1000.0), run(2, "torch", 430.0, parallel="dp", workers=2)]
    gpu = run(3, "torch", 9e5, device="gpu", accelerator="NVIDIA H200")
    assert [hardware_class(r) for r in cpu + [gpu]] == ["cpu", "cpu", "nvidia"]
    kept, note = applicable(cpu + [gpu], "nvidia")
    assert kept == [gpu]
    assert note is not None and "2 run(s) measured on CPU cores, not your target (nvidia)" in note
    assert applicable(cpu, "cpu") == (cpu, None)
    # The "7B LLM on rented H100s" team is not told that its stacks scale poorly because two
    # one-thread CPU workers were slower than one two-thread worker.
    ev = evidence_from_runs(applicable(cpu, "nvidia")[0])
    assert "measured.poor-scaling" not in {f.id for f in advise(profile(), ev).fired}


def test_scaling_efficiency_holds_the_total_compute_equal() -> None:
    # On 2 cores: one worker with both threads against two workers with one thread each.
    single = run(1, "torch", 1000.0, threads_per_worker=2)
    dp = run(2, "torch", 860.0, parallel="dp", workers=2, threads_per_worker=1)
    assert _by(evidence_from_runs([single, dp]), "pytorch",
               "scaling_efficiency").value == pytest.approx(0.86)  # not 0.43
    # On GPUs each worker adds a device: N devices against one.
    single = run(1, "torch", 1000.0, threads_per_worker=2, device="gpu")
    dp = run(2, "torch", 860.0, parallel="dp", workers=2, threads_per_worker=1, device="gpu")
    assert _by(evidence_from_runs([single, dp]), "pytorch",
               "scaling_efficiency").value == pytest.approx(0.43)


def _deployed(framework: str, fmt: str, targets: tuple[str, ...], ok: bool = True
              ) -> DeployRecord:
    return DeployRecord(framework=framework, format=fmt, runtime="r",
                        status="ok" if ok else "failed", workload_name="w", workload_hash="h",
                        params_sha256="p", id=len(fmt), targets=targets,
                        parity="match" if ok else None, probe="works" if ok else None)


def test_a_production_profile_reads_the_measured_deployment_matrix() -> None:
    """The fixed production and on-device rules give way to the measured rows: a stack whose
    artifacts reach the team's target gains, one whose artifacts do not loses."""
    rows = [_deployed("tensorflow", "litert", ("mobile", "edge")),
            _deployed("torch", "torch-export", ("server",)),
            _deployed("torch", "executorch", ("mobile", "edge"), ok=False),
            _deployed("jax", "jax-export", ("server",))]
    team = profile(deployment="mobile", purpose="production")
    evidence = evidence_from_deployments(rows, team.deployment)
    by = {(e.candidate, e.metric): e.value for e in evidence}
    assert by[("tensorflow", "deploy_formats")] == 1
    assert by[("pytorch", "deploy_formats")] == 0 and by[("jax", "deploy_formats")] == 0
    advice = advise(team, evidence)
    fired = {f.id: f for f in advice.fired}
    assert "purpose.production" not in fired and "deploy.mobile-edge" not in fired
    assert dict(fired["measured.deploy-reached"].effect) == {"tensorflow": 1.5}
    assert set(dict(fired["measured.deploy-missing"].effect)) == {
        "pytorch", "pytorch+deepspeed", "jax"}
    # Without the matrix, the rules of thumb stand.
    assert "deploy.mobile-edge" in {f.id for f in advise(team, []).fired}


def test_serving_term_prices_each_stack_at_its_measured_latency() -> None:
    def timed(framework: str, fmt: str, ms: float) -> DeployRecord:
        row = _deployed(framework, fmt, ("server",))
        return dataclasses.replace(row, latency=(Latency(batch=1, n=5, p50_s=ms / 1e3,
                                                         p90_s=ms / 1e3),))

    rows = [timed("torch", "onnx", 0.5), timed("torch", "torch-export", 1.0),
            timed("tensorflow", "savedmodel", 1.5)]
    team = profile(serving_requests_per_day=1e6, serving_seconds_per_request=0.01)
    evidence = evidence_from_deployments(rows, "server")
    ratio = {e.candidate: e.value for e in evidence if e.metric == "serving_latency_ratio"}
    assert ratio["pytorch"] == 1.0 and ratio["tensorflow"] == pytest.approx(3.0)
    costs = {r.candidate: r.cost for r in advise(team, evidence).ranking}
    hours = 1e6 * 365 * 0.01 / 3600  # the fastest stack's device-hours
    assert costs["pytorch"].serving_hours == pytest.approx(hours)
    assert costs["tensorflow"].serving_usd == pytest.approx(3 * hours * 2.0)
    assert costs["jax"].serving_factor == 1.0  # not measured: priced as the fastest
    for cost in costs.values():
        assert cost.total_usd == pytest.approx(cost.compute_usd + cost.serving_usd
                                               + cost.people_usd)
    assert "| Serving |" in render_markdown(advise(team, evidence))
    with pytest.raises(UserError, match="both serving_requests_per_day"):
        profile(serving_requests_per_day=1e6)
