"""`import sextant` and `sextant --help` must not import any ML framework."""

from __future__ import annotations

import subprocess
import sys

from sextant.strategy import FRAMEWORKS as RUNNABLE

# The frameworks sextant runs, plus the packages they pull in and those the advisor names.
FRAMEWORKS = (*RUNNABLE, "jaxlib", "keras", "paddle", "mindspore", "mlx")


def imported_modules(code: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=120, check=True)
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert names, proc.stderr[-2000:]
    return names


def test_import_sextant_imports_no_framework() -> None:
    names = imported_modules("import sextant, sextant.workloads.spec, sextant.backends, sextant.runner")
    assert not names & set(FRAMEWORKS)


def test_help_imports_no_framework() -> None:
    code = ("import sys; from sextant.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "for cmd in ('run', 'compare', 'runs', 'report'):\n"
            "    try:\n        main([cmd, '--help'])\n    except SystemExit:\n        pass\n")
    names = imported_modules(code)
    assert "sextant" in names and "rich" in names
    assert not names & set(FRAMEWORKS)


def test_the_report_does_not_import_the_cli_layer() -> None:
    """`sextant.report` shares its number formatters with the commands through the neutral
    `sextant.core.display`; importing it pulls in no `sextant.commands` module."""
    code = ("import sys, sextant.report.html, sextant.report.markdown, sextant.report.model\n"
            "bad = sorted(m for m in sys.modules if m.startswith('sextant.commands') "
            "or m == 'sextant.cli')\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
