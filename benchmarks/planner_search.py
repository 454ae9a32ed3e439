"""Benchmark: how many layouts per second the planner evaluates (the figure in docs/planner.md).

    .venv/bin/python benchmarks/planner_search.py [--repeats 5]

Three measurements, each the median of --repeats runs:
1. `rank` alone, as the search calls it (every figure computed, the three the ranking needs
   kept), on a table of real layouts: every valid layout of Llama-2 70B for every device count
   8, 16, ..., 4096 (multiples of 8), repeated to at least 1M rows;
2. the whole search for 4096 devices: enumerate + evaluate + rank;
3. `sextant plan --model llama-70b --gpus 4096 --search` end to end in a fresh process
   (Python start-up and imports included), once per repeat.
Rates are given by wall-clock time and by the process's CPU time: the development machine
has 2 cores shared with other work, and numpy runs this single-threaded, so the CPU-time rate
is the one that does not depend on what else is running.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sextant.planner.catalogue import load_catalogue  # noqa: E402
from sextant.planner.estimate import KNOBS, PlanOptions, evaluate, rank, resolve_hardware  # noqa: E402
from sextant.planner.models import preset  # noqa: E402
from sextant.planner.search import enumerate_layouts, search  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, default=1_000_000, help="minimum table size for (1)")
    args = p.parse_args()

    shape = preset("llama2-70b")
    cost = shape.cost()
    opts = PlanOptions(global_batch=shape.global_batch)
    hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", "ib-ndr", options=opts)

    tables = [enumerate_layouts(cost, n, opts.global_batch) for n in range(8, 4097, 8)]
    table = {k: np.concatenate([t[k] for t in tables]) for k in KNOBS}
    distinct = len(table["dp"])
    reps = -(-args.rows // distinct)
    table = {k: np.tile(v, reps) for k, v in table.items()}
    rows = len(table["dp"])

    evaluate(cost, hw, opts, {k: v[:1000] for k, v in table.items()})  # warm-up
    t_eval, c_eval = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        rank(cost, hw, opts, table)
        t_eval.append(time.perf_counter() - t0)
        c_eval.append(time.process_time() - c0)

    t_search, c_search, count = [], [], 0
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = search(cost, hw, opts, 4096)
        t_search.append(time.perf_counter() - t0)
        c_search.append(time.process_time() - c0)
        count = res.count

    cmd = [
        sys.executable,
        "-m",
        "sextant.cli",
        "plan",
        "--model",
        "llama-70b",
        "--gpus",
        "4096",
        "--accelerator",
        "h100-sxm",
        "--network",
        "ib-ndr",
        "--search",
        "--json",
    ]
    t_cli = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        t_cli.append(time.perf_counter() - t0)

    med_eval, cpu_eval = statistics.median(t_eval), statistics.median(c_eval)
    med_search, cpu_search = statistics.median(t_search), statistics.median(c_search)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load:.1f}, Python {platform.python_version()}, numpy {np.__version__}"
    )
    print(
        f"(1) evaluate: {rows:,} layouts ({distinct:,} distinct, Llama-2 70B, 8..4096 "
        f"devices), median of {args.repeats}: {med_eval:.3f} s wall -> "
        f"{rows / med_eval / 1e6:.2f} M layouts/s; {cpu_eval:.3f} s CPU -> "
        f"{rows / cpu_eval / 1e6:.2f} M layouts/s"
    )
    print(
        f"(2) search for 4096 devices: {count:,} layouts enumerated, evaluated and ranked, "
        f"median {med_search * 1e3:.1f} ms wall ({count / med_search / 1e6:.2f} M layouts/s), "
        f"{cpu_search * 1e3:.1f} ms CPU ({count / cpu_search / 1e6:.2f} M layouts/s)"
    )
    print(
        f"(3) `sextant plan --model llama-70b --gpus 4096 --search` (fresh process, with the "
        f"scaling curve): {statistics.median(t_cli):.2f} s median"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
