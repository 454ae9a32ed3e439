"""The planner and `sextant --help` never import an ML framework."""

from __future__ import annotations

import subprocess
import sys


def test_planner_imports_no_framework():
    code = (
        "import sys, sextant.planner, sextant.commands.plan, sextant.planner.calibrate, "
        "sextant.commands.calibrate, sextant.planner.validate, sextant.planner.references\n"
        "from sextant.cli import build_parser\n"
        "build_parser()\n"
        "from sextant.strategy import FRAMEWORKS\n"
        "bad = [m for m in FRAMEWORKS if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
