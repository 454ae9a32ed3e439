"""Probe: the peak bytes PyTorch holds per logit in torchtitan's loss, forward and backward.

    .venv/bin/python benchmarks/loss_memory.py [--tokens 1024] [--vocab 8192]

What is measured and how: sextant/measure/loss_memory.py.
"""

from __future__ import annotations

import argparse

from sextant.measure.loss_memory import measure, measure_timeline


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    args = p.parse_args()
    import torch

    print(f"torch {torch.__version__}, {args.tokens} tokens x {args.vocab} vocabulary entries")
    for precision in ("bf16", "fp32"):
        fwd, peak, at = measure(precision, args.tokens, args.vocab)
        print(f"{precision} logits: forward peak {fwd:.1f} bytes per logit, whole peak "
              f"{peak:.1f} (at {at})")
    plain = measure_timeline(False, args.tokens, args.vocab)
    parallel = measure_timeline(True, args.tokens, args.vocab)
    print(f"bf16 logits, profiler memory timeline: plain loss {plain:.1f} bytes per logit, "
          f"under loss_parallel {parallel:.1f} ({parallel - plain:+.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
