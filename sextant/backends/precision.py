"""Precision as one controlled variable: each framework's switches set from the strategy's
`precision`, and the precision the framework then actually uses, read back from it.

    fp32   true fp32 matmuls: torch allow_tf32=False and float32 matmul precision 'highest';
           JAX jax_default_matmul_precision='highest' (XLA's GPU default is TF32);
           TensorFlow enable_tensor_float_32_execution(False) (its GPU default is TF32)
    tf32   the opposite switches; effective only where the device has TF32 units (NVIDIA
           compute capability 8.0 and later), so on a CPU the effective precision is fp32
    bf16,  mixed precision over fp32 master weights (the backends' compute dtype); the
    fp16   fp32 work left outside it runs as in fp32

Every run records a Precision (requested, effective, switches): what was asked, what the
framework reports it did, and the settings read back. The backend returns it in its
Description; nothing else carries it. Runs whose effective precision
differs are never ranked against each other (sextant.report, sextant.claims).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sextant.strategy import MIXED_PRECISIONS

TF32_MIN_CAPABILITY = (8, 0)
"""NVIDIA Ampere and later have TF32 tensor cores."""


HALF_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""The 16-bit dtypes sextant's names stand for, as every framework spells them (torch,
jax.numpy, tensorflow and mlx.core all name them so): a mixed-precision run's compute dtype,
and a compressed gradient's wire dtype."""


def half_dtype(module: Any, name: str, default: Any = None) -> Any:
    """`module`'s dtype for 'bf16' or 'fp16' (torch.bfloat16, jnp.float16, ...); `default`
    for any other name ('fp32', 'none', ...)."""
    return getattr(module, HALF_DTYPES[name]) if name in HALF_DTYPES else default


def effective(requested: str, tf32_allowed: bool, tf32_hardware: bool) -> str:
    """The precision a run's matmuls actually ran in."""
    if requested in MIXED_PRECISIONS:
        return requested
    return "tf32" if tf32_allowed and tf32_hardware else "fp32"


@dataclass(frozen=True)
class Precision:
    """The precision of one rank's run: asked for, used, and the framework's switches as
    read back from it."""

    requested: str
    effective: str
    switches: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "effective": self.effective,
                "switches": dict(self.switches)}


def _record(requested: str, tf32_allowed: bool, tf32_hardware: bool,
            switches: dict[str, Any]) -> Precision:
    return Precision(requested, effective(requested, tf32_allowed, tf32_hardware), switches)


def apply_torch(precision: str, device: Any) -> Precision:
    """Set torch's TF32 switches for `precision` on `device` (a torch.device); the record."""
    import torch

    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")
    hardware = (device.type == "cuda"
                and torch.cuda.get_device_capability(device) >= TF32_MIN_CAPABILITY)
    read_back = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                 "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
                 "float32_matmul_precision": torch.get_float32_matmul_precision()}
    allowed = (read_back["cuda.matmul.allow_tf32"]
               or read_back["float32_matmul_precision"] != "highest")
    return _record(precision, bool(allowed), hardware, read_back)


def apply_jax(precision: str) -> Precision:
    """Set JAX's default matmul precision for `precision` (before anything is traced)."""
    import jax

    jax.config.update("jax_default_matmul_precision",
                      "tensorfloat32" if precision == "tf32" else "highest")
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)  # '9.0' on NVIDIA GPUs
    hardware = (device.platform == "gpu" and capability is not None
                and tuple(int(c) for c in str(capability).split(".")[:2])
                >= TF32_MIN_CAPABILITY)
    setting = jax.config.jax_default_matmul_precision
    return _record(precision, setting not in ("highest", "float32"), hardware,
                   {"jax_default_matmul_precision": setting, "platform": device.platform})


def apply_tensorflow(precision: str) -> Precision:
    """Set TensorFlow's TF32 execution for `precision`."""
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")
    enabled = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    gpus = tf.config.list_physical_devices("GPU")
    hardware = False
    if gpus:
        capability = tf.config.experimental.get_device_details(gpus[0]).get(
            "compute_capability")
        hardware = bool(capability) and tuple(capability) >= TF32_MIN_CAPABILITY
    return _record(precision, enabled, hardware,
                   {"tensor_float_32_execution": enabled, "gpus": len(gpus)})


def cpu_only(precision: str) -> Precision:
    """The record of a framework sextant runs on CPU cores only (no TF32 there)."""
    return _record(precision, False, False, {})
