"""`sextant env create NAME | list | remove NAME`: the per-framework environments of
sextant.core.envs (PaddlePaddle and MindSpore train in their own interpreter)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.markup import escape
from rich.table import Table

from sextant.core import envs
from sextant.core.display import console
from sextant.core.errors import UserError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "env", help="create and list the environments of frameworks that need their own",
        description="Frameworks whose pins cannot share this environment (PaddlePaddle, "
                    "MindSpore) train in a virtual environment of their own; runs of such a "
                    "framework start their workers there. Environments live in $SEXTANT_ENVS "
                    f"(now {envs.root()}).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(p))
    create = verbs.add_parser(
        "create", help="make (or finish) a framework's environment",
        description="Make a virtual environment with the framework's pinned packages, numpy, "
                    "rich and this sextant, check that the framework imports there, and "
                    "record it. An unfinished one is completed; --force re-makes it.")
    create.add_argument("name", help=f"one of: {', '.join(envs.SPECS)}")
    create.add_argument("--force", action="store_true",
                        help="delete an existing environment first")
    create.add_argument("--python", metavar="PATH",
                        help="the interpreter to base it on (default: this one)")
    create.add_argument("--package", action="append", default=[], metavar="REQUIREMENT",
                        help="pip requirements replacing the default pins (repeat; e.g. a "
                             "GPU build: --package paddlepaddle-gpu==3.3.1)")
    create.add_argument("--quiet", action="store_true", help="hide pip's output")
    create.set_defaults(func=cmd_create)
    ls = verbs.add_parser("list", help="the environments sextant knows and their state")
    ls.set_defaults(func=cmd_list)
    rm = verbs.add_parser("remove", help="delete a framework's environment")
    rm.add_argument("name", help=f"one of: {', '.join(envs.SPECS)}")
    rm.set_defaults(func=cmd_remove)


def cmd_create(args: argparse.Namespace) -> int:
    envs.create(args.name, python=args.python, packages=tuple(args.package),
                force=args.force, quiet=args.quiet,
                say=lambda line: console().print(escape(line)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    out = console()
    table = Table(header_style="bold", title=f"environments in {escape(str(envs.root()))}",
                  title_justify="left")
    for column in ("name", "state", "versions", "created", "why its own"):
        table.add_column(column)
    for name, spec in envs.SPECS.items():
        try:
            record = envs.load(name)
        except UserError as exc:
            table.add_row(name, "unreadable", escape(str(exc)), "", spec.why)
            continue
        if record is None:
            state = ("unfinished: sextant env create " + name
                     if envs.location(name).exists() else "missing: sextant env create " + name)
            table.add_row(name, state, "", "", spec.why)
            continue
        versions = ", ".join(f"{k} {v}" for k, v in record.versions.items())
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
        table.add_row(name, "ready", escape(versions),
                      f"{created} ({record.create_s:.0f} s)", spec.why)
    out.print(table)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    removed = envs.remove(args.name)
    console().print(f"{args.name}: " + (f"removed {escape(str(envs.location(args.name)))}"
                                        if removed else "no environment to remove"))
    return 0
