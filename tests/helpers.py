"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sextant.workload import Workload, resolve_workload

REPO = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def short(name: str, steps: int, **measure: int) -> Workload:
    """A bundled workload cut to `steps` steps with light measurement settings."""
    w = resolve_workload(name)
    m = w.measure.__class__(**{"warmup_steps": 1, "nosync_steps": 2, "log_every": 2, **measure})
    return w.replace(steps=steps, measure=m)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a fresh interpreter.

    `prelude` is Python executed first (used to hide an installed framework)."""
    code = f"{prelude}\nimport sys\nfrom sextant.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, **(env or {})},
    )
