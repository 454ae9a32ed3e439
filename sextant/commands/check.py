"""`sextant check`: pre-flight checks, each measured for real, before a long training job.

Exit code: 0 when no check failed (passes, warnings and checks not run), 3 when at least one
failed (with --strict, a warning counts as a failure), 2 for bad input, 1 when sextant itself
could not run (as every command).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from sextant.commands.common import add_framework_args, add_run_args, db_path
from sextant.core.display import console
from sextant.core.errors import UserError
from sextant.core.paths import runs_beside
from sextant.strategy import MAX_THREADS

EXIT_FAILED = 3
_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
_WORD = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "not run"}


def register(sub: Any) -> None:
    from sextant.checks.result import CHECKS

    p = sub.add_parser(
        "check", help="pre-flight checks: trains, same versions, loader, skew, stragglers, "
                      "scaling, interconnect, checkpoint/resume",
        description="Run each pre-flight check for real (short runs of the workload, "
                    "collectives between real processes; with --cluster, across the hosts of "
                    "an emulated cluster and its links) and print pass / warn / fail with "
                    "the measured figure, the threshold and a fix. Exit code: 0 no failure, "
                    "3 a check failed (--strict: or warned), 2 bad input.")
    add_run_args(p, steps_help="steps of each check run (default: a tenth of the workload's, "
                               "at least warmup + 3)")
    add_framework_args(p, defaults={"parallel": "dp", "workers": 2},
                       helps={"workers": "workers of the multi-worker checks; scaling sweeps "
                                         "1..N (default: 2)"})
    p.add_argument("--only", default=None,
                   help=f"comma-separated subset of: {', '.join(CHECKS)} (default: all)")
    p.add_argument("--json", action="store_true", help="print the results as a JSON list")
    p.add_argument("--strict", action="store_true", help="exit 3 on warnings too")
    p.add_argument("--threshold-gbps", type=float, default=10.0,
                   help="interconnect: warn below this bus bandwidth, Gb/s (default: 10)")
    p.add_argument("--max-bytes", type=_size, default=64 * 2**20,
                   help="interconnect: largest message, e.g. 256M (default: 64M; from 1K)")
    p.add_argument("--loader-threshold", type=float, default=0.10,
                   help="loader: warn above this share of the step spent waiting for data "
                        "(default: 0.10)")
    p.add_argument("--balance-threshold", type=float, default=0.10,
                   help="balance: flag a rank exceeding the others' median rows or time by "
                        "this share (default: 0.10)")
    p.add_argument("--scaling-tolerance", type=float, default=0.10,
                   help="scaling: throughput drop treated as noise (default: 0.10)")
    p.set_defaults(func=cmd_check)


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 64M, 1G)")
    n = int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]
    if n < 1024:
        raise argparse.ArgumentTypeError(f"--max-bytes must be at least 1K. Received: {text}")
    return n


def _fraction(name: str, value: float) -> float:
    if not 0 <= value:
        raise UserError(f"{name} must be >= 0. Received: {value}")
    return value


def exit_code(results: list[Any], strict: bool = False) -> int:
    statuses = {r.status for r in results}
    if "fail" in statuses or (strict and "warn" in statuses):
        return EXIT_FAILED
    return 0


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if "share" in unit or "excess" in unit or "efficiency" in unit or "decrease" in unit:
        return f"{value * 100:.0f}%"
    if "relative" in unit:
        return f"{value:.1e}"
    if unit == "cores":
        return f"{value:.2f} cores"
    if "Gb/s" in unit:
        return f"{value:.2f} Gb/s"
    return f"{value:g}"


def render(results: list[Any], out: Console) -> None:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("check", "left"), ("result", "left"), ("measured", "right"), ("threshold", "right"),
        ("", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for r in results:
        style = _STYLE[r.status]
        text = escape(r.summary)
        if r.hint and r.status in ("warn", "fail"):
            text += f"\n[{style}]fix:[/{style}] {escape(r.hint)}"
        threshold = r.threshold
        if r.check == "interconnect" and threshold is not None:
            shown_threshold = f">= {threshold:g} Gb/s"
        elif r.check == "mvp":
            shown_threshold = "> 0%"
        elif threshold is None:
            shown_threshold = "-"
        elif r.check == "scaling":
            shown_threshold = f"drop <= {threshold * 100:.0f}%"
        elif r.check in ("loader", "balance"):
            shown_threshold = f"<= {threshold * 100:.0f}%"
        else:
            shown_threshold = _figure(threshold, r.unit)
        table.add_row(r.check, f"[{style}]{_WORD[r.status]}[/{style}]",
                      _figure(r.measured, r.unit), shown_threshold, text)
    out.print(table)
    inter = next((r for r in results if r.check == "interconnect" and r.details.get("sizes")), None)
    if inter is not None:
        t = Table(title=f"collectives, {inter.details['world']} {inter.details['backend']} "
                        "processes (bus bandwidth, nccl-tests definition)",
                  title_justify="left", header_style="bold")
        sizes = inter.details["sizes"]
        t.add_column("bytes", justify="right")
        for name in sizes:
            for col in ("time", "algbw", "busbw"):
                t.add_column(f"{name} {col}", justify="right")
        for i, row in enumerate(next(iter(sizes.values()))):
            cells = [f"{row['bytes']:,}"]
            for rows in sizes.values():
                p = rows[i]
                cells += [f"{p['time_s'] * 1e3:.3f} ms",
                          f"{p['algbw_bytes_per_s'] * 8 / 1e9:.2f} Gb/s",
                          f"{p['busbw_bytes_per_s'] * 8 / 1e9:.2f} Gb/s"]
            t.add_row(*cells)
        out.print(t)
    counts = {s: sum(r.status == s for r in results) for s in _WORD}
    out.print(f"{counts['pass']} passed, {counts['warn']} warned, {counts['fail']} failed, "
              f"{counts['skip']} not run")


def cmd_check(args: argparse.Namespace) -> int:
    from sextant.checks.suite import CheckOptions, parse_only, run_checks
    from sextant.sources import resolve_workload

    only = parse_only(args.only)
    for name in ("loader_threshold", "balance_threshold", "scaling_tolerance", "threshold_gbps"):
        _fraction("--" + name.replace("_", "-"), getattr(args, name))
    if args.workers < 1:
        raise UserError(f"--workers must be >= 1. Received: {args.workers}")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise UserError(f"--threads must be an integer from 1 to {MAX_THREADS}. Received: "
                        f"{args.threads}")
    workload = resolve_workload(args.workload)
    db = db_path(args)
    opts = CheckOptions(
        workload=workload, framework=args.framework, mode=args.mode, parallel=args.parallel,
        workers=args.workers, threads=args.threads, steps=args.steps, only=only,
        threshold_gbps=args.threshold_gbps, max_bytes=args.max_bytes,
        loader_threshold=args.loader_threshold, balance_threshold=args.balance_threshold,
        scaling_tolerance=args.scaling_tolerance, timeout_s=args.timeout,
        collective_timeout_s=args.collective_timeout, cluster=args.cluster,
        runs_dir=runs_beside(db),
    )
    err = console(None, stderr=True)

    def say(msg: str) -> None:
        err.print(f"[dim]check:[/dim] {escape(msg)}")

    results = run_checks(opts, say=say)
    if args.json:
        sys.stdout.write(json.dumps([r.to_dict() for r in results], indent=1, default=str) + "\n")
    else:
        render(results, console())
    return exit_code(results, args.strict)
