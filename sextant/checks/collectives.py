"""All-gather timing between real worker processes: `python -m sextant.checks.collectives`.

The all-reduce side of the interconnect check is `sextant.planner.calibrate.measure_allreduce`
(the planner's calibration); this module adds the all-gather with the same method: gloo over
TCP on 127.0.0.1, 3 warm-up calls, a barrier, a probe call whose duration (broadcast from
rank 0) fixes the repetitions for every rank (5 to 50, about 0.25 s per size), median time.
A message size is the gathered total (nccl-tests' convention): each of the n ranks contributes
size / n bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

from sextant.errors import UserError
from sextant.launch.ranks import run_rank_processes
from sextant.measure.collectives import time_collective


def measure_allgather(max_bytes: int = 64 * 2**20, timeout: float = 120.0,
                      world: int = 2) -> dict[str, Any]:
    """All-gather medians between `world` gloo processes on 127.0.0.1 (like
    calibrate.measure_allreduce: a failing or hanging rank raises RunFailed naming it)."""
    from sextant.planner.calibrate import _child_env, _free_port, message_sizes

    if importlib.util.find_spec("torch") is None:
        raise UserError("the all-gather measurement needs PyTorch: pip install 'sextant[torch]'")
    sizes = message_sizes(max_bytes)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="sextant-allgather-") as tmp:
        out = Path(tmp) / "allgather.json"
        run_rank_processes(
            lambda rank: ["sextant.checks.collectives", "--rank", str(rank), "--world",
                          str(world), "--port", str(port), "--sizes", ",".join(map(str, sizes)),
                          "--out", str(out), "--timeout", str(int(timeout))],
            world, timeout=timeout, what="all-gather worker", env=_child_env(1))
        return json.loads(out.read_text())


def _worker(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=args.timeout))
    sizes = [int(x) for x in args.sizes.split(",")]
    medians, p10, p90, reps_used = [], [], [], []
    for size in sizes:
        chunk = max(size // (4 * args.world), 1)
        mine = torch.ones(chunk, dtype=torch.float32)
        gathered = [torch.empty(chunk, dtype=torch.float32) for _ in range(args.world)]
        median, low, high, reps = time_collective(lambda: dist.all_gather(gathered, mine))
        medians.append(median)
        p10.append(low)
        p90.append(high)
        reps_used.append(reps)
    dist.barrier()
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({
            "backend": "gloo", "world_size": args.world, "address": "127.0.0.1",
            "sizes_bytes": [max(s // (4 * args.world), 1) * 4 * args.world for s in sizes],
            "times_s": medians, "p10_s": p10, "p90_s": p90, "reps": reps_used,
            "torch": torch.__version__,
        }))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sextant.checks.collectives")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sizes", default="1024")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=int, default=120)
    return _worker(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
