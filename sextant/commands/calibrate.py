"""`sextant calibrate`: measure this machine for the planner's 'cpu-local' accelerator.

Only argparse is imported at registration; calibrate runs torch in child processes only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sextant.defaults import MEASUREMENT_TIMEOUT_S
from sextant.display import console
from sextant.errors import UserError
from sextant.paths import DEFAULT_CALIBRATION


def register(subparsers: Any) -> None:
    c = subparsers.add_parser(
        "calibrate",
        help="measure this machine (GEMM FLOP/s, memory bandwidth, all-reduce alpha/beta)",
        description="Measure this machine for the planner's 'cpu-local' accelerator and "
        "'loopback' link: GEMM FLOP/s with numpy and torch (1 thread and all threads), memory "
        "copy bandwidth, and all-reduce time between 2 gloo processes on 127.0.0.1 from 1 KB "
        "to 64 MB, fitted by least squares to t = alpha + beta * bytes.",
    )
    c.add_argument("--out", metavar="PATH", help=f"default ./{DEFAULT_CALIBRATION.as_posix()}")
    c.add_argument(
        "--max-bytes",
        type=int,
        default=64 * 2**20,
        help="largest all-reduce message (default 64 MiB)",
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=MEASUREMENT_TIMEOUT_S,
        help=f"seconds allowed for the worker processes (default {MEASUREMENT_TIMEOUT_S:g})",
    )
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")
    dev = c.add_argument_group(
        "device (--device gpu): the kernel efficiency over a workload's GEMM shapes and the "
        "all-reduce bus bandwidth between this host's GPUs, for 'sextant plan'")
    dev.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                     help="cpu (default: the host only) or gpu (also its GPUs)")
    dev.add_argument("--model", help="planner preset whose GEMMs to time (see 'sextant plan "
                     "list')")
    dev.add_argument("--workload", metavar="FILE", help="a workload TOML instead of --model")
    dev.add_argument("--accelerator", help="catalogue key of the GPU (default: from its name)")
    dev.add_argument("--mbs", type=int, default=1, help="micro-batch in sequences (default 1)")
    dev.add_argument("--tp", type=int, default=1, help="tensor-parallel split (default 1)")
    dev.add_argument("--device-max-bytes", type=int, default=1 << 30,
                     help="largest GPU all-reduce message (default 1 GiB)")
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
