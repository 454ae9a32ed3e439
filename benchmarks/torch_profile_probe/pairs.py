"""Alternating pairs of profiled runs (issue #20): a `sextant run` of the issue's GPT in torch
eager and the expert loop, each under this directory's sitecustomize (torch.profiler over
steps 61-100). Per pair: the profiled step's average (ProfilerStep* CPU time avg) and the host
time between operators (ProfilerStep*'s self CPU time per step: Python and dispatch outside
any operator).

    .venv/bin/python benchmarks/torch_profile_probe/pairs.py [--pairs 4]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXPERT = ROOT / "benchmarks" / "expert"
WORKLOAD = EXPERT / "gpt-issue20.toml"
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * UNITS[unit]


def profiled(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(mean profiled step, host time per step outside operators) of the torch process the
    command starts."""
    before = set(Path("/tmp").glob("torchprobe-*.txt"))
    subprocess.run(cmd, check=True, capture_output=True, timeout=900, env=env, cwd=cwd)
    (table,) = set(Path("/tmp").glob("torchprobe-*.txt")) - before
    for line in table.read_text().splitlines():
        if line.strip().startswith("ProfilerStep*"):
            cols = re.split(r"\s{2,}", line.strip())
            # Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, # of Calls
            calls = int(cols[6])
            return seconds(cols[5]), seconds(cols[2]) / calls
    raise SystemExit(f"{table}: no ProfilerStep* row")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=4)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from expert_ratio import expert_shape_flags

    flags, _, _ = expert_shape_flags(str(WORKLOAD), 150)
    threads = str(len(os.sched_getaffinity(0)))
    base = {**os.environ, "OMP_NUM_THREADS": threads, "SEXTANT_TORCH_PROBE": "1"}
    sextant_env = {**base, "PYTHONPATH": f"{HERE}:{ROOT}"}
    expert_env = {**base, "PYTHONPATH": str(HERE)}
    rows: dict[str, list[tuple[float, float]]] = {"sextant": [], "expert": []}
    for i in range(a.pairs):
        with tempfile.TemporaryDirectory() as tmp:
            rows["sextant"].append(profiled(
                [sys.executable, "-c", "from sextant.cli import main; main()", "run",
                 "--workload", str(WORKLOAD), "--framework", "torch", "--mode", "eager",
                 "--steps", "150", "--threads", threads, "--db", f"{tmp}/r.db"],
                sextant_env, Path(tmp)))
        rows["expert"].append(profiled(
            [sys.executable, str(EXPERT / "torch_gpt.py"), "--threads", threads, "--mode",
             "eager", *flags], expert_env, EXPERT))
        (s, sh), (e, eh) = rows["sextant"][-1], rows["expert"][-1]
        print(f"pair {i + 1}: step sextant {s * 1e3:.2f} ms, expert {e * 1e3:.2f} ms "
              f"(ratio {s / e:.3f}); host time outside operators {sh * 1e3:.2f} vs "
              f"{eh * 1e3:.2f} ms", flush=True)
    for name, vals in rows.items():
        print(f"{name}: median step {statistics.median(v[0] for v in vals) * 1e3:.2f} ms, "
              f"host outside operators {statistics.median(v[1] for v in vals) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
