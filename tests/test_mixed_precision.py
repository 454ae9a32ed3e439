"""The mixed-precision agreement rule on real runs (CPU): torch's and JAX's bf16 training
agree with torch's fp32 curve within the band torch's own bf16 run sets, and the broken twins
(JAX's loss taken on bf16 logits; torch updating bf16 master weights) fail it. The band's
factor was chosen on gpt-tiny; llama-tiny here is the check on a workload it was not chosen
on (sextant.measure.agreement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sextant.measure.agreement import MIXED_FACTOR, mixed_agreement
from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import short

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, framework: str, precision: str, fault: str | None = None) -> dict:
    workload = short("llama-tiny", 24)
    mode = "compiled" if framework == "jax" else "eager"
    return execute(workload, Strategy(framework=framework, mode=mode, precision=precision),
                   runs_dir=tmp_path / f"{framework}-{precision}-{fault}", timeout_s=300,
                   extra_env={"SEXTANT_TEST_FAULT": fault} if fault else None)


def test_bf16_agrees_within_the_band_and_the_broken_twins_do_not(tmp_path: Path) -> None:
    fp32 = _run(tmp_path, "torch", "fp32")
    torch_bf16 = _run(tmp_path, "torch", "bf16")
    assert torch_bf16.fingerprint.values["precision"]["effective"] == "bf16"
    band = (fp32.losses, torch_bf16.losses)

    jax_bf16 = _run(tmp_path, "jax", "bf16")
    good = mixed_agreement(jax_bf16.losses, *band)
    assert good.ok and good.worst_ratio < 1 / 1.5, good  # room left inside the band

    loss_in_bf16 = mixed_agreement(_run(tmp_path, "jax", "bf16", "loss-in-compute-dtype")
                                   .losses, *band)
    bf16_masters = mixed_agreement(_run(tmp_path, "torch", "bf16", "bf16-master-weights")
                                   .losses, *band)
    assert not loss_in_bf16.ok and not bf16_masters.ok, (loss_in_bf16, bf16_masters)
    # fp16 with dynamic loss scaling (torch's GradScaler) trains the same thing: inside the
    # band its own fp16 run would set is trivially true, so held to bf16's band here.
    fp16 = _run(tmp_path, "torch", "fp16")
    assert fp16.fingerprint.values["precision"]["effective"] == "fp16"
    assert mixed_agreement(fp16.losses, *band).ok
    # bf16 is really different from fp32 (a band of zero width would pass nothing).
    assert max(abs(a - b) for a, b in zip(*band)) > 1e-4
    assert MIXED_FACTOR >= 1


def test_agreement_rule_refuses_a_nan() -> None:
    fp32, mixed = [5.0, 4.0, 3.0], [5.0, 4.01, 3.02]
    assert mixed_agreement([5.0, 4.005, 3.01], fp32, mixed).ok
    assert not mixed_agreement([5.0, float("nan"), 3.0], fp32, mixed).ok
    assert not mixed_agreement([5.2, 4.0, 3.0], fp32, mixed).ok
