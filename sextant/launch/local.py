"""Launch the workers of one run on this machine and wait for them, with timeouts.

Every run gets fresh processes and a fresh rendezvous port, so no framework state leaks from
one measurement into the next. The launcher sets the standard torch.distributed environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) for every
framework, and OMP_NUM_THREADS to the worker's thread share. A worker that dies, raises or
outlives the timeout stops the whole run with an error that names its rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.contracts import RankResult
from sextant.core.cores import default_threads, usable_cores
from sextant.core.defaults import COLLECTIVE_TIMEOUT_S, RUN_TIMEOUT_S
from sextant.core.errors import RunFailed
from sextant.core.fsutil import atomic_write_json
from sextant.launch.hosts import Placement, private_loopback
from sextant.strategy import Strategy
from sextant.workloads.spec import Workload

if TYPE_CHECKING:
    from sextant.backends.base import ProcessLayout

EventHandler = Callable[[dict[str, Any]], None]
Launcher = Callable[..., list[RankResult]]
"""launch(workload, strategy, run_dir, *, timeout_s, collective_timeout_s, on_event,
extra_env, resume_step) -> each primary rank's result, as `launch` below: the local
launcher, Slurm's (slurm.launcher) and a torchrun-style rank 0's (join.rank0_launcher)."""


def free_port(bind: str = "127.0.0.1") -> int:
    """A TCP port free now on `bind` (loopback; "" for every interface); the OS picks it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((bind, 0))
        return int(s.getsockname()[1])


def core_sets(layout_primary: tuple[int, ...], world: int, threads: int) -> list[list[int] | None]:
    """CPU cores each rank is pinned to: primary rank i gets its own `threads` cores when the
    machine has enough, so frameworks whose thread pools size themselves from the affinity
    mask (XLA, TensorFlow) use the same share as those told a thread count (torch). Service
    ranks and oversubscribed runs are not pinned."""
    cores = usable_cores()
    if not hasattr(os, "sched_setaffinity") or len(layout_primary) * threads > len(cores):
        return [None] * world
    sets: list[list[int] | None] = [None] * world
    for i, rank in enumerate(layout_primary):
        sets[rank] = cores[i * threads : (i + 1) * threads]
    return sets


