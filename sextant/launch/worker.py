"""Entry point of one worker process: `python -m sextant.launch.worker PLAN.json`.

The launcher sets the standard torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); every backend reads them from the WorkerContext. The worker writes
progress events to `rank{r}.events.jsonl` (one JSON object per line, flushed as written) and
its measurements to `rank{r}.result.json` (atomically, at the end). A failure writes
`rank{r}.error.txt` and exits non-zero; the launcher names the rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sextant.errors import UserError
from sextant.fsutil import atomic_write_json
from sextant.launch.collector import Channel
from sextant.launch.hosts import adopt_host
from sextant.launch.local import default_threads
from sextant.strategy import Strategy
from sextant.workload import Workload, workload_from_dict

EVENT_SCHEMA = 1


@dataclass(kw_only=True)
class WorkerContext:
    workload: Workload
    strategy: Strategy
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    run_dir: Path
    threads: int
    collective_timeout_s: float
    roles: tuple[str, ...] = ()
    """Role of every rank (see backends.base.ProcessLayout)."""
    ports: tuple[int, ...] = ()
    """A free port reserved for every rank."""
    addresses: tuple[str, ...] = ()
    """Address of every rank's host (loopback on one machine)."""
    local_world: int = 1
    """Ranks on this rank's host."""
    fault: str | None = None
    """Test hook (SEXTANT_TEST_FAULT): a deliberate bug, so tests can prove they fail on it."""
    _events: TextIO | None = field(default=None, repr=False)
    channel: Channel | None = field(default=None, repr=False)
    """Connection to the run's collector when the ranks share no filesystem with it."""

    @property
    def role(self) -> str:
        return self.roles[self.rank]

    def endpoint(self, rank: int) -> str:
        """host:port a rank's server listens on (TF_CONFIG and the like)."""
        return f"{self.addresses[rank]}:{self.ports[rank]}"

    @property
    def is_distributed(self) -> bool:
        return self.strategy.parallel != "single"

    def emit(self, kind: str, **payload: Any) -> None:
        """Append one event line (schema-versioned) to this rank's event file."""
        if self._events is None:
            self._events = open(self.run_dir / f"rank{self.rank}.events.jsonl", "a")
        record = {"schema": EVENT_SCHEMA, "event": kind, "rank": self.rank,
                  "time": time.time(), **payload}
        self._events.write(json.dumps(record) + "\n")
        self._events.flush()
        if self.channel is not None:
            self.channel.send({"kind": "event", "event": record})


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
    from sextant.backends.base import get_backend

    if ctx.fault and f"no-rendezvous-rank-{ctx.rank}" in ctx.fault.split(","):
        # Test hook: a host that never joins the rendezvous (the launcher ends this process).
        time.sleep(3600)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        backend = get_backend(ctx.strategy.framework)
        result = backend.run(ctx)
        result.update(rank=ctx.rank, world=ctx.world)
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
        (ctx.run_dir / f"rank{ctx.rank}.error.txt").write_text(text)
        sys.stderr.write(text)
        if ctx.channel is not None:
            try:
                ctx.channel.send({"kind": "error", "text": text})
            except OSError:
                pass
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
