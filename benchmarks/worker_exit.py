"""How long a Python process takes to end after a framework has done real work: the
interpreter's ordinary teardown against `os._exit` (what sextant's worker does once its
result is written; docs/methodology.md).

    python benchmarks/worker_exit.py [--reps 3]

Each row: a fresh process imports the framework, runs one small step, prints the time and
ends; the parent times from that print to the process's end. Medians over --reps.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CHILD = """
import os, sys, time
fw, fast = sys.argv[1], sys.argv[2] == "1"
if fw == "torch":
    import torch
    m = torch.nn.Linear(100, 100)
    m(torch.ones(3, 100)).sum().backward()
elif fw == "jax":
    import jax, jax.numpy as jnp
    jax.jit(lambda x: x * 2)(jnp.ones(3)).block_until_ready()
else:
    import tensorflow as tf
    tf.function(lambda x: x * 2, jit_compile=True)(tf.ones(3))
print(time.time(), flush=True)
if fast:
    os._exit(0)
"""


def exit_seconds(framework: str, fast: bool) -> float:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, framework, "1" if fast else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    printed = float(proc.stdout.readline())
    proc.wait(timeout=120)
    return time.time() - printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"{'framework':<12}{'teardown s':>12}{'os._exit s':>12}")
    for framework in ("torch", "jax", "tensorflow"):
        ordinary = [exit_seconds(framework, False) for _ in range(args.reps)]
        fast = [exit_seconds(framework, True) for _ in range(args.reps)]
        print(f"{framework:<12}{statistics.median(ordinary):>12.3f}"
              f"{statistics.median(fast):>12.3f}")


if __name__ == "__main__":
    main()