class _EventTail:
    """Reads the new complete lines of a worker's event file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.buffer = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        return [json.loads(line) for line in lines if line.strip()]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def _last_error_line(run_dir: Path, rank: int, *, killed: bool = False) -> str:
    """The exception line of a rank's traceback (frameworks append notes after it). A rank
    killed by a signal wrote no traceback: its last stderr line would be some earlier,
    unrelated warning, so only an exception line is quoted then."""
    for name in (f"rank{rank}.error.txt", f"rank{rank}.stderr.log"):
        path = run_dir / name
        if path.exists():
            lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                     if ln.strip()]
            exceptions = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
            if exceptions:
                return exceptions[-1][:500]
            if lines and not killed:
                return lines[-1][:500]
    if killed:
        return "no error output (a rank killed by a signal: out of memory, or killed from outside)"
    return "no error output"


def base_plan(workload: Workload, strategy: Strategy, run_dir: Path, roles: tuple[str, ...],
              collective_timeout_s: float, resume_step: int | None = None) -> dict[str, Any]:
    """What every rank of a run must know, however it is started. Launchers add threads,
    core sets, ports and the placement. `resume_step`: the checkpoint every rank resumes
    from (sextant.checkpoint.resume_plan)."""
    return {"workload": workload.to_dict(), "strategy": strategy.to_dict(),
            "run_dir": str(run_dir), "collective_timeout_s": collective_timeout_s,
            "roles": list(roles), "threads": None, "cpus": None, "resume_step": resume_step}


def launch(
    workload: Workload,
    strategy: Strategy,
    run_dir: Path,
    *,
    timeout_s: float = RUN_TIMEOUT_S,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
    on_event: EventHandler | None = None,
    extra_env: dict[str, str] | None = None,
    place: Callable[[int], Placement] | None = None,
    resume_step: int | None = None,
) -> list[RankResult]:
    """Run all ranks (on this machine, or where `place(world)` puts them: the hosts of an
    emulated cluster, sextant.cluster.emulated.placement); return each primary rank's result
    dict (rank order)."""
    from sextant.backends.base import layout_of

    run_dir.mkdir(parents=True, exist_ok=True)
    layout = layout_of(strategy)
    world = len(layout.roles)
    hosts = (contextlib.nullcontext(place(world)) if place is not None
             else private_loopback(world))
    with hosts as placement:
        return _launch(workload, strategy, run_dir, layout, placement, timeout_s=timeout_s,
                       collective_timeout_s=collective_timeout_s, on_event=on_event,
                       extra_env=extra_env, resume_step=resume_step)


def _launch(workload: Workload, strategy: Strategy, run_dir: Path, layout: ProcessLayout,
            placement: Placement, *, timeout_s: float, collective_timeout_s: float,
            on_event: EventHandler | None, extra_env: dict[str, str] | None,
            resume_step: int | None = None) -> list[RankResult]:
    world = len(layout.roles)
    from sextant.backends.base import python_for

    python = python_for(strategy.framework)  # this interpreter, or the framework's environment
    threads = strategy.threads or default_threads(len(layout.primary))
    ports = sorted({free_port() for _ in range(world + 1)})
    while len(ports) < world + 1:
        ports = sorted(set(ports) | {free_port()})
    plan = {
        **base_plan(workload, strategy, run_dir, layout.roles, collective_timeout_s,
                    resume_step),
        "threads": threads,
        "cpus": core_sets(layout.primary, world, threads),
        # One free port per rank (for frameworks that want an address per process, such as
        # TF_CONFIG), plus MASTER_PORT for the rendezvous; each rank listens on its host's
        # address (loopback on one machine).
        "ports": ports[1:],
        "placement": placement.to_dict(),
    }
    plan_path = run_dir / "plan.json"
    atomic_write_json(plan_path, plan)
    procs: list[subprocess.Popen[bytes]] = []
    tails = [_EventTail(run_dir / f"rank{r}.events.jsonl") for r in range(world)]
    try:
        for rank in range(world):
            procs.append(_start_rank(rank, world, python, plan_path, placement, port=ports[0],
                                     threads=threads, extra_env=extra_env))
        _wait(procs, tails, layout, placement, strategy, run_dir, timeout_s=timeout_s,
              on_event=on_event)
    finally:
        _kill_all(procs)
        # Every rank's per-step events, merged into one schema-versioned metrics.jsonl (also
        # for failed runs: the steps before the failure are what a user debugs with).
        from sextant.monitor import write_metrics

        try:
            write_metrics(run_dir)
        except (OSError, ValueError) as exc:  # never hide the run's own error behind this
            sys.stderr.write(f"sextant: could not write {run_dir}/metrics.jsonl: {exc}\n")
    results = []
    for rank in layout.primary:
        path = run_dir / f"rank{rank}.result.json"
        if not path.exists():
            raise RunFailed(f"{strategy.label}: rank {rank} exited without a result ({path})",
                            run_dir=run_dir)
        results.append(json.loads(path.read_text()))
    return results


def _start_rank(rank: int, world: int, python: str, plan_path: Path, placement: Placement, *,
                port: int, threads: int, extra_env: dict[str, str] | None
                ) -> subprocess.Popen[bytes]:
    """One rank's worker process, in a session of its own (so that its whole process group
    can be killed), with torch-style rendezvous variables and its logs in the run
    directory."""
    host = placement.host_of(rank)
    env = {
        **os.environ,
        **(extra_env or {}),
        **host.env(),
        "MASTER_ADDR": placement.master_addr,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(placement.local_rank(rank)),
        "LOCAL_WORLD_SIZE": str(placement.local_world(rank)),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "SEXTANT_PARENT_PID": str(os.getpid()),
    }
    run_dir = plan_path.parent
    with open(run_dir / f"rank{rank}.stdout.log", "wb") as out, open(
        run_dir / f"rank{rank}.stderr.log", "wb"
    ) as err:
        return subprocess.Popen(
            [*host.prefix, python, "-m", "sextant.launch.worker", str(plan_path)],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )


def _wait(procs: list[subprocess.Popen[bytes]], tails: list[_EventTail], layout: ProcessLayout,
          placement: Placement, strategy: Strategy, run_dir: Path, *, timeout_s: float,
          on_event: EventHandler | None) -> None:
    """Until every primary rank has exited 0, passing the ranks' events on; RunFailed naming
    the rank that failed first (or the ranks still running at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for tail in tails:
            for event in tail.read():
                if on_event is not None:
                    on_event(event)
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes)
                  if c not in (None, 0) or (c == 0 and r not in layout.primary)]
        if failed:
            # The first rank to fail is the cause; the others usually fail because of it.
            # Ranks found failed in the same poll: one killed by SIGKILL (the OOM killer,
            # or killed from outside: never a framework's own abort) is the cause, and a
            # peer that exited on losing it is not.
            rank, code = min(failed, key=lambda rc: (rc[1] != -signal.SIGKILL, rc[0]))
            role = "" if layout.roles[rank] == "worker" else f" ({layout.roles[rank]})"
            where = f" on {placement.host_of(rank).name}" if placement.multi_host else ""
            raise RunFailed(
                f"{strategy.label}: rank {rank}{role}{where} {_describe_exit(code)}: "
                f"{_last_error_line(run_dir, rank, killed=code < 0)} (logs: {run_dir})",
                run_dir=run_dir)
        if all(codes[r] == 0 for r in layout.primary):
            return
        if time.monotonic() > deadline:
            running = [r for r, c in enumerate(codes) if c is None]
            raise RunFailed(
                f"{strategy.label}: timed out after {timeout_s:.0f} s; rank(s) "
                f"{', '.join(map(str, running))} still running (logs: {run_dir})",
                run_dir=run_dir)
        time.sleep(0.05)


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill the process group of every rank still running, and reap it."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
