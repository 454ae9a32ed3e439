"""Command-line entry point.

Only argparse, rich and sextant's own light modules are imported here: `sextant --help` must
never import an ML framework. Each sub-command lives in its own module exposing
`register(subparsers)`; the parser sets `func` on the namespace.
"""

from __future__ import annotations

import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    sys.stderr.write("sextant: interrupted\n")
    raise SystemExit(130)


# Ctrl-C while the command's modules load ends like Ctrl-C later, without a traceback. Only
# when this module is the program (`sextant`, `python -m sextant.cli`), not when imported.
if __name__ == "__main__" or sys.argv[0].rsplit("/", 1)[-1] == "sextant":
    signal.signal(signal.SIGINT, _interrupted_while_starting)

import argparse  # noqa: E402 - after the handler above
import importlib  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

from sextant import __version__  # noqa: E402
from sextant.core.errors import RunFailed, UserError  # noqa: E402

# Sub-command modules, in the order `--help` lists them. Every one must import: a module that
# fails to (a broken install, a syntax error, a missing dependency) is an error naming it,
# never a command that silently disappears from `sextant --help`.
COMMAND_MODULES = (
    "sextant.commands.run",
    "sextant.commands.compare",
    "sextant.commands.export",
    "sextant.commands.runs",
    "sextant.commands.capabilities",
    "sextant.commands.env",
    "sextant.commands.plan",
    "sextant.commands.calibrate",
    "sextant.commands.advise",
    "sextant.commands.report",
    "sextant.commands.check",
    "sextant.commands.cluster",
    "sextant.commands.join",
    "sextant.commands.workload",
)


class CommandModuleError(ImportError):
    """A sub-command module of COMMAND_MODULES could not be imported."""


def one_line(text: str) -> str:
    """`text` with every unprintable character (newlines, other line separators, control
    characters from a file name or workload) escaped, so an error stays on one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2, and a flag is
    taken only as written (`advise --rules` is no `--rules-file`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"sextant: error: {one_line(message)} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command` (a sub-command's name, which is also its module's),
    only that sub-command, so `sextant plan` does not import what `sextant run` needs (0.26 s
    of start-up). `--help`, an unknown command and no command import every module."""
    parser = _Parser(
        prog="sextant",
        description="Measure, plan and choose a distributed-training stack on your own workload.",
    )
    parser.add_argument("--version", action="version", version=f"sextant {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = f"sextant.commands.{command}"
    for name in (wanted,) if wanted in COMMAND_MODULES else COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise CommandModuleError(
                f"sextant: cannot load the command module {name}: "
                f"{type(exc).__name__}: {exc} (a broken or partial install? "
                "reinstall sextant)") from exc
        module.register(sub)
    return parser


def _command_word(argv: list[str]) -> str | None:
    """The sub-command `argv` names, when its first word is one (not an option)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a scheduler's cancel, `timeout`, an SSH disconnect): unwound like
    Ctrl-C, so the launcher's clean-up stops every worker and the run is recorded."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    # One clean-up is enough: a second signal while it runs must not interrupt it.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    # Ctrl-C unwinds as KeyboardInterrupt from here on: the launcher's clean-up needs it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _dispatch(argv)
    except Stopped as exc:
        sys.stderr.write(f"sextant: stopped by {exc}\n")
        return 128 + exc.signum
    except KeyboardInterrupt:  # also while the sub-command's modules are imported
        sys.stderr.write("sextant: interrupted\n")
        return 130


def _dispatch(argv: list[str] | None) -> int:
    try:
        parser = build_parser(_command_word(sys.argv[1:] if argv is None else argv))
    except CommandModuleError as exc:
        sys.stderr.write(one_line(str(exc)) + "\n")
        return 1
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        sys.stderr.write(f"sextant: error: {one_line(str(exc))}\n")
        return 2
    except RunFailed as exc:
        sys.stderr.write(f"sextant: run failed: {one_line(str(exc))}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
