"""Argument parsing and the learning-rate schedule shared by the expert loops.

Standard library only: nothing here (or in any expert loop) imports sextant. The schedule is
written from its definition (linear warm-up (k+1)/W, then a cosine from 1 down to
min_lr_ratio at the last update), as nanoGPT's get_lr is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


def parse(description: str, modes: tuple[str, ...] = ()) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--lr-warmup", type=int, default=5)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--workers", type=int, default=1, help="data-parallel processes (torch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where the loop trains (gpu: the first visible GPU)")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="fp32",
                   help="fp32 (true fp32 matmuls), tf32, or bf16 mixed precision (fp32 "
                        "master weights, bf16 matmuls, norms and loss in fp32)")
    p.add_argument("--clip", type=float, default=1.0,
                   help="clip the gradients' global norm to this (0: no clipping); real "
                        "training loops clip, and computing the norm is part of their step")
    p.add_argument("--inputs", default=None,
                   help="an .npz of initial weights (torch names, (out, in)) and batches "
                   "(x, y: (steps, batch, seq)) to train on instead of the loop's own; the "
                   "file is data only (torch loop)")
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="glibc keeps freed memory instead of returning it to the kernel "
                   "(mmap threshold 32 MiB, trim threshold 2 GiB), as jemalloc or TCMalloc "
                   "would: the allocator setting sextant's workers use, for a like-for-like "
                   "comparison")
    if modes:
        p.add_argument("--mode", choices=modes, default=modes[0])
    a = p.parse_args()
    if a.keep_freed_memory:
        keep_freed_memory()
    return a


def keep_freed_memory() -> None:
    """mallopt(M_MMAP_THRESHOLD, 32 MiB) and mallopt(M_TRIM_THRESHOLD, INT_MAX): buffers up
    to 32 MiB come from the heap, and freed memory stays there (glibc's mallopt(3))."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    if libc.mallopt(-3, 32 << 20) != 1 or libc.mallopt(-1, 2**31 - 1) != 1:
        raise SystemExit("--keep-freed-memory: mallopt refused the thresholds")


def lr_at(a: argparse.Namespace, k: int) -> float:
    if k < a.lr_warmup:
        return a.lr * (k + 1) / a.lr_warmup
    decay = max(1, a.steps - a.lr_warmup - 1)
    progress = min(1.0, (k - a.lr_warmup) / decay)
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def report(a: argparse.Namespace, framework: str, params: int, times: list[float],
           losses: list[float], **extra: object) -> None:
    json.dump({"framework": framework, "params": params, "threads": a.threads,
               "step_times_s": times, "losses": losses, **extra}, sys.stdout)
    print()
