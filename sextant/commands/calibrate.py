"""`sextant calibrate`: measure this machine for the planner's 'cpu-local' accelerator.

Only argparse is imported at registration; calibrate runs torch in child processes only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sextant.commands.plan_flags import CALIBRATE_GROUPS, CalibrateFlags
from sextant.core.display import console
from sextant.core.errors import UserError
from sextant.core.fields import add_flags


def register(subparsers: Any) -> None:
    c = subparsers.add_parser(
        "calibrate",
        help="measure this machine (GEMM FLOP/s, memory bandwidth, all-reduce alpha/beta)",
        description="Measure this machine for the planner's 'cpu-local' accelerator and "
        "'loopback' link: GEMM FLOP/s with numpy and torch (1 thread and all threads), memory "
        "copy bandwidth, and all-reduce time between 2 gloo processes on 127.0.0.1 from 1 KB "
        "to 64 MB, fitted by least squares to t = alpha + beta * bytes.",
    )
    for key, title in CALIBRATE_GROUPS:
        add_flags(c.add_argument_group(title) if title else c, CalibrateFlags, (key,))
    c.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from sextant.planner.calibrate import calibrate, default_out, render_calibration

    if args.max_bytes < 1024:
        raise UserError(f"--max-bytes must be >= 1024. Received: {args.max_bytes}")
    if args.timeout <= 0:
        raise UserError(f"--timeout must be > 0. Received: {args.timeout}")
    out = args.out or default_out()
    progress = None if args.json else sys.stderr
    doc = calibrate(
        out=out,
        max_bytes=args.max_bytes,
        timeout=args.timeout,
        progress=progress,
        device=_device_section(args, progress) if args.device == "gpu" else None,
    )
    if args.json:
        print(json.dumps({**doc.to_dict(), "path": doc.path}, indent=2))
    else:
        render_calibration(doc, console(None, highlight=True), out)
    return 0


def _device_section(args: argparse.Namespace, progress: Any) -> Any:
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.device_calibration import calibrate_device
    from sextant.planner import load_workload_shape, preset

    if bool(args.model) == bool(args.workload):
        raise UserError("--device gpu times a workload's GEMMs: give exactly one of --model "
                        "PRESET or --workload FILE")
    for flag, value in (("--mbs", args.mbs), ("--tp", args.tp)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1. Received: {value}")
    shape = preset(args.model) if args.model else load_workload_shape(args.workload)
    cost = shape.cost()
    acc = load_catalogue(calibration=None).accelerator(args.accelerator) \
        if args.accelerator else None

    def say(msg: str) -> None:
        if progress is not None:
            progress.write(f"calibrate: {msg}\n")
            progress.flush()

    return calibrate_device(cost=cost, tokens=args.mbs * cost.tokens_per_sample, tp=args.tp,
                            device="gpu", accelerator=acc, max_bytes=args.device_max_bytes,
                            timeout=args.timeout, say=say)
