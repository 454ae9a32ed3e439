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
    c.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from sextant.planner.calibrate import calibrate, default_out, render_calibration

    if args.max_bytes < 1024:
        raise UserError(f"--max-bytes must be >= 1024. Received: {args.max_bytes}")
    if args.timeout <= 0:
        raise UserError(f"--timeout must be > 0. Received: {args.timeout}")
    out = args.out or default_out()
    doc = calibrate(
        out=out,
        max_bytes=args.max_bytes,
        timeout=args.timeout,
        progress=None if args.json else sys.stderr,
    )
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        render_calibration(doc, console(None, highlight=True), out)
    return 0
