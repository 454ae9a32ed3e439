"""Command-line entry point.

Only argparse, rich and sextant's own light modules are imported here: `sextant --help` must
never import an ML framework. Each sub-command lives in its own module exposing
`register(subparsers)`; the parser sets `func` on the namespace.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from sextant import __version__
from sextant.errors import RunFailed, UserError

# Sub-command modules, in the order `--help` lists them. A module that is absent (a part of
# sextant not built yet) is skipped.
COMMAND_MODULES = (
    "sextant.commands.run",
    "sextant.commands.compare",
    "sextant.commands.runs",
    "sextant.commands.capabilities",
    "sextant.planner.cli",
    "sextant.advisor.cli",
    "sextant.commands.report",
    "sextant.commands.check",
    "sextant.commands.cluster",
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"sextant: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sextant",
        description="Measure, plan and choose a distributed-training stack on your own workload.",
    )
    parser.add_argument("--version", action="version", version=f"sextant {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is None:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        sys.stderr.write(f"sextant: error: {exc}\n")
        return 2
    except RunFailed as exc:
        sys.stderr.write(f"sextant: run failed: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("sextant: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
