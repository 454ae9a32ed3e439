"""Ranks started by a cluster's own launcher: `sextant join` on every node (or every task).

A rank's identity comes from the environment its launcher set:
- torchrun, Kubernetes training operators and MPI wrappers that export them: RANK,
  WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (the Training
  Operator's PyTorchJob, a JobSet rendered by sextant);
- the Kubeflow Trainer's TrainJob nodes: PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR,
  PET_MASTER_PORT (torchrun's own variables, which the Trainer sets for it), one rank a node;
- Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
  SLURM_TASKS_PER_NODE and SLURM_JOB_NODELIST (MASTER_ADDR is the first node of the job,
  MASTER_PORT is SEXTANT_MASTER_PORT or 29500).

Where the run is stored: with SEXTANT_COLLECTOR=host:port (set by `sextant run --launcher
slurm`), every rank reports to that collector and the host that submitted the job stores the
run. Otherwise rank 0 hosts the collector itself, at MASTER_ADDR:MASTER_PORT+1, and stores the
run in its own results database (--db). Every rank proves the run's secret to the collector
(SEXTANT_COLLECTOR_SECRET or SEXTANT_COLLECTOR_SECRET_FILE, see collector.py). Either way no filesystem is shared: the plan reaches
the ranks and their events and results come back over that one TCP connection per rank (see
collector.py). The framework's own rendezvous (c10d store, JAX coordinator, TF_CONFIG) uses
rank 0's address and a free port each rank reports.
"""

from __future__ import annotations

import os
import random
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.contracts import RankResult
from sextant.core.errors import RunFailed, UserError
from sextant.launch.collector import (
    ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
    Channel,
    Collector,
    CollectorRefused,
    gather,
    secret_from_env,
)
from sextant.launch.local import EventHandler, Launcher, free_port

if TYPE_CHECKING:
    from sextant.contracts import WorkerContext
    from sextant.strategy import Strategy
    from sextant.workloads.spec import Workload

DEFAULT_MASTER_PORT = 29500
COLLECTOR_PORT_OFFSET = 1
"""Without SEXTANT_COLLECTOR, rank 0's collector listens on MASTER_PORT + this."""


@dataclass(frozen=True, slots=True)
class Identity:
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    source: str
    """'torchrun', 'kubeflow-trainer' or 'slurm': which variables it came from."""


def identity_from_env(env: dict[str, str]) -> Identity:
    """This rank's place in the job, from the launcher's variables (UserError naming the
    missing ones when neither set is complete)."""
    torchrun = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if all(k in env for k in torchrun):
        world = _int(env, "WORLD_SIZE")
        return Identity(rank=_int(env, "RANK"), world=world,
                        local_rank=_int(env, "LOCAL_RANK", 0),
                        local_world=_int(env, "LOCAL_WORLD_SIZE", world),
                        master_addr=env["MASTER_ADDR"], master_port=_int(env, "MASTER_PORT"),
                        source="torchrun")
    trainer = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
    if all(k in env for k in trainer):
        return _trainer_identity(env)
    slurm = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST")
    if all(k in env for k in slurm):
        per_node = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", env["SLURM_NTASKS"]))
        node = _int(env, "SLURM_NODEID", 0)
        return Identity(rank=_int(env, "SLURM_PROCID"), world=_int(env, "SLURM_NTASKS"),
                        local_rank=_int(env, "SLURM_LOCALID", 0),
                        local_world=per_node[node] if node < len(per_node) else 1,
                        master_addr=first_host(env["SLURM_JOB_NODELIST"]),
                        master_port=_int(env, "SEXTANT_MASTER_PORT", DEFAULT_MASTER_PORT),
                        source="slurm")
    raise UserError(
        "sextant join needs its rank from the launcher: RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT (torchrun and similar), the Kubeflow Trainer's PET_NNODES, "
        "PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, or Slurm's SLURM_PROCID, "
        "SLURM_NTASKS and SLURM_JOB_NODELIST (srun); none of these sets is complete here")


def _trainer_identity(env: dict[str, str]) -> Identity:
    """A Kubeflow Trainer node (torchrun's PET_* variables, set for `torchrun` itself): one
    rank per node, since no torchrun starts more processes in it."""
    per_node = env.get("PET_NPROC_PER_NODE", "1")
    if per_node != "1":
        raise UserError(f"sextant join runs one rank per Trainer node: set the TrainJob's "
                        f"trainer.numProcPerNode to 1. Received: PET_NPROC_PER_NODE="
                        f"{per_node[:40]!r}")
    return Identity(rank=_int(env, "PET_NODE_RANK"), world=_int(env, "PET_NNODES"),
                    local_rank=0, local_world=1, master_addr=env["PET_MASTER_ADDR"],
                    master_port=_int(env, "PET_MASTER_PORT"), source="kubeflow-trainer")


