"""The CLI through the real console entry point: bad input is one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sextant.backends.base import get_backend
from sextant.strategy import FRAMEWORKS
from tests.helpers import run_cli

def hide(*packages: str) -> str:
    """Python that makes `packages` invisible to the import system, as on a machine
    without them."""
    return f"""
import importlib.machinery
_orig = importlib.machinery.PathFinder.find_spec
def _find(name, path=None, target=None):
    return None if name.split(".")[0] in {packages!r} else _orig(name, path, target)
importlib.machinery.PathFinder.find_spec = staticmethod(_find)
"""


def assert_one_line_error(proc, fragment: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("sextant: error: ")
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_help_lists_commands() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for cmd in ("run", "compare", "runs", "report"):
        assert cmd in proc.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "--workload", "missing.toml"], "workload file not found: missing.toml"),
        (["run", "--framework", "caffe"], "unknown framework 'caffe'; allowed: torch, jax, tensorflow"),
        (["run", "--mode", "turbo"], "unknown mode 'turbo'; allowed: eager, compiled"),
        (["run", "--parallel", "dp", "--workers", "0"], "workers must be an integer >= 1. Received: 0"),
        (["run", "--workers", "two"], "argument --workers: invalid int value: 'two'"),
        (["run", "--parallel", "pipeline"], "argument --parallel: invalid choice: 'pipeline' "
                                            "(choose from 'single', 'dp',"),
        (["run", "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        (["check", "--timeout", "0"], "argument --timeout: must be a number of seconds > 0"),
        (["check", "--collective-timeout", "-1"], "argument --collective-timeout: must be a "
                                                  "number of seconds > 0"),
        (["check", "--parallel", "ring"], "argument --parallel: invalid choice: 'ring'"),
        (["compare", "levers", "layouts"], "unrecognized arguments: layouts"),
        (["advise", "--init"], "unrecognized arguments: --init"),
        (["run", "--workers", "2"], "parallel 'single' runs one worker"),
        (["run", "--steps", "1"], "--steps must exceed the workload's measure.warmup_steps"),
        (["run", "--grad-accum", "3"], "--grad-accum 3 does not divide the 16 rows each replica"),
        (["advise", "--profile", str(Path(__file__).parents[1] / "examples" / "profiles"
                                     / "startup-nvidia-pytorch.toml"), "--plan",
          "missing.json"], "--plan missing.json: no such file"),
        (["report", "--plan", "p.json"], "--plan gives the advisor's training hours: it needs"),
        (["compare", "--frameworks", "torch,caffe"], "unknown framework 'caffe' in --frameworks"),
        (["compare", "--repeats", "0"], "argument --repeats: must be an integer from 1 to 1000"),
        (["run", "--repeats", "two"], "argument --repeats: must be an integer from 1 to 1000"),
        (["runs", "list"], "no results store at"),
        (["bogus"], "invalid choice: 'bogus'"),
    ],
)
def test_bad_input(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = run_cli(*args, "--db", str(tmp_path / "r.db"), cwd=tmp_path) if args[0] != "bogus" \
        else run_cli(*args, cwd=tmp_path)
    assert_one_line_error(proc, fragment)


def test_bad_toml_and_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    assert_one_line_error(run_cli("run", "--workload", str(bad)), "is not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('name = "x"\nlayers = 3\n[model]\nfamily = "gpt"\n[data]\n'
                       'dataset = "python-reference"\n')
    assert_one_line_error(run_cli("run", "--workload", str(unknown)), "unknown key layers")


def test_framework_not_installed(tmp_path: Path) -> None:
    proc = run_cli("run", "--db", str(tmp_path / "r.db"), prelude=hide("torch"))
    assert_one_line_error(proc, "torch: not installed (pip install 'sextant[torch]')")
    proc = run_cli("compare", "--frameworks", "torch", "--db", str(tmp_path / "r.db"),
                   prelude=hide("torch"))
    assert_one_line_error(proc, "torch: not installed (pip install 'sextant[torch]')")
    # Without any framework (and no framework environment), compare names each missing one,
    # then says what to install: a pip extra, or `sextant env create`.
    proc = run_cli("compare", "--db", str(tmp_path / "r.db"), prelude=hide(*FRAMEWORKS),
                   env={"SEXTANT_ENVS": str(tmp_path / "no-environments")})
    assert proc.returncode == 2
    for name in FRAMEWORKS:
        backend = get_backend(name)
        how = (f"sextant env create {backend.ENVIRONMENT}" if backend.ENVIRONMENT
               else f"pip install 'sextant[{name}]'")
        assert f"{name}: not installed ({how})" in proc.stdout
    assert "no framework is installed" in proc.stderr


def test_export_bad_format_with_store(tmp_path: Path) -> None:
    from sextant.results.store import ResultsStore

    ResultsStore(tmp_path / "r.db").close()
    proc = run_cli("runs", "export", "--format", "xml", "--db", str(tmp_path / "r.db"))
    assert_one_line_error(proc, "unknown export format 'xml'; allowed: csv, json")


def test_corrupt_store_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    path.write_bytes(b"garbage" * 1000)
    proc = run_cli("runs", "list", "--db", str(path))
    assert_one_line_error(proc, "is not a sextant results database")
    assert path.read_bytes() == b"garbage" * 1000


@pytest.mark.parametrize("prelude", [
    # The module is missing (a partial install): once, `sextant` silently dropped its command.
    "import sys\nsys.modules['sextant.commands.plan'] = None",
    # The module is there but fails to import (a broken dependency, a syntax error).
    "import sys\nclass _Broken:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'sextant.commands.advise':\n"
    "            raise RuntimeError('half-installed')\n"
    "sys.meta_path.insert(0, _Broken())\n",
])
def test_a_command_module_that_fails_to_import_is_a_loud_error(prelude: str) -> None:
    proc = run_cli("--help", prelude=prelude)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    name = "sextant.commands.plan" if "commands.plan" in prelude else "sextant.commands.advise"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"sextant: cannot load the command module {name}: "), lines[0]
    assert proc.stdout == ""


def test_build_parser_names_the_module_that_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    from sextant import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "sextant.commands.nope"))
    with pytest.raises(cli.CommandModuleError, match=r"sextant\.commands\.nope"):
        cli.build_parser()


def test_every_command_module_registers_from_sextant_commands() -> None:
    from sextant import cli

    assert all(name.startswith("sextant.commands.") for name in cli.COMMAND_MODULES)
    sub = cli.build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    for command in ("plan", "calibrate", "advise"):
        assert command in sub.choices


def test_a_named_command_loads_its_module_only() -> None:
    # `sextant plan` must not pay for what `sextant run` imports; that works because every
    # module registers exactly the command it is named after.
    from sextant import cli

    for name in cli.COMMAND_MODULES:
        command = name.rsplit(".", 1)[1]
        sub = cli.build_parser(command)._subparsers._group_actions[0]  # type: ignore[union-attr]
        assert list(sub.choices) == [command]
    code = ("import sys\nfrom sextant.cli import main\n"
            "main(['plan', 'list'])\n"
            "print('LOADED', 'sextant.commands.run' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "LOADED False" in out


def test_one_db_flag_for_every_command() -> None:
    """Every command that takes --db takes it from add_store_args: same type, same default,
    same documented fallback (a verb that repeats its command's flags takes the command's
    value, common.inherit_parent_flags)."""
    import argparse

    from sextant import cli
    from sextant.core.paths import DEFAULT_DB

    def parsers(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    found = []
    for parser in parsers(cli.build_parser()):
        for action in parser._actions:
            if "--db" in action.option_strings:
                found.append(parser.prog)
                assert action.type is Path, parser.prog
                assert action.default is None or (
                    action.default == argparse.SUPPRESS and parser.prog.count(" ") == 2), parser.prog
                assert action.help == argparse.SUPPRESS or action.help.endswith(
                    f"(default: $SEXTANT_RESULTS or ./{DEFAULT_DB.as_posix()})"), parser.prog
    for prog in ("sextant run", "sextant compare", "sextant advise", "sextant plan validate",
                 "sextant check", "sextant report", "sextant compare levers",
                 "sextant compare layouts"):
        assert prog in found, found


@pytest.mark.parametrize("argv", [
    ["compare", "--frameworks", "jax", "--steps", "7", "levers"],
    ["compare", "levers", "--frameworks", "jax", "--steps", "7"],
    ["compare", "--frameworks", "jax", "levers", "--steps", "7"],
])
def test_a_verb_takes_its_command_flags_before_or_after_it(argv: list[str]) -> None:
    from sextant import cli
    from sextant.commands.trials import DEFAULT_REPEATS

    args = cli.build_parser("compare").parse_args(argv)
    assert (args.verb, args.frameworks, args.steps) == ("levers", "jax", 7)
    # The command's defaults, not lost to the verb's parser.
    assert args.workload is None and args.repeats == DEFAULT_REPEATS and args.timeout > 0


def test_check_takes_the_run_flags() -> None:
    from sextant import cli

    args = cli.build_parser("check").parse_args(
        ["check", "--collective-timeout", "5", "--threads", "2"])
    assert (args.collective_timeout, args.threads, args.parallel, args.workers) == (5, 2, "dp", 2)
