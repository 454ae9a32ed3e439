"""What a workload costs on this machine before it runs: the step time and the memory of one
process training it in fp32, and the shape `workload from-hf --fit` picks to fit both.

Where `sextant calibrate` has measured this machine, the step time is the planner's
(sextant.planner.local.figures, its default efficiency). Otherwise it is the planner's own
rule of thumb made explicit: training FLOPs per step (6 N per token for the weights that are
multiplied, the embedding lookup left out; 4 N when LoRA freezes them, plus causal attention's 6 L T d per token, PaLM's count) at this CPU's fp32
GEMM rate, measured once per process with numpy, times the planner's default efficiency.
Memory is the weights, the trainable parameters' gradients and AdamW moments, and the
activations a layer keeps for its backward pass (Korthikanti et al. 2022: T d (34 + 5 a T / d)
bytes per sequence in 16 bits, doubled for fp32) plus the logits and their gradient.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from typing import Any

from sextant.core.errors import UserError
from sextant.workloads.spec import MLPSpec, Workload

DEFAULT_EFFICIENCY = 0.5
"""The planner's compute efficiency when nothing was fitted (sextant.planner.local)."""
LONG_RUN_S = 600.0
"""A run predicted to take longer than this says so before it starts."""
MEMORY_SHARE = 0.5
"""The share of this machine's available memory --fit plans to use (the rest: the framework's
own, the OS, whatever else runs)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    step_s: float
    memory_bytes: float
    how: str
    """Where the step time comes from, in a few words."""


@functools.cache
def gemm_flops_per_s() -> float:
    """This CPU's fp32 matrix-multiply rate with numpy (best of a few 512^3 products)."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * 512**3 / max(best, 1e-9)


def available_memory() -> int:
    """Bytes this machine can give a new process now (MemAvailable), else its total."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _counts(workload: Workload) -> tuple[int, int]:
    from sextant.pretrained.weights import trainable_count

    trained, total = trainable_count(workload)
    return trained, total


def memory_bytes(workload: Workload) -> float:
    """One process's fp32 training memory for `workload` (see the module docstring)."""
    model = workload.model
    trained, total = _counts(workload)
    weights = 4.0 * total + 12.0 * trained  # weights; gradients and two AdamW moments
    if isinstance(model, MLPSpec):
        return weights + 4.0 * workload.global_batch * sum(model.hidden) * 2
    b, t, d = workload.global_batch, model.seq_len, model.d_model
    per_layer = 2.0 * b * t * d * (34 + 5 * model.n_heads * t / d)
    logits = 3 * 4.0 * b * t * model.vocab_size
    return weights + model.n_layers * per_layer + logits


def training_flops(workload: Workload) -> float:
    """FLOPs of one optimizer step (see the module docstring)."""
    model = workload.model
    trained, total = _counts(workload)
    tokens = workload.global_batch * workload.tokens_per_sample
    if not isinstance(model, MLPSpec) and not model.tie_embeddings:
        total -= model.vocab_size * model.d_model  # the embedding is looked up, not multiplied
    per_token = 6.0 * total if trained == total else 4.0 * total + 6.0 * trained
    if not isinstance(model, MLPSpec):
        per_token += 6.0 * model.n_layers * model.seq_len * model.d_model
    return per_token * tokens


def _planner_step_s(workload: Workload) -> float | None:
    """The calibrated planner's step time, None where this machine was never calibrated or
    the planner does not model the workload."""
    from sextant.planner.estimate import Layout
    from sextant.planner.local import figures, load_machine
    from sextant.planner.workload_shapes import shape_from_workload

    try:
        cat = load_machine()
        if cat is None or cat.calibration is None:
            return None
        shape = shape_from_workload(workload.to_dict(), where=f"workload {workload.name!r}")
        step = figures(cat, "torch", shape, Layout(dp=1, mbs=workload.global_batch), "fp32",
                       DEFAULT_EFFICIENCY).step
    except (UserError, ValueError, KeyError, OSError):
        return None
    return float(step) if step else None


def estimate(workload: Workload, *, planner: bool = True) -> Estimate:
    """The step time and memory of one process training `workload` on this machine."""
    memory = memory_bytes(workload)
    if planner and not workload.finetune.lora:  # the planner's local figures: full training
        step = _planner_step_s(workload)
        if step is not None:
            return Estimate(step, memory, "the planner, on this machine's calibration")
    step = training_flops(workload) / (gemm_flops_per_s() * DEFAULT_EFFICIENCY)
    return Estimate(step, memory, "training FLOPs at this CPU's measured GEMM rate")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def long_run_check(workload: Workload, device: str, yes: bool, out: Any = None) -> None:
    """Before a run on this machine's CPU: a run predicted to take over LONG_RUN_S says so in
    one line; on a terminal it then needs --yes (a script or CI, with no terminal, goes on)."""
    if device != "cpu" or yes:
        return
    guess = estimate(workload)
    total = guess.step_s * workload.steps
    if total <= LONG_RUN_S:
        return
    line = (f"{workload.name}: {workload.steps} steps predicted to take about "
            f"{_minutes(total)} on this machine ({guess.step_s:.1f} s a step, from "
            f"{guess.how})")
    if sys.stdin.isatty():
        raise UserError(f"{line}; add --yes to start it anyway, or make it smaller "
                        f"(sextant workload from-hf --fit)")
    (out.print if out is not None else print)(f"{line}; starting anyway (no terminal)")


SEQ_LENS = (2048, 1024, 512, 256, 128, 64)
BATCHES = (32, 16, 8, 4, 2, 1)
SCALES = tuple(0.5 ** i for i in range(0, 31))


def fit(make: Any, context: int, *, pretrained: bool, target_step_s: float,
        memory_budget: float) -> tuple[dict[str, Any], Estimate]:
    """The largest model (scale), then the longest sequence, then the largest batch whose
    step fits `target_step_s` and `memory_budget`; sequences of at least 256 tokens (or the
    context) and batches of at least 4 first, then anything. `make(scale, seq_len, batch)`
    builds the candidate workload. A pretrained model keeps its shape (scale 1)."""
    seqs = [s for s in SEQ_LENS if s <= context] or [context]
    scales = (1.0,) if pretrained else SCALES
    for strict in (True, False):
        for scale in scales:
            for seq in seqs:
                if strict and seq < min(256, context):
                    continue
                for batch in BATCHES:
                    if strict and batch < 4:
                        continue
                    workload = make(scale, seq, batch)
                    guess = estimate(workload, planner=False)
                    if guess.memory_bytes <= memory_budget and guess.step_s <= target_step_s:
                        return {"scale": scale, "seq_len": seq, "global_batch": batch}, guess
    smallest = make(scales[-1], seqs[-1], 1)
    guess = estimate(smallest, planner=False)
    raise UserError(f"nothing fits this machine: the smallest candidate (seq_len {seqs[-1]}, "
                    f"batch 1{'' if pretrained else f', scale {scales[-1]:g}'}) needs "
                    f"{guess.memory_bytes / 2**30:.1f} GiB of the {memory_budget / 2**30:.1f} "
                    f"GiB budget and {guess.step_s:.2f} s a step of the {target_step_s:g} s "
                    f"target")
