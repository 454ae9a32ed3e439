"""Constructed run records (RunRecord, built by its own constructor from the JSON form the
store keeps) for the report and claims tests: no training, no store needed."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

from sextant.results.record import Fingerprint, RunRecord

WORKLOAD = {"name": "gpt-tiny", "description": "a test workload", "seed": 0, "steps": 20,
            "global_batch": 16,
            "model": {"family": "gpt", "vocab_size": 256, "seq_len": 64, "d_model": 64,
                      "n_layers": 2, "n_heads": 4, "d_ff": 256}}
_ids = itertools.count(1)


WARMUP, TIMED = 5, 15
# Fixed, shuffled offsets in [-1.25, 1.25]: median 0, p10/p90 about -/+1.
_OFFSETS = [0.0, 0.89, -0.36, 1.25, -1.07, 0.54, -0.18, -1.25, 0.71, -0.54, 1.07, -0.89,
            0.18, 0.36, -0.71]


def step_times(step: float, spread: float) -> list[float]:
    """Per-step times of one rank: WARMUP slow steps, then TIMED steady ones whose median is
    `step` and whose p10/p90 are about step x (1 -/+ spread)."""
    return [step * 3] * WARMUP + [step * (1 + spread * u) for u in _OFFSETS]


def make_run(framework: str = "torch", mode: str = "eager", parallel: str = "single",
             workers: int = 1, *, step: float = 0.1, spread: float = 0.1,
             rss: float = 300 * 2**20, precision: str = "fp32", compress: str = "none",
             comm: float | None = None, sync_step: float | None = None,
             first_step: float | None = None, losses: list[float] | None = None,
             workload_hash: str = "w1", status: str = "ok", ranks: int | None = None,
             **metrics_over: Any) -> RunRecord:
    """One run; step is the median step time, p10/p90 = step x (1 -/+ spread);
    `metrics_over` sets any other metric."""
    run_id = next(_ids)
    tokens = WORKLOAD["global_batch"] * WORKLOAD["model"]["seq_len"]
    n_ranks = ranks if ranks is not None else workers
    metrics: dict[str, Any] = {
        "params": 136960,
        "step_time_median_s": step, "step_time_p10_s": step * (1 - spread),
        "step_time_p90_s": step * (1 + spread), "steps_timed": 15,
        "first_step_s": first_step if first_step is not None else step * 2,
        "compile_s": (first_step - step) if first_step is not None else step,
        "tokens_per_s": tokens / step, "samples_per_s": WORKLOAD["global_batch"] / step,
        "achieved_flops_per_s": 1e9, "peak_rss_bytes": rss,
        "peak_rss_total_bytes": rss * workers, "data_wait_share": 0.01,
        "final_loss": (losses or [3.0])[-1], "threads_per_worker": 2 // workers or 1,
        "exposed_comm_s": comm,
        "exposed_comm_share": (comm / (sync_step or step)) if comm is not None else None,
        "sync_step_median_s": sync_step, "nosync_step_median_s":
            (sync_step - comm) if sync_step is not None and comm is not None else None,
        **metrics_over,
    }
    strategy = {"framework": framework, "mode": mode, "parallel": parallel,
                "workers": workers, "precision": precision, "compress": compress,
                "devices_per_worker": 1, "ps": 0, "threads": None}
    return RunRecord.from_dict({
        "id": run_id, "created_at": "2026-11-30T10:00:00+0000", "group_id": "g1",
        "status": status, "workload_name": WORKLOAD["name"], "workload_hash": workload_hash,
        "framework": framework, "mode": mode, "parallel": parallel, "workers": workers,
        "precision": precision,
        "workload": dict(WORKLOAD), "strategy": strategy, "metrics": metrics,
        "losses": list(losses or [5.5, 4.0, 3.0]), "grad_norms": [1.0, 1.0, 1.0],
        "ranks": [{"rank": r, "step_time": {"median": step, "p10": step * 0.9,
                                            "p90": step * 1.1, "n": 15},
                   "step_times_s": step_times(step, spread), "data_wait_median_s": 0.001,
                   "peak_rss_bytes": rss - r * 2**20, "rss_start_bytes": rss * 0.8,
                   "fingerprint": {"threads": 1}, "details": {}} for r in range(n_ranks)],
        "fingerprint": {"cpu": "Test CPU", "cpu_count": 2, "framework": framework,
                        "framework_version": {"torch": "2.4", "jax": "0.5",
                                              "tensorflow": "2.16"}.get(framework, "1"),
                        "python": "3.11", "gpu": None, "device": "cpu"},
    })


def compare_group() -> list[RunRecord]:
    """What `sextant compare --frameworks torch,jax` stores, with chosen figures."""
    return [
        make_run("torch", "eager", step=0.20),
        make_run("torch", "compiled", step=0.16, first_step=20.0),
        make_run("torch", "eager", "dp", 2, step=0.12, comm=0.02, sync_step=0.12),
        make_run("jax", "compiled", step=0.08, rss=450 * 2**20, first_step=15.0),
        make_run("jax", "compiled", "dp", 2, step=0.30, comm=0.2, sync_step=0.3,
                 rss=450 * 2**20),
    ]


def calibrated_machine(directory: Path, cores: int = 2) -> Any:
    """The planner catalogue calibrated by a calibration document shaped like the one
    `sextant calibrate` writes, with chosen figures."""
    from sextant.planner.local import load_machine

    path = directory / "calibration.json"
    path.write_text(json.dumps({
        "schema": 1, "created": "2026-11-30T10:00:00+0000",
        "host": {"cores": cores, "memory_bytes": 8e9},
        "gemm": {"torch": {"flops_all_threads": 60e9 * cores, "flops_1_thread": 60e9}},
        "memory_bw_bytes_per_s": 15e9,
        "allreduce": {"alpha_s": 400e-6, "beta_s_per_byte": 1e-9},
    }))
    return load_machine(path)


def with_ranks(run: RunRecord, **fields: Any) -> RunRecord:
    """`run` with the same fields changed on every rank."""
    return run.replace(ranks=tuple(dataclasses.replace(r, **fields) for r in run.ranks))


def with_fingerprint(run: RunRecord, **values: Any) -> RunRecord:
    """`run` with some fingerprint values changed (its environment, as the store keeps it)."""
    return run.replace(fingerprint=Fingerprint.from_dict({**run.fingerprint.to_dict(),
                                                          **values}))