def _int(env: dict[str, str], key: str, default: int | None = None) -> int:
    if key not in env and default is not None:
        return default
    try:
        return int(env[key])
    except ValueError:
        raise UserError(f"{key} must be an integer. Received: {env[key]!r}") from None


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE ('2(x3),1') as one count per node ([2, 2, 2, 1])."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise UserError(f"cannot read SLURM_TASKS_PER_NODE {spec!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: 'node[03-05,9],gpu1' -> 'node03'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise UserError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def run_secret(env: dict[str, str]) -> bytes:
    """The run's collector secret, which every rank must be given (UserError saying how)."""
    secret = secret_from_env(env)
    if secret is None:
        raise UserError(
            f"sextant join needs the run's secret, the same on every node: set {SECRET_ENV} "
            f"to 64 hex digits (`python -c 'import secrets; print(secrets.token_hex(32))'`) "
            f"or {SECRET_FILE_ENV} to a file that holds them; see docs/multi-host.md")
    return secret


RETRY_FIRST_S = 0.25
RETRY_MAX_S = 4.0


def connect(address: str, rank: int, timeout_s: float, secret: bytes) -> Channel:
    """Connect to the collector, retrying while it starts (rank 0 may be slower to start)
    or while it is busy with other connections' hellos, with a jittered backoff (so ranks
    turned away together do not come back together) until `timeout_s`; a refused hello is
    not retried."""
    deadline = time.monotonic() + timeout_s
    wait = RETRY_FIRST_S
    while True:
        try:
            return Channel(address, rank, free_port(""), secret)  # reached from other hosts
        except CollectorRefused:
            raise
        except RunFailed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(left, wait * random.uniform(0.5, 1.0)))
            wait = min(RETRY_MAX_S, 2 * wait)


def context_for(channel: Channel, identity: Identity
                ) -> tuple[dict[str, Any], WorkerContext]:
    """The worker context from the collector's welcome (plan, addresses, ports) and this
    rank's identity. MASTER_* are set for frameworks that read them from the environment."""
    from sextant.launch.worker import context_from_plan

    welcome = channel.welcome
    plan = {**welcome["plan"], "ports": welcome["ports"],
            "placement": {"addresses": welcome["addresses"], "hosts": welcome["hosts"]}}
    if not plan.get("threads") and os.environ.get("SLURM_CPUS_ON_NODE", "").isdigit():
        # The CPUs Slurm allocated on this node, shared by its ranks.
        plan["threads"] = max(1, int(os.environ["SLURM_CPUS_ON_NODE"]) // identity.local_world)
    # sextant runs its own rendezvous on rank 0's reported port; under torchrun, torch would
    # otherwise expect the agent's store there and no rank would host one.
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    os.environ.update({
        "MASTER_ADDR": welcome["addresses"][0], "MASTER_PORT": str(welcome["ports"][0]),
        "RANK": str(identity.rank), "WORLD_SIZE": str(identity.world),
        "LOCAL_RANK": str(identity.local_rank), "LOCAL_WORLD_SIZE": str(identity.local_world),
    })
    ctx = context_from_plan(plan, dict(os.environ))
    ctx.channel = channel
    return plan, ctx


def run_joined_rank(identity: Identity, collector_address: str, timeout_s: float,
                    secret: bytes) -> int:
    """Train one rank that reports to a collector elsewhere; returns the exit code."""
    from sextant.launch.worker import run_rank

    channel = connect(collector_address, identity.rank, timeout_s, secret)
    try:
        plan, ctx = context_for(channel, identity)
        Path(ctx.run_dir).mkdir(parents=True, exist_ok=True)
        return run_rank(plan, ctx)
    finally:
        channel.close()


def rank0_launcher(identity: Identity, *, bind: str, secret: bytes) -> Launcher:
    """A launcher (see runner.execute) for rank 0 of a torchrun-style start: host the
    collector, train rank 0 in this process, then gather every rank's result."""
    from sextant.backends.base import layout_of
    from sextant.launch.local import base_plan

    def launch(workload: Workload, strategy: Strategy, run_dir: Path, *, timeout_s: float,
               collective_timeout_s: float, on_event: EventHandler | None = None,
               resume_step: int | None = None, **_: Any) -> list[RankResult]:
        layout = layout_of(strategy)
        if len(layout.roles) != identity.world:
            raise UserError(
                f"{strategy.label} needs {len(layout.roles)} processes but the launcher "
                f"started {identity.world} (WORLD_SIZE); start {len(layout.roles)} or change "
                f"--workers")
        plan = base_plan(workload, strategy, run_dir, layout.roles, collective_timeout_s,
                         resume_step)
        collector = Collector(bind, plan, identity.world, secret=secret,
                              port=identity.master_port + COLLECTOR_PORT_OFFSET,
                              join_timeout_s=collective_timeout_s)
        try:
            code = run_joined_rank(identity, collector.address, collective_timeout_s, secret)
            if code != 0:
                raise RunFailed(f"{strategy.label}: rank 0 failed (logs: {run_dir})")
            return gather(collector, layout.primary, label=strategy.label, on_event=on_event,
                          deadline=time.monotonic() + timeout_s)
        finally:
            collector.close()

    return launch


def collector_address(identity: Identity, env: dict[str, str]) -> str | None:
    """Where this rank reports: SEXTANT_COLLECTOR, or rank 0's own collector (None on rank
    0, which hosts it)."""
    if env.get(ENV):
        return env[ENV]
    if identity.rank == 0:
        return None
    return f"{identity.master_addr}:{identity.master_port + COLLECTOR_PORT_OFFSET}"


def resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise UserError(f"cannot resolve MASTER_ADDR {host!r}: {exc}") from exc
