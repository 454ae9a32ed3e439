"""Step time under `--launcher ray` against the local launcher, on the same emulated hosts.

    sudo python benchmarks/ray_launcher.py [--configs torch:dp,jax:dp] [--steps 60] [--rounds 3]

Brings up a 2-host emulated cluster with Ray on it (`sextant cluster up --ray`: the head on
host 0, a worker node on host 1, one CPU each), then for every configuration runs the same
workload with the same weights and batches through the local launcher (one rank per host,
`--cluster`) and through Ray (one placement group, one bundle per rank, STRICT_SPREAD),
alternating which goes first in each round so drift hits both alike. Prints, per
configuration, the median over rounds of each run's median step time, their ratio
(Ray / local; the goal is <= 1.05x), and the largest relative difference of the losses and
gradient norms between the two launchers (parity: <= 1e-5). The cluster is removed at the end,
also on failure. `--out FILE` writes the raw figures as JSON.

Needs root, iproute2 and Ray; run it on a quiet machine (other processes on the cores move
every timing here, though not the parity).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sextant.cluster import emulated, ray_lab
from sextant.launch import ray_launcher
from sextant.results.record import RunRecord
from sextant.runner import execute
from sextant.sources import resolve_workload
from sextant.strategy import Strategy

CLUSTER = "rbench"
MODES = {"torch": "eager", "jax": "compiled", "tensorflow": "compiled", "deepspeed": "eager"}


def max_rel_diff(a: RunRecord, b: RunRecord) -> float:
    """The largest relative difference of a's losses and gradient norms from b's."""
    out = 0.0
    for x, y in ((a.losses, b.losses), (a.grad_norms, b.grad_norms)):
        xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        out = max(out, float(np.max(np.abs(xa - ya) / np.abs(ya))))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="torch:dp,jax:dp",
                   help="framework:parallel pairs, comma-separated (default: torch:dp,jax:dp)")
    p.add_argument("--workload", default="gpt-tiny")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write the raw figures as JSON")
    args = p.parse_args()
    workload = resolve_workload(args.workload).replace(steps=args.steps)
    configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    cluster = emulated.up(CLUSTER, 2, emulated.Link(rate_bit_s=10e9))
    figures: dict[str, dict[str, Any]] = {}
    try:
        ray = ray_lab.start(cluster)
        where = ray_launcher.Cluster(address=ray["address"],
                                     prefix=("ip", "netns", "exec", ray["head_netns"]),
                                     node_ip=ray["head_address"], collector_bind=cluster.gateway,
                                     name=cluster.name)
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                for framework, parallel in configs:
                    strategy = Strategy(framework=framework, mode=MODES[framework],
                                        parallel=parallel, workers=2)
                    row = figures.setdefault(strategy.label, {"local": [], "ray": [],
                                                              "parity": []})
                    job = ray_launcher.Job.for_run(strategy, where, workload=args.workload,
                                                   timeout_s=600, collective_timeout_s=120)
                    runs: dict[str, RunRecord] = {}
                    order = ("local", "ray") if rnd % 2 == 0 else ("ray", "local")
                    for launcher in order:
                        runs[launcher] = execute(
                            workload, strategy, runs_dir=Path(tmp) / launcher,
                            cluster=cluster.name, timeout_s=600,
                            launcher=ray_launcher.launcher(job) if launcher == "ray" else None)
                        row[launcher].append(runs[launcher].metrics.step_time_median_s)
                    row["parity"].append(max_rel_diff(runs["ray"], runs["local"]))
    finally:
        emulated.down(CLUSTER)
    print(f"{args.workload}, {args.steps} steps, {args.rounds} rounds, 2 emulated hosts "
          f"(10 Gbit/s links, 1 CPU each)\n")
    print("| run | local ms/step | Ray ms/step | Ray / local | max rel. diff (loss, grad norm) |")
    print("|---|---|---|---|---|")
    for label, row in figures.items():
        local, ray_s = statistics.median(row["local"]), statistics.median(row["ray"])
        row["ratio"] = ray_s / local
        print(f"| {label} | {local * 1e3:.1f} | {ray_s * 1e3:.1f} | {row['ratio']:.3f}x | "
              f"{max(row['parity']):.1e} |")
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
