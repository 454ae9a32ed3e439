"""Python's garbage collections in every process started with this directory first on
PYTHONPATH: one line per collection (generation, seconds, objects collected) appended to
/tmp/gcprobe-<pid>.txt. Used to compare sextant's torch eager worker with the expert loop
(docs/benchmarks.md, issue #20):

    PYTHONPATH=benchmarks/gc_probe:. sextant run --workload benchmarks/expert/gpt-issue20.toml \
        --framework torch --mode eager --steps 200 --threads 2
    PYTHONPATH=benchmarks/gc_probe python benchmarks/expert/torch_gpt.py --mode eager ...
"""

import gc
import os
import time

_log = open(f"/tmp/gcprobe-{os.getpid()}.txt", "w", buffering=1)
_started = [0.0]


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        _log.write(f"{info['generation']} {time.perf_counter() - _started[0]:.6f} "
                   f"{info['collected']}\n")


gc.callbacks.append(_callback)
