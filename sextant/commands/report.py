"""`sextant report`: write the report of the latest (or a chosen) compare.

    sextant report [--format html|md|json] [--out FILE|-] [--profile FILE [--plan FILE]]
                   [--group ID] [--db PATH] [--calibration FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sextant.commands.common import add_store_args, open_store
from sextant.core.display import console
from sextant.core.errors import UserError
from sextant.core.paths import DEFAULT_CALIBRATION

FORMATS = ("html", "md", "json")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report", help="write the report (self-contained HTML, Markdown or JSON)",
        description="Write the report of a compare's runs: recommendation (with --profile), "
                    "claims check, throughput, scaling, communication, memory, loss parity, "
                    "compile times and environment. The HTML page is one self-contained file.")
    p.add_argument("--format", default="html", metavar="FORMAT",
                   help=f"{' | '.join(FORMATS)} (default: html)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="output file, or - for stdout (default: report.html, report.md or "
                        "report.json next to the results database)")
    p.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="team profile TOML: put the advisor's recommendation, with the measured "
                        "runs as evidence, at the top (e.g. "
                        "examples/profiles/startup-nvidia-pytorch.toml)")
    p.add_argument("--plan", type=Path, default=None, metavar="FILE",
                   help="with --profile: a planner result ('sextant plan ... --tokens T --json "
                        "> plan.json') for the recommendation's training hours")
    p.add_argument("--group", default=None, help="compare group id (default: the latest)")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="this machine's calibration (sextant calibrate), for the planner's "
                        "prediction on the scaling chart (default: calibration.json next to "
                        f"the results database, then ./{DEFAULT_CALIBRATION.as_posix()})")
    add_store_args(p)
    p.set_defaults(func=cmd_report)


def require_text_file(path: Path, flag: str) -> None:
    """A one-line error, not a traceback, for a path that is not a readable UTF-8 file."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise UserError(f"{flag} {path}: {what}")
    try:
        path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{flag} {path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise UserError(f"{flag} {path}: {exc.strerror}") from None


def cmd_report(args: argparse.Namespace) -> int:
    from sextant.report.html import report_text, write_report

    fmt = str(args.format).lower()
    if fmt == "markdown":
        fmt = "md"
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {args.format!r}; allowed: {', '.join(FORMATS)}")
    if args.profile is not None and not args.profile.is_file():
        raise UserError(f"--profile {args.profile}: no such file; write one with "
                        "'sextant advise init' or use examples/profiles/*.toml")
    if args.plan is not None and args.profile is None:
        raise UserError("--plan gives the advisor's training hours: it needs --profile FILE")
    if args.calibration is not None:
        require_text_file(args.calibration, "--calibration")
    options = {"group_id": args.group, "fmt": fmt, "profile": args.profile,
               "calibration": args.calibration, "plan": args.plan}
    with open_store(args, create=False) as store:
        if args.out == "-":
            sys.stdout.write(report_text(store, **options))
            return 0
        out = Path(args.out) if args.out else store.path.parent / f"report.{fmt}"
        path = write_report(store, out, **options)
    console().print(f"report: {path.resolve()}", markup=False)
    return 0
