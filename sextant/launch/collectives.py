"""Collective timing between real worker processes: `python -m sextant.launch.collectives`.

All-reduce and all-gather, with one method: gloo over TCP, 3 warm-up calls, a barrier, a
probe call whose duration (broadcast from rank 0) fixes the repetitions for every rank (5 to
50, about 0.25 s per size), median time. The ranks run on one machine (loopback) or across the
hosts of an emulated cluster (`placement`), one rank per host first.

Sizes follow nccl-tests' convention: an all-reduce of `size` bytes reduces a buffer of that
size; an all-gather's size is the gathered total (each of the n ranks contributes size / n).
`sextant.checks.analyse.bandwidths` turns the times into algorithm and bus bandwidth.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from sextant.core.defaults import MEASUREMENT_TIMEOUT_S
from sextant.core.errors import UserError
from sextant.launch.hosts import Placement, private_loopback
from sextant.launch.local import free_port
from sextant.launch.ranks import run_rank_processes
from sextant.measure.collectives import time_collective

OPS = ("allreduce", "allgather")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def measure_collective(op: str, *, world: int = 2, max_bytes: int = 64 * 2**20,
                       min_bytes: int = 1024, timeout: float = MEASUREMENT_TIMEOUT_S,
                       placement: Placement | None = None) -> dict[str, Any]:
    """Median times of `op` for message sizes min_bytes..max_bytes (x4 steps) between `world`
    gloo processes. A failing or hanging rank raises RunFailed naming it."""
    if op not in OPS:
        raise UserError(f"unknown collective {op!r}; allowed: {', '.join(OPS)}")
    if importlib.util.find_spec("torch") is None:
        raise UserError(f"the {op} measurement needs PyTorch: pip install 'sextant[torch]'")
    hosts = (contextlib.nullcontext(placement) if placement is not None
             else private_loopback(world))
    with hosts as where:
        return _measure(op, world, where, min_bytes, max_bytes, timeout)


def _measure(op: str, world: int, placement: Placement, min_bytes: int, max_bytes: int,
             timeout: float) -> dict[str, Any]:
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    env = {**os.environ, **{var: "1" for var in THREAD_VARS}}
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"sextant-{op}-") as tmp:
        out = Path(tmp) / f"{op}.json"
        run_rank_processes(
            lambda rank: ["sextant.launch.collectives", "--op", op, "--rank", str(rank),
                          "--world", str(world), "--addr", placement.master_addr,
                          "--port", str(port), "--sizes", ",".join(map(str, sizes)),
                          "--out", str(out), "--timeout", str(int(timeout))],
            world, timeout=timeout, what=f"{op} worker", env=env, placement=placement)
        data: dict[str, Any] = json.loads(out.read_text())
    data["placement"] = placement.to_dict()
    return data


def _worker(*, op: str, rank: int, world: int, addr: str, port: int, sizes: list[int],
            out: Path, timeout_s: int) -> int:
    """One rank: time `op` at each size against the other ranks; rank 0 writes `out`."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}",
                            rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    medians, p10, p90, reps_used, used_sizes = [], [], [], [], []
    for size in sizes:
        if op == "allreduce":
            x = torch.ones(max(size // 4, 1), dtype=torch.float32)
            used_sizes.append(x.numel() * 4)
            median, low, high, reps = time_collective(lambda x=x: dist.all_reduce(x))
        else:
            chunk = max(size // (4 * world), 1)
            mine = torch.ones(chunk, dtype=torch.float32)
            gathered = [torch.empty(chunk, dtype=torch.float32) for _ in range(world)]
            used_sizes.append(chunk * 4 * world)
            median, low, high, reps = time_collective(
                lambda g=gathered, m=mine: dist.all_gather(g, m))
        medians.append(median)
        p10.append(low)
        p90.append(high)
        reps_used.append(reps)
    dist.barrier()
    if rank == 0:
        out.write_text(json.dumps({
            "op": op, "backend": "gloo", "world_size": world, "address": addr,
            "sizes_bytes": used_sizes, "times_s": medians, "p10_s": p10, "p90_s": p90,
            "reps": reps_used, "torch": torch.__version__,
        }))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    from sextant.launch.hosts import adopt_host

    adopt_host()
    p = argparse.ArgumentParser(prog="python -m sextant.launch.collectives")
    p.add_argument("--op", choices=OPS, default="allgather")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--addr", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sizes", default="1024")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=int, default=int(MEASUREMENT_TIMEOUT_S))
    args = p.parse_args(argv)
    return _worker(op=args.op, rank=args.rank, world=args.world, addr=args.addr,
                   port=args.port, sizes=[int(x) for x in args.sizes.split(",")],
                   out=Path(args.out), timeout_s=args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
