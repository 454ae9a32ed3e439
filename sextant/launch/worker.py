"""Entry point of one worker process: `python -m sextant.launch.worker PLAN.json`.

The launcher sets the standard torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); every backend reads them from the WorkerContext. The worker writes
progress events to `rank{r}.events.jsonl` (one JSON object per line, flushed as written) and
its measurements to `rank{r}.result.json` (atomically, at the end). A failure writes
`rank{r}.error.txt` and exits non-zero; the launcher names the rank.

WorkerContext is defined in sextant.contracts and re-exported here.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from sextant.contracts import EVENT_SCHEMA, WorkerContext
from sextant.core.devices import pin_rank
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_json, remove_private_tempdirs
from sextant.core.allocator import keep_freed_memory
from sextant.core.cores import default_threads
from sextant.launch.hosts import adopt_host
from sextant.strategy import Strategy
from sextant.workloads.spec import workload_from_dict

__all__ = ["EVENT_SCHEMA", "WorkerContext", "context_from_plan", "main", "run_rank"]


def context_from_plan(plan: dict[str, Any], env: dict[str, str]) -> WorkerContext:
    return WorkerContext(
        workload=workload_from_dict(plan["workload"]),
        strategy=Strategy.from_dict(plan["strategy"]),
        rank=int(env["RANK"]),
        world=int(env["WORLD_SIZE"]),
        local_rank=int(env["LOCAL_RANK"]),
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
        run_dir=Path(plan["run_dir"]),
        threads=int(plan["threads"] or default_threads(
            int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])))),
        collective_timeout_s=float(plan["collective_timeout_s"]),
        roles=tuple(plan.get("roles") or ("worker",) * int(env["WORLD_SIZE"])),
        ports=tuple(plan.get("ports") or ()),
        addresses=tuple((plan.get("placement") or {}).get("addresses")
                        or (env["MASTER_ADDR"],) * int(env["WORLD_SIZE"])),
        local_world=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
        fault=env.get("SEXTANT_TEST_FAULT") or None,
        resume_step=plan.get("resume_step"),
    )


def main(argv: list[str]) -> int:
    adopt_host()
    plan = json.loads(Path(argv[0]).read_text())
    return run_rank(plan, context_from_plan(plan, dict(os.environ)))


def run_rank(plan: dict[str, Any], ctx: WorkerContext) -> int:
    """Train this rank; write (and send, with a channel) its result or its error."""
    cpus = (plan.get("cpus") or [None] * ctx.world)[ctx.rank]
    if cpus:
        os.sched_setaffinity(0, cpus)
    keep_freed_memory()  # before any framework allocates (sextant.core.allocator)
    # Before any framework is imported: this rank's own GPU only, or none on CPU ranks and
    # service ranks (parameter servers hold variables on the host).
    device = ctx.strategy.device if ctx.role == "worker" else "cpu"
    try:
        pin_rank(device, ctx.local_rank, os.environ)
    except UserError as exc:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        (ctx.run_dir / f"rank{ctx.rank}.error.txt").write_text(f"{exc}\n")
        sys.stderr.write(f"{exc}\n")
        return 1
    if ctx.fault and f"no-rendezvous-rank-{ctx.rank}" in ctx.fault.split(","):
        # Test hook: a host that never joins the rendezvous (the launcher ends this process).
        time.sleep(3600)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _train_rank(ctx)
    finally:
        remove_private_tempdirs()


def process_start_time() -> float | None:
    """Wall-clock time this process started (Linux: its start tick in /proc/self/stat against
    the uptime), so the edit-run loop counts the interpreter's own start too."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class ImportClock(importlib.abc.MetaPathFinder):
    """Times the import of one top-level package where the backend itself imports it (a
    backend sets its framework's environment first), without importing anything: the first
    finder on sys.meta_path, it notes when the package's import starts and wraps its loader
    to note when the module has executed."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.seconds: float | None = None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.package or self.seconds is not None:
            return None
        start = time.perf_counter()
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module: Any) -> None:
                    try:
                        run(module)
                    finally:
                        self.seconds = time.perf_counter() - start

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def _train_rank(ctx: WorkerContext) -> int:
    from sextant.backends.base import get_backend

    try:
        backend = get_backend(ctx.strategy.framework)
        clock = ImportClock(backend.package)
        sys.meta_path.insert(0, clock)
        try:
            result = backend.run(ctx)
        finally:
            sys.meta_path.remove(clock)
        result["startup"] = {**result.get("startup", {}), "import_s": clock.seconds,
                             "process_start_time": process_start_time()}
        result["rank"], result["world"] = ctx.rank, ctx.world
        if ctx.fault and f"fingerprint-rank-{ctx.rank}" in ctx.fault.split(","):
            # Test hook: this rank reports another framework version, as a node with a
            # different install would.
            result["fingerprint"]["framework_version"] = "0.0.0-mismatch"
        atomic_write_json(ctx.run_dir / f"rank{ctx.rank}.result.json", result)
        if ctx.channel is not None:
            ctx.channel.send({"kind": "result", "result": result})
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported with its rank
        text = (
            f"{exc}\n" if isinstance(exc, UserError) else traceback.format_exc()
        )
        own = _own_environment(ctx.strategy.framework)
        if isinstance(exc, ImportError) and own is not None:
            # The launcher shows the last line: make it the fix, not only the symptom.
            text += (f"{type(exc).__name__}: {exc} in {sys.prefix}: the {own} environment "
                     f"is broken; run `sextant env create {own} --force`\n")
        (ctx.run_dir / f"rank{ctx.rank}.error.txt").write_text(text)
        sys.stderr.write(text)
        if ctx.channel is not None:
            try:
                ctx.channel.send({"kind": "error", "text": text})
            except OSError:
                pass
        return 1


def _own_environment(framework: str) -> str | None:
    try:
        from sextant.backends.base import get_backend

        return get_backend(framework).ENVIRONMENT
    except Exception:  # noqa: BLE001 - only an addition to an error already being reported
        return None


def exit_now(code: int) -> NoReturn:
    """End a rank that has written its result, without the interpreter's teardown.

    Every file the rank keeps is already closed (the result, written atomically) or flushed
    line by line (its events); the backends have shut their process groups down. What the
    teardown would still do (freeing the framework's objects, its atexit hooks) changes
    nothing a run keeps, and took 0.4-0.6 s for torch, 0.2-0.3 s for JAX and 1.0-1.1 s for
    TensorFlow per process here (benchmarks/worker_exit.py). A failed rank still exits the
    ordinary way.
    """
    import ctypes
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers: a framework's native logs
    except (OSError, AttributeError):
        pass
    os._exit(code)


if __name__ == "__main__":
    status = main(sys.argv[1:])
    if status == 0:
        exit_now(status)
    raise SystemExit(status)
