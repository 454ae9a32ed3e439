"""The launcher's promises while a run lasts and after it:
- sextant stopped by anything (SIGTERM from a scheduler or `timeout`, SIGHUP from a closed
  SSH session, SIGKILL) leaves no worker behind; SIGTERM and SIGHUP also record the partial
  run;
- a single-host run exposes no listener to the network (every framework's rendezvous and
  collectives are reachable on loopback only)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sextant.results.store import ResultsStore
from tests.helpers import needs_torch

pytestmark = [pytest.mark.slow]


def _workers_of(marker: Path) -> list[str]:
    """Command lines of live processes that belong to the run under `marker`."""
    out = subprocess.run(["pgrep", "-af", str(marker)], check=False, capture_output=True,
                         text=True, timeout=10).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _start_training(db: Path, framework: str = "torch", parallel: str = "dp"
                    ) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sextant.cli", "run", "--framework", framework, "--parallel",
         parallel, "--workers", "2", "--steps", "5000", "--db", str(db)],
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


@needs_torch
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
    assert run.status == "interrupted"
    assert run.metrics.error == f"stopped by {sig.name}"
    assert run.metrics.steps_done >= 1



def _worker_pids(marker: Path) -> list[int]:
    return [int(line.split()[0]) for line in _workers_of(marker)
            if "sextant.launch.worker" in line]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="private network namespaces need root and iproute2")
@pytest.mark.parametrize("framework, parallel", [
    ("torch", "dp"), ("jax", "dp-manual"), ("tensorflow", "dp")])
def test_a_single_host_run_listens_on_loopback_only(tmp_path: Path, framework: str,
                                                    parallel: str) -> None:
    """torch's TCPStore, JAX's and torch's gloo and TensorFlow's gRPC servers all listen
    while the run lasts; the ranks' network namespace has no address but loopback's, so
    none of them can be reached from the network."""
    pytest.importorskip({"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}[framework])
    proc = _start_training(tmp_path / "results.db", framework, parallel)
    try:
        pids = _worker_pids(tmp_path)
        assert len(pids) == 2
        for pid in pids:
            listening = _nsenter(pid, "ss", "-Hltn")
            assert listening.strip(), "the rank should be listening for its peers"
            addresses = _nsenter(pid, "ip", "-o", "addr").split("\n")
            assert {line.split()[3] for line in addresses if line.strip()} <= {
                "127.0.0.1/8", "::1/128"}
            assert _netns(pid) != _netns(os.getpid())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert not list(Path("/run/netns").glob(f"sextant-run-{proc.pid}-*"))


def _nsenter(pid: int, *argv: str) -> str:
    return subprocess.run(["nsenter", "-t", str(pid), "-n", *argv], check=True,
                          capture_output=True, text=True, timeout=10).stdout


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")
