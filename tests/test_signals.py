"""sextant stopped by anything (SIGTERM from a scheduler or `timeout`, SIGHUP from a closed SSH
session, SIGKILL) leaves no worker behind; SIGTERM and SIGHUP also record the partial run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sextant.results.store import ResultsStore
from tests.helpers import needs_torch

pytestmark = [pytest.mark.slow, needs_torch]


def _workers_of(marker: Path) -> list[str]:
    """Command lines of live processes that belong to the run under `marker`."""
    out = subprocess.run(["pgrep", "-af", str(marker)], check=False, capture_output=True,
                         text=True, timeout=10).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _start_training(db: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sextant.cli", "run", "--parallel", "dp", "--workers", "2",
         "--steps", "5000", "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until a worker has trained a step
        events = list((db.parent / "runs").glob("*/rank1.events.jsonl"))
        if events and '"step"' in events[0].read_text():
            return proc
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the workers never trained a step")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_no_worker_outlives_its_parent(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "results.db"
    proc = _start_training(db)
    assert len(_workers_of(tmp_path)) >= 2
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (128 + sig, -sig)
    deadline = time.monotonic() + 10
    while _workers_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(tmp_path) == []
    if sig == signal.SIGKILL:
        return  # nothing can run in a SIGKILLed parent; the workers died with it
    assert f"stopped by {sig.name}" in err.decode()
    with ResultsStore(db, create=False) as store:
        (run,) = store.runs()
    assert run["status"] == "interrupted"
    assert run["metrics"]["error"] == f"stopped by {sig.name}"
    assert run["metrics"]["steps_done"] >= 1

