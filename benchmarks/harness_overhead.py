"""How much does sextant's harness add to a hand-written PyTorch training loop?

Method: the same model, optimizer, batches and thread count, each in a fresh process.
  hand:    a plain loop written as a PyTorch user would (fused AdamW, zero_grad(set_to_none),
           no logging), timing each step with perf_counter;
  sextant: `sextant.runner.execute` (launcher, worker, shared timed loop, gradient norm,
           progress events, loss read-back every log_every steps).
The two alternate for --repeats rounds (A B A B ...) so that drifts of a noisy machine hit
both; each round yields the median steady-state step time (after the workload's warm-up
steps). We print the median over rounds of each and their ratio.

    python benchmarks/harness_overhead.py --workload gpt-tiny --repeats 5

The "hand" loop here imports sextant's own model, initial parameters, batches and schedule,
so it measures the loop wrapper only. Whether sextant runs each framework as fast as an
expert would is measured against loops that share no code with sextant:
benchmarks/expert_ratio.py (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hand_loop(workload_name: str, steps: int, threads: int) -> list[float]:
    import torch

    from sextant import data
    from sextant.backends.torch_backend import model as tm
    from sextant.workloads.init import init_params
    from sextant.workloads.schedule import lr_table
    from sextant.sources import resolve_workload

    torch.set_num_threads(threads)
    w = resolve_workload(workload_name).replace(steps=steps)
    net = tm.build(w.model)
    tm.load_canonical(net, init_params(w.model, w.seed))
    module = tm.WithLoss(net)
    opt = torch.optim.AdamW(net.parameters(), lr=w.optimizer.lr, fused=True,
                            betas=(w.optimizer.beta1, w.optimizer.beta2),
                            weight_decay=w.optimizer.weight_decay)
    lrs = lr_table(w.optimizer, steps).tolist()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        x, y = data.global_batch(w, i)
        loss = module(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        for g in opt.param_groups:
            g["lr"] = lrs[i]
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="gpt-tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hand", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    if args.hand:
        print(json.dumps(hand_loop(args.workload, args.steps, threads)))
        return

    from sextant.runner import execute
    from sextant.strategy import Strategy
    from sextant.sources import resolve_workload

    w = resolve_workload(args.workload).replace(steps=args.steps)
    warm = w.measure.warmup_steps
    hand, harness = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            out = subprocess.run(
                [sys.executable, __file__, "--hand", "--workload", args.workload,
                 "--steps", str(args.steps)],
                capture_output=True, text=True, check=True, timeout=600,
                env={**os.environ, "OMP_NUM_THREADS": str(threads)},
            )
            hand.append(statistics.median(json.loads(out.stdout)[warm:]))
            rec = execute(w, Strategy(framework="torch"), runs_dir=Path(tmp))
            harness.append(rec.metrics.step_time_median_s)
            print(f"round {r + 1}: hand {hand[-1] * 1e3:.2f} ms, sextant {harness[-1] * 1e3:.2f} ms",
                  flush=True)
    h, s = statistics.median(hand), statistics.median(harness)
    print(f"{args.workload}, {threads} threads, {args.steps} steps (median after {warm} warm-up), "
          f"{args.repeats} alternating rounds")
    print(f"hand-written loop: {h * 1e3:.2f} ms/step   sextant: {s * 1e3:.2f} ms/step   "
          f"ratio sextant/hand: {s / h:.3f}")


if __name__ == "__main__":
    main()
