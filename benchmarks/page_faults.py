"""Minor page faults a second of sextant's torch worker and of the expert loop, training side
by side (docs/benchmarks.md, "The allocator").

    python benchmarks/page_faults.py [KEY=VALUE ...]

Starts a 600-step `sextant run` of the issue GPT (torch eager, one thread, core 0) and the
expert torch loop with the same shapes (one thread, core 1) at the same time, waits 12 s
(both past start-up), then reads field minflt of /proc/PID/stat of sextant's worker and of
the expert over the same 10 s. KEY=VALUE pairs go into the sextant side's environment only
(e.g. SEXTANT_MALLOC=system, or glibc's MALLOC_TRIM_THRESHOLD_=...). Linux only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from expert_ratio import EXPERT, expert_shape_flags, worker_pids  # noqa: E402


def minflt(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def main() -> None:
    extra = dict(kv.split("=", 1) for kv in sys.argv[1:])
    workload = str(EXPERT / "gpt-issue20.toml")
    shape, steps, _ = expert_shape_flags(workload, 600)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        sx = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, "-c", "from sextant.cli import main; main()",
             "run", "--framework",
             "torch", "--mode", "eager", "--workload", workload, "--steps", str(steps),
             "--threads", "1", "--db", f"{tmp}/r.db"], env={**env, **extra}, cwd=tmp,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ex = subprocess.Popen(
            ["taskset", "-c", "1", sys.executable, str(EXPERT / "torch_gpt.py"), "--threads",
             "1", "--mode", "eager", *shape], env=env, stdout=subprocess.DEVNULL)
        try:
            time.sleep(12)
            worker = worker_pids(sx.pid)[-1]
            a = minflt(worker), minflt(ex.pid)
            time.sleep(10)
            b = minflt(worker), minflt(ex.pid)
            print(f"minor faults/s over 10 s: sextant worker {(b[0] - a[0]) / 10:,.1f}, "
                  f"expert {(b[1] - a[1]) / 10:,.1f}   (sextant env: {extra or 'as is'})")
        finally:
            for p in (sx, ex):
                p.wait(timeout=600)


if __name__ == "__main__":
    main()
