"""`sextant join`: one rank of a run started by the cluster's own launcher (torchrun, srun, a
Kubernetes training operator, an MPI wrapper). See sextant.launch.join and docs/multi-host.md.

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank $NODE_RANK \\
        --master-addr $HEAD --master-port 29500 --no-python \\
        sextant join --framework torch --parallel dp --workers 2
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rich.markup import escape

from sextant.commands.common import (
    RunProgress,
    add_run_args,
    comparison_table,
    console,
    open_store,
    runs_dir,
)
from sextant.commands.run import add_strategy_args, load_with_steps, strategy_from_args
from sextant.errors import RunFailed
from sextant.launch import join
from sextant.runner import execute
from sextant.workload import workload_source


def register(sub: Any) -> None:
    p = sub.add_parser(
        "join", help="be one rank of a run started by torchrun, srun or another launcher",
        description="Be one rank of a run whose processes a cluster launcher started (it sets "
                    "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or Slurm's SLURM_* variables). "
                    "Run the same command on every node; rank 0 stores the run.")
    add_run_args(p)
    add_strategy_args(p)
    p.set_defaults(func=cmd_join)


def cmd_join(args: argparse.Namespace) -> int:
    identity = join.identity_from_env(dict(os.environ))
    address = join.collector_address(identity, dict(os.environ))
    if address is not None:  # a rank that reports elsewhere: train, report, exit
        return join.run_joined_rank(identity, address, args.collective_timeout)
    workload = load_with_steps(args)
    strategy = strategy_from_args(args, default_workers=identity.world)
    start = join.rank0_launcher(identity, bind=join.resolve(identity.master_addr))
    out = console()
    with open_store(args) as store, RunProgress(out, tensorboard=None) as progress:
        progress.start(strategy.label, workload.steps, workload=workload)
        try:
            record = execute(workload, strategy, runs_dir=runs_dir(store), store=store,
                             on_event=progress.on_event, timeout_s=args.timeout,
                             collective_timeout_s=args.collective_timeout, launcher=start,
                             workload_file=workload_source(args.workload))
        except RunFailed as exc:
            progress.finish(strategy.label, None, error=str(exc))
            raise
        progress.finish(strategy.label, record)
    out.print(comparison_table([record], f"{escape(workload.name)}: run {record['id']}"))
    out.print(f"stored as run {record['id']} in {store.path}", markup=False)
    return 0
