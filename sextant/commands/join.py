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

from sextant.commands.common import add_run_args
from sextant.commands.run import (
    add_strategy_args,
    load_with_steps,
    run_and_show,
    strategy_from_args,
)
from sextant.launch import join


def register(sub: Any) -> None:
    p = sub.add_parser(
        "join", help="be one rank of a run started by torchrun, srun or another launcher",
        description="Be one rank of a run whose processes a cluster launcher started (it sets "
                    "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or Slurm's SLURM_* variables). "
                    "Run the same command on every node, each with the run's secret in "
                    "SEXTANT_COLLECTOR_SECRET (or a file named by "
                    "SEXTANT_COLLECTOR_SECRET_FILE); rank 0 stores the run.")
    add_run_args(p)
    add_strategy_args(p)
    p.set_defaults(func=cmd_join)


def cmd_join(args: argparse.Namespace) -> int:
    identity = join.identity_from_env(dict(os.environ))
    address = join.collector_address(identity, dict(os.environ))
    secret = join.run_secret(dict(os.environ))
    if address is not None:  # a rank that reports elsewhere: train, report, exit
        return join.run_joined_rank(identity, address, args.collective_timeout, secret)
    workload = load_with_steps(args)
    strategy = strategy_from_args(args, default_workers=identity.world)
    start = join.rank0_launcher(identity, bind=join.resolve(identity.master_addr),
                                secret=secret)
    return run_and_show(args, workload, strategy, launcher=start)
