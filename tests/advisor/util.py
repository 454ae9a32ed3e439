"""Shared builders for the advisor tests: plain data, no frameworks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sextant.advisor.profile import TeamProfile, parse_profile
from sextant.results.record import RunRecord

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "profiles"


def raw_profile(**over: Any) -> dict[str, Any]:
    """A valid profile table (a PyTorch team on NVIDIA, 7B), with overrides."""
    raw: dict[str, Any] = {
        "name": "test",
        "hardware": "nvidia",
        "model_params": 7e9,
        "deployment": "server",
        "purpose": "production",
        "gpu_price_per_hour": 2.0,
        "devices": 8,
        "training_hours": 100.0,
        "engineer_cost_per_day": 500.0,
        "team_size": 2,
        "deadline_weeks": 12,
        "existing_code": "pytorch",
        "functional_programming": "some",
        "experience": {"pytorch": "expert", "jax": "some"},
    }
    raw.update(over)
    return {k: v for k, v in raw.items() if v is not None}


def profile(**over: Any) -> TeamProfile:
    return parse_profile(raw_profile(**over), source="test")


def run(run_id: int, framework: str, tokens_per_s: float | None, *, mode: str = "eager",
        parallel: str = "single", workers: int = 1, workload_hash: str = "w1",
        peak_rss_bytes: float | None = 2**30, compile_time_s: float | None = 0.0,
        exposed_comm_share: float | None = None, status: str = "ok",
        **figures: Any) -> RunRecord:
    """One results-store run record, through the record's own constructor; `figures` sets
    any other metric."""
    return RunRecord.from_dict({
        "id": run_id,
        "status": status,
        "workload": {"name": "gpt-tiny"},
        "workload_hash": workload_hash,
        "strategy": {"framework": framework, "mode": mode, "parallel": parallel,
                     "workers": workers},
        "metrics": {
            "step_time_median_s": 0.1,
            "step_time_p10_s": 0.09,
            "step_time_p90_s": 0.12,
            "tokens_per_s": tokens_per_s,
            "peak_rss_bytes": peak_rss_bytes,
            "compile_s": compile_time_s,
            "exposed_comm_share": exposed_comm_share,
            **figures,
        },
    })
