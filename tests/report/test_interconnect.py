"""The report's scaling-vs-interconnect model over stored run records."""

from __future__ import annotations

from typing import Any

from sextant.report.interconnect import interconnect
from sextant.results.record import RunRecord


def _run(run_id: int, parallel: str, workers: int, tps: float, link: float | None,
         status: str = "ok", workload: dict[str, Any] | None = None) -> RunRecord:
    network = ({"kind": "emulated", "hosts": ["sx-h0", "sx-h1"], "link_bit_s": link,
                "allreduce_fit": {"alpha_s": 1e-4, "beta_s_per_byte": 8 / link}}
               if link else {"kind": "loopback", "hosts": ["box"]})
    return RunRecord.from_dict({
        "id": run_id, "status": status, "workload": workload or {"name": "w"},
        "strategy": {"framework": "torch", "parallel": parallel, "workers": workers},
        "metrics": {"tokens_per_s": tps, "exposed_comm_share": 0.2,
                    "step_time_median_s": 16 * 64 / tps},
        "fingerprint": {"network": network}})


def test_efficiency_by_link_rate_against_one_process() -> None:
    runs = [_run(1, "single", 1, 1000.0, None), _run(2, "dp", 2, 1500.0, 10e9),
            _run(3, "dp", 2, 900.0, 1e9), _run(4, "dp", 2, 50.0, 1e8, status="failed"),
            _run(5, "dp", 2, 1700.0, None)]  # one host: not a point of this chart
    ic = interconnect(runs)
    (s,) = ic["series"]
    assert s["name"] == "torch dp x2"
    assert [(p["link_gbit"], p["efficiency"], p["id"]) for p in s["points"]] == [
        (1.0, 0.45, 3), (10.0, 0.75, 2)]
    assert s["prediction"] is None and "not calibrated" in ic["note"]


def test_no_run_across_hosts_says_how_to_make_one() -> None:
    ic = interconnect([_run(1, "single", 1, 1000.0, None)])
    assert ic["series"] == [] and "sextant cluster up" in ic["note"]


def test_the_planner_line_rises_with_the_link_rate_and_levels_off(tmp_path) -> None:
    """With a calibrated machine, the planner's efficiency is drawn at every link rate; a
    faster link never predicts a slower step, and past the compute bound it levels off."""
    import json

    from sextant.planner.local import load_machine
    from sextant.sources import resolve_workload

    calibration = {
        "schema": 1, "created": "test", "host": {"cores": 2, "memory_bytes": 2**34},
        "gemm": {"torch": {"flops_1_thread": 9e10, "flops_all_threads": 1.8e11, "threads": 2}},
        "memory_bw_bytes_per_s": 1.5e10,
        "allreduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1.4e-9},
    }
    (tmp_path / "calibration.json").write_text(json.dumps(calibration))
    machine = load_machine(tmp_path / "calibration.json")
    workload = resolve_workload("gpt-tiny").to_dict()
    runs = [_run(1, "single", 1, 40000.0, None, workload=workload),
            _run(2, "dp", 2, 30000.0, 1e9, workload=workload)]
    (s,) = interconnect(runs, machine)["series"]
    line = [q["efficiency"] for q in s["prediction"]]
    assert [q["link_gbit"] for q in s["prediction"]] == [0.1, 1.0, 10.0, 25.0, 100.0, 400.0]
    assert all(b >= a - 1e-12 for a, b in zip(line, line[1:]))
    assert line[0] < line[-1] and abs(line[-1] - line[-2]) < 0.01 * line[-1]
    assert s["points"][0]["predicted_efficiency"] == line[1]
