"""Is it the process or the step? (issue #20) The expert's torch loop run alone, against the
same loop run in a process that first did what a sextant torch worker does before its first
step: import sextant's worker, harness and torch backend, resolve the workload and build every
step's batch with sextant's data code (kept alive, as the worker keeps its data). Fresh
processes, alternating A B A B, the same OMP_NUM_THREADS, threads and affinity.

    .venv/bin/python benchmarks/inprocess/expert_after_sextant.py [--rounds 8] [--steps 200]

With one argument `--inside ARGS...` it is the B process itself (used by the driver).
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERT = ROOT / "benchmarks" / "expert"
WORKLOAD = EXPERT / "gpt-issue20.toml"


def inside(expert_args: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    import sextant.backends.harness  # noqa: F401
    import sextant.backends.torch_backend.train  # noqa: F401
    import sextant.launch.worker  # noqa: F401
    from sextant.data import local_batch
    from sextant.workload import resolve_workload

    w = resolve_workload(str(WORKLOAD))
    kept = [local_batch(w, i, 0, 1, None) for i in range(w.steps)]  # noqa: F841
    sys.argv = [str(EXPERT / "torch_gpt.py"), *expert_args]
    runpy.run_path(str(EXPERT / "torch_gpt.py"), run_name="__main__")


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from expert_ratio import expert_shape_flags

    flags, _, warm = expert_shape_flags(str(WORKLOAD), a.steps)
    args = ["--threads", str(a.threads), "--mode", "eager", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    env.pop("PYTHONPATH", None)
    runs: dict[str, list[float]] = {"alone": [], "after_sextant": []}
    for r in range(a.rounds):
        for side in runs:
            cmd = ([sys.executable, str(EXPERT / "torch_gpt.py"), *args] if side == "alone"
                   else [sys.executable, __file__, "--inside", *args])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900,
                                 env=env, cwd=EXPERT)
            times = json.loads(out.stdout.strip().splitlines()[-1])["step_times_s"][warm:]
            runs[side].append(statistics.median(times))
        print(f"round {r + 1}: alone {runs['alone'][-1] * 1e3:.2f} ms, after sextant's set-up "
              f"{runs['after_sextant'][-1] * 1e3:.2f} ms, ratio "
              f"{runs['after_sextant'][-1] / runs['alone'][-1]:.3f}", flush=True)
    ratios = [b / x for x, b in zip(runs["alone"], runs["after_sextant"])]
    print(f"per-round ratio after/alone: median {statistics.median(ratios):.3f}, "
          f"min-max {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} rounds")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inside":
        inside(sys.argv[2:])
    else:
        main()
