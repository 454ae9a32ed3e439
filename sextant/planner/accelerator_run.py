"""The planner beside a measured accelerator run: which catalogue entry the device is, the
MFU the run reached against that entry's dense peak, and the step time the planner predicts
for the same workload on one such device.

MFU here is the run's model FLOPs per second (sextant.workloads.init.flops_per_step, the PaLM formula
the planner also counts) over the catalogue's dense peak at the run's effective precision.
A device the catalogue does not hold is named, and its MFU left blank: never a peak guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sextant.core.errors import UserError

DRIVER_NAMES: tuple[tuple[str, str], ...] = (
    # (pattern of the name the driver reports, catalogue key); first match wins.
    (r"\bH200\b", "h200"),
    (r"\bH100\b.*\bPCIe\b", "h100-pcie"),
    (r"\bH100\b", "h100-sxm"),
    (r"\bA100\b.*80\s*GB", "a100-80gb"),
    (r"\bA100\b", "a100-40gb"),
    (r"\bB200\b", "b200"),
    (r"\bMI300X\b", "mi300x"),
)
"""torch.cuda.get_device_name / NVML / jax device_kind names, e.g. 'NVIDIA H200',
'NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB'."""


def catalogue_key(device_name: str | None) -> str | None:
    """The catalogue entry of a device the driver names, or None when there is none."""
    if not device_name:
        return None
    for pattern, key in DRIVER_NAMES:
        if re.search(pattern, device_name, re.IGNORECASE):
            return key
    return None


def mfu(flops_per_step: float, step_s: float | None, device_name: str | None,
        precision: str) -> dict[str, Any]:
    """{'mfu', 'peak_flops', 'catalogue', 'note'} of a single-device step on `device_name`;
    mfu None (with the note saying why) when the device or its peak is not catalogued."""
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.options import planner_precision

    key = catalogue_key(device_name)
    if key is None:
        return {"mfu": None, "peak_flops": None, "catalogue": None,
                "note": f"{device_name or 'this device'} is not in the planner's catalogue: "
                        "no MFU"}
    acc = load_catalogue().accelerator(key)
    prec = planner_precision(precision)
    peak = acc.peak_flops.get(prec)
    if peak is None or not step_s:
        return {"mfu": None, "peak_flops": peak, "catalogue": key,
                "note": f"{acc.name} has no published {prec} peak" if peak is None else ""}
    return {"mfu": flops_per_step / step_s / peak, "peak_flops": peak, "catalogue": key,
            "note": ""}


def _finetune(workload: Mapping[str, Any]) -> Any:
    """The run's [finetune] table as the planner's FineTune (LoRA trains its adapters beside a
    frozen base in fp32, the only base `run` builds); None: every parameter trains."""
    from sextant.planner.finetune import FineTune

    table = workload.get("finetune") or {}
    if table.get("method") != "lora":
        return None
    return FineTune(method="lora", rank=int(table.get("rank", 8)),
                    targets=tuple(table.get("targets", ("q", "v"))),
                    base_dtype=str(table.get("base_dtype", "fp32")))


def predicted_step_s(workload: Mapping[str, Any], device_name: str | None, precision: str,
                     *, compiled: bool = True) -> float | None:
    """The planner's step time for `workload` on one such device (no calibration: the
    catalogue's peaks and the planner's default efficiency), its elementwise operators fused
    when the run was `compiled` (torch.compile, jax.jit) and one kernel each when eager; None
    where it cannot say."""
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
    from sextant.planner.options import planner_precision
    from sextant.planner.workload_shapes import shape_from_workload
    from sextant.planner.profiles import DEFAULT_STACK, profile

    key = catalogue_key(device_name)
    if key is None:
        return None
    try:
        shape = shape_from_workload(dict(workload), where="the run's workload")
        cat = load_catalogue()
        opts = PlanOptions(precision=planner_precision(precision),
                           global_batch=shape.global_batch, finetune=_finetune(workload),
                           compute_efficiency=cat.accelerator(key).kernel_efficiency,
                           stack=profile(DEFAULT_STACK).with_overrides(
                               fused_elementwise=compiled))
        hw = resolve_hardware(cat, key, options=opts)
        step = evaluate_one(shape.cost(flash_attention=True), hw, opts,
                            Layout(dp=1, mbs=shape.global_batch)).step
    except (UserError, ValueError, KeyError):
        return None
    return float(step) if step else None
