"""`sextant report`: write the HTML report of the latest (or a chosen) compare."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sextant.commands.common import add_store_args, console, open_store


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="write the self-contained HTML report",
                       description="Write one self-contained HTML page of a compare's runs.")
    p.add_argument("--out", type=Path, default=None,
                   help="output file (default: report.html next to the results database)")
    p.add_argument("--group", default=None, help="compare group id (default: the latest)")
    add_store_args(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from sextant.report import write_report

    with open_store(args, create=False) as store:
        path = write_report(store, args.out or store.path.parent / "report.html",
                            group_id=args.group)
    console().print(f"report: {path.resolve()}")
    return 0
