"""The DeepSpeed backend: ZeRO-1/2/3 over 2 ranks train exactly what torch DDP trains (fp32),
DeepSpeed's own gradient accumulation changes nothing, bf16 stays close, kill-and-resume
through engine checkpoints is bit-identical, the generated config prints, and the
combinations it does not run are refused in one line.

The training runs share one 8-step workload (no exposed-communication pairs), so the
uninterrupted zero2 run is also the kill-and-resume reference. Each run pays DeepSpeed's
import and engine start-up (~10-20 s on 2 cores); no op is built (the inference-only
shm_comm op is skipped; conftest's TORCH_EXTENSIONS_DIR would share any build per session).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sextant.backends import require
from sextant.core.errors import UserError
from sextant.strategy import Strategy
from tests.helpers import kill_then_resume, loss_deviation, run_cli, same_training, short

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_deepspeed = pytest.mark.skipif(not (HAS_DEEPSPEED and HAS_TORCH),
                                     reason="deepspeed (pip install 'sextant[deepspeed]') or "
                                            "torch not installed")
STEPS = 8


def ds(parallel: str = "zero2", **kw: Any) -> Strategy:
    return Strategy(framework="deepspeed", parallel=parallel,
                    workers=1 if parallel == "single" else 2, **kw)


@pytest.fixture(scope="module")
def workload() -> Any:
    return short("gpt-tiny", STEPS, nosync_steps=0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, workload: Any) -> Any:
    """label -> record, each run once per module."""
    from sextant.runner import execute

    base = tmp_path_factory.mktemp("deepspeed-runs")
    done: dict[str, dict] = {}

    def get(label: str, strategy: Strategy) -> dict:
        if label not in done:
            done[label] = execute(workload, strategy, runs_dir=base)
        return done[label]

    return get


# --- no training --------------------------------------------------------------------------


@needs_deepspeed
def test_print_config_shows_the_generated_config() -> None:
    out = run_cli("run", "--framework", "deepspeed", "--parallel", "zero3", "--workers", "2",
                  "--grad-accum", "2", "--precision", "bf16", "--print-config", timeout=120)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert config["zero_optimization"]["stage"] == 3
    assert config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 16 and config["train_micro_batch_size_per_gpu"] == 4
    assert config["bf16"] == {"enabled": True} and config["gradient_clipping"] == 0.0


@needs_deepspeed
def test_refusals_are_one_line() -> None:
    out = run_cli("run", "--framework", "deepspeed", "--parallel", "fsdp", timeout=120)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "--parallel zero3" in line and "supported: single, dp" in line
    for fields, needle in (({"precision": "bf16", "parallel": "dp"}, "zero1, zero2 or zero3"),
                           ({"mode": "compiled"}, "supported: eager"),
                           ({"compress": "bf16", "parallel": "dp"}, "supported: none"),
                           ({"parallel": "pp", "pp": 2}, "PipelineModule")):
        workers = {"workers": 2} if fields.get("parallel") not in (None, "single") else {}
        with pytest.raises(UserError) as info:
            require(Strategy(framework="deepspeed", **workers, **fields))
        assert "\n" not in str(info.value) and needle in str(info.value), fields


def test_op_cache_is_beside_the_runs_unless_set(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if not HAS_TORCH:
        pytest.skip("torch not installed")
    from sextant.backends.deepspeed_backend.train import extensions_dir

    ctx: Any = SimpleNamespace(run_dir=tmp_path / "runs" / "one-run")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert extensions_dir(ctx) == (tmp_path / "runs" / ".deepspeed-ops",
                                   "beside the run directories")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert extensions_dir(ctx) == (tmp_path / "mine", "TORCH_EXTENSIONS_DIR")


# --- training -------------------------------------------------------------------------------


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("parallel", ["zero1", "zero2", "zero3"])
def test_zero_stages_match_torch_dp(runs: Any, parallel: str) -> None:
    reference = runs("torch dp", Strategy(framework="torch", parallel="dp", workers=2))
    record = runs(parallel, ds(parallel))
    same_training(record, reference)  # fp32, the levers' tolerance (rtol 1e-5)
    details = record.ranks[0].details
    assert details["deepspeed_config"]["zero_optimization"]["stage"] == int(parallel[-1])
    assert "client optimizer" in details["optimizer"]
    # The inference-only op DeepSpeed would build at start-up is skipped, and nothing else
    # is built during training (any op would be listed with its time, apart from the steps).
    assert details["jit_ops"] == {"deepspeed_shm_comm": {
        "built": False, "seconds": 0.0, "skipped": "serves inference_all_reduce only"}}


@pytest.mark.slow
@needs_deepspeed
def test_deepspeed_gradient_accumulation_is_the_same_training(runs: Any) -> None:
    reference = runs("torch dp", Strategy(framework="torch", parallel="dp", workers=2))
    same_training(runs("zero2 accum2", ds(grad_accum=2)), reference)


@pytest.mark.slow
@needs_deepspeed
def test_bf16_stays_close_to_fp32(runs: Any) -> None:
    fp32, bf16 = runs("zero2", ds()), runs("zero2 bf16", ds(precision="bf16"))
    # DeepSpeed's bf16 keeps bf16 weights and computes the loss in bf16 (spacing 2^-5 near
    # 5.5), unlike torch's autocast: the same bound as torch's bf16 lever still holds.
    assert 0 < loss_deviation(bf16, fp32) < 2e-2
    assert bf16.losses[-1] < bf16.losses[0]


@pytest.mark.slow
@needs_deepspeed
def test_kill_and_resume_is_bit_identical(runs: Any, workload: Any, tmp_path: Path) -> None:
    uninterrupted = runs("zero2", ds())
    resumed = kill_then_resume(workload, lambda **kw: ds(**kw), tmp_path)
    np.testing.assert_array_equal(resumed.losses, uninterrupted.losses[3:])
    np.testing.assert_array_equal(resumed.grad_norms, uninterrupted.grad_norms[3:])
    digest = resumed.ranks[0].final_params_sha256
    assert digest is not None and digest == uninterrupted.ranks[0].final_params_sha256
