"""Keras 3 (framework keras): the strategy field, the refusals, and `model.fit` training the
canonical model to torch eager's losses and gradient norms on each Keras backend.

Kept small: each Keras run costs an import of Keras and its backend (~7-15 s on 2 busy
cores) plus a compile, so the training tests run 3 steps and share one torch reference.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sextant.backends.base import require
from sextant.core.errors import UserError
from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import PARITY_RTOL, needs_torch, same_training, short

needs_keras = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                 reason="keras not installed")
STEPS = 3

# fp32, Keras (jax, torch, tensorflow) vs PyTorch eager, gpt-tiny, 10 steps, with sextant's
# AdamW subclass (torch's eps placement): <= 4.1e-7 relative on the loss and <= 4.6e-7 on the
# gradient norm (docs/keras.md). So the shared fp32 tolerance (1e-5) holds. Keras' stock
# AdamW puts eps before the bias correction: gpt-tiny's loss moves by 4.3e-6 in 10 steps, its
# gradient norm by 1.3e-4; digits-mlp's by 1.8e-5 and 3.4e-4 (caught, test below).


def keras(backend: str = "jax", **fields: Any) -> Strategy:
    return Strategy(framework="keras", keras_backend=backend, **fields)


# --- the strategy field and the refusals (no framework imported) ---------------------------


def test_keras_backend_field_and_label() -> None:
    assert keras(mode="compiled").label == "keras-jax compiled"
    assert keras("torch", mode="eager").label == "keras-torch eager"
    assert keras(mode="compiled", parallel="dp", devices_per_worker=2).label == \
        "keras-jax compiled dp 1x2"
    with pytest.raises(UserError, match="unknown keras backend 'mlx'; allowed: jax, torch"):
        keras("mlx")
    with pytest.raises(UserError, match="--keras-backend is for framework 'keras'"):
        Strategy(framework="torch", keras_backend="torch")


@needs_keras
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_dp_is_refused_off_jax_in_one_line(backend: str) -> None:
    with pytest.raises(UserError) as info:
        require(keras(backend, mode="compiled", parallel="dp", workers=2))
    message = str(info.value)
    assert "\n" not in message and "use --keras-backend jax" in message
    assert f"keras-{backend} does not support parallel 'dp'" in message


@needs_keras
def test_unsupported_levers_are_refused() -> None:
    for fields, expected in (({"precision": "bf16"}, "does not support precision 'bf16'"),
                             ({"grad_accum": 2}, "does not support gradient accumulation"),
                             ({"parallel": "fsdp", "workers": 2}, "LayoutMap")):
        with pytest.raises(UserError, match=expected):
            require(keras(mode="compiled", **fields))


def test_run_flag_reaches_the_strategy() -> None:
    from sextant.cli import build_parser
    from sextant.commands.run import strategy_from_args

    args = build_parser().parse_args(["run", "--framework", "keras", "--keras-backend",
                                      "tensorflow"])
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras not installed")
    strategy = strategy_from_args(args)
    assert strategy.keras_backend == "tensorflow" and strategy.mode == "compiled"


# --- training: parity with torch eager ------------------------------------------------------


@pytest.fixture(scope="module")
def workload() -> Any:
    return short("gpt-tiny", STEPS, nosync_steps=0, log_every=STEPS)


@pytest.fixture(scope="module")
def reference(workload: Any, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return execute(workload, Strategy(framework="torch"),
                   runs_dir=tmp_path_factory.mktemp("torch"))


@needs_keras
@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize(("backend", "mode"), [("jax", "compiled"), ("torch", "eager"),
                                               ("tensorflow", "compiled")])
def test_fit_matches_torch_eager(backend: str, mode: str, workload: Any, reference: dict,
                                 tmp_path: Path) -> None:
    record = execute(workload, keras(backend, mode=mode), runs_dir=tmp_path)
    assert record.status == "ok" and len(record.losses) == STEPS
    same_training(record, reference)
    assert record.fingerprint.values["keras_backend"] == backend


@needs_keras
@needs_torch
@pytest.mark.slow
def test_mlp_matches_and_the_tolerance_sees_keras_stock_adamw(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """digits-mlp, 10 steps (b2 = 0.999, where Keras' eps placement weighs 32x at step 1):
    sextant's AdamW subclass stays within the fp32 tolerance of torch (measured 1.3e-6 on
    the loss, 4.9e-6 on the gradient norm); Keras' own AdamW update leaves it (1.8e-5 and
    3.4e-4), so the parity tests are not loose enough to hide it."""
    w = short("digits-mlp", 10, nosync_steps=0, log_every=10)
    reference = execute(w, Strategy(framework="torch"), runs_dir=tmp_path)
    same_training(execute(w, keras(mode="compiled"), runs_dir=tmp_path), reference)
    monkeypatch.setenv("SEXTANT_TEST_FAULT", "keras-stock-adamw")
    stock = execute(w, keras(mode="compiled"), runs_dir=tmp_path)
    assert stock.ranks[0].details["optimizer"].startswith("keras.optimizers.AdamW (stock")
    for key in ("losses", "grad_norms"):
        deviation = np.array(getattr(stock, key)) / np.array(getattr(reference, key)) - 1
        assert np.max(np.abs(deviation)) > PARITY_RTOL["fp32"], key


@needs_keras
@pytest.mark.slow
def test_kill_and_resume_is_bit_identical(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    """Checkpoints written from inside fit (rank 0, after JAX's state sync), a kill, and a
    resume: the resumed steps' losses equal the uninterrupted run's exactly."""
    w = short("digits-mlp", 4, nosync_steps=0, log_every=1)
    full = execute(w, keras(mode="compiled"), runs_dir=tmp_path)
    checkpointed = keras(mode="compiled", checkpoint_every=2, checkpoint_dir=str(tmp_path / "c"))
    monkeypatch.setenv("SEXTANT_TEST_FAULT", "kill-rank-0-at-3")
    with pytest.raises(Exception, match="SIGKILL"):
        execute(w, checkpointed, runs_dir=tmp_path)
    monkeypatch.delenv("SEXTANT_TEST_FAULT")
    resumed = execute(w, Strategy(**{**checkpointed.to_dict(), "resume": True}),
                      runs_dir=tmp_path)
    assert resumed.metrics.resumed_from_step == 2
    assert resumed.losses == full.losses[2:]
