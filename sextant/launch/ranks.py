"""Small multi-process jobs (collective micro-benchmarks): start one process per rank, wait
for all with one deadline, and name the rank that failed or hung."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from sextant.core.errors import RunFailed
from sextant.launch.hosts import Placement


def run_rank_processes(argv_of: Callable[[int], list[str]], world: int, *, timeout: float,
                       what: str, env: dict[str, str] | None = None,
                       placement: Placement | None = None) -> None:
    """Run `python -m <argv_of(rank)>` for every rank (on its host, with a placement);
    RunFailed names the first rank that exited non-zero or outlived `timeout` seconds (all
    are killed then). The ranks die with this process (see hosts.adopt_host)."""
    base = {**(os.environ if env is None else env), "SEXTANT_PARENT_PID": str(os.getpid())}

    def start(rank: int) -> subprocess.Popen[str]:
        host = placement.host_of(rank) if placement is not None else None
        return subprocess.Popen(
            [*(host.prefix if host else ()), sys.executable, "-m", *argv_of(rank)],
            env={**base, **(host.env() if host else {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    procs = [start(rank) for rank in range(world)]
    deadline = time.monotonic() + timeout
    failed = None
    try:
        for rank, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                failed = (rank, f"timed out after {timeout:.0f} s")
                break
            if proc.returncode != 0 and failed is None:
                tail = err.strip().splitlines()[-1:] or ["no output"]
                failed = (rank, f"exit code {proc.returncode}: {tail[0]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    if failed is not None:
        raise RunFailed(f"{what} rank {failed[0]} {failed[1]}")
