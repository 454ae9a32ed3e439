"""How fast the compute of one device runs: an efficiency that depends on the work.

The old model divided every FLOP by one constant fraction of peak (0.5), whatever the width,
sequence length or tensor-parallel degree. Published runs are not like that: Megatron-LM's
Table 1 (Narayanan et al. 2021) climbs from 44% to 52% of peak as the hidden size grows from
2,304 to 25,600, and tensor parallelism over 8 GPUs makes each GEMM 8 times thinner. Three
terms, each a roofline (Williams, Waterman and Patterson 2009) on one kind of work, replace it:

    compute = GEMM FLOPs / (peak x kernel efficiency)          tensor-core work
            + attention FLOPs / 2 / (peak x kernel rate)         the attention kernel
            + GEMM operand bytes / memory bandwidth              each GEMM reads its inputs
                                                                 and writes its output once
            + elementwise bytes / memory bandwidth               norms, activations, softmax,
                                                                 dropout, residuals, rotary

The GEMM operand term for a (tokens x K) by (K x M) product is 2 (tokens K + K M + tokens M)
bytes (16-bit), so thin GEMMs (a small width over a large TP degree, or few tokens per
micro-batch) lose efficiency the way a roofline says. The elementwise term counts the
activation bytes of memory.activation_bytes_per_layer (Korthikanti et al. 2022, Table 2: what
the layer stores for the backward pass, including the attention scores of stacks without
FlashAttention) as the memory traffic of the non-GEMM kernels: ELEMENTWISE_PASSES times per
forward pass (each stored tensor is written by one kernel and read by the next), twice that in
the backward pass, once more per recomputed forward. Its cost per FLOP is proportional to
1 / hidden size, which is why wide models run closer to peak.

The attention core runs in a kernel of its own: its causal half at the published rate of the
kernel the stack runs on that chip generation (attention_kernel, attention_seconds; the rates
are the catalogue's, from the FlashAttention-2 and -3 papers), or, without one, every score at
the GEMM kernel efficiency.

Two constants are not first principles and are stated here with how they were set:
KERNEL_EFFICIENCY, the fraction of dense peak the tensor-core GEMMs sustain in training where
the chip has no published GEMM rate (Accelerator.kernel_efficiency), and ELEMENTWISE_PASSES
(EAGER_ELEMENTWISE_PASSES for eager stacks is set apart, below). They are global (one value
for every model and layout, and every chip without a rate of its own) and were chosen once,
together, from a coarse grid
(0.68 / 0.75 / 0.8 x 1.5 / 2.5 / 3.5) by how many end-to-end rows of the published table in
docs/validation.md land within 10 %; benchmarks/planner_constants.py prints, for each pair,
the share of the tuning split (which alone may choose) and of the held-out split (the
check). No row has a constant of its own.
`--kernel-efficiency` overrides the first; `--mfu` instead asks for the end-to-end model FLOP
utilisation of the plan and solves for the kernel efficiency that gives it (solve_for_mfu).

    MFU = model FLOPs per token x tokens/s / (devices x peak)        (PaLM, Chowdhery et al.
    HFU = (model + recomputed FLOPs) per token x tokens/s / (devices x peak)     2022, app. B)
"""

from __future__ import annotations

import numpy as np

KERNEL_EFFICIENCY = 0.75
"""Fraction of dense peak tensor-core GEMMs reach in training (set as described above)."""
ELEMENTWISE_PASSES = 2.5
"""Bytes of memory traffic per byte of stored activation in one forward pass."""


def gemm_operand_bytes(gemms, tokens, tp, bytes_per_element=2.0, *, experts=0,
                       local_experts=1.0, routed=1.0, output_bytes=None):
    """Bytes a layer's GEMMs read and write in one pass over `tokens` tokens: for each
    (K, M) weight, split by tp along M (column-parallel) or K (row-parallel),
    (tokens K + K M) elements read at `bytes_per_element` and tokens M written at
    `output_bytes` (the same by default; FP8 GEMMs read 1-byte operands and write 16-bit
    results). For an MoE layer (`experts` > 0) the last two GEMMs are the experts':
    `local_experts` weight matrices each, the tokens `routed` times (top_k x capacity
    factor)."""
    out = bytes_per_element if output_bytes is None else output_bytes
    ratio = out / bytes_per_element  # output bytes per operand byte (1 unless FP8)
    total = _zeros(tokens, tp)
    for rows, kk, mm, expert in _split(gemms, tokens, tp, experts, routed):
        weight = kk * mm * local_experts if expert else kk * mm
        total = total + rows * (kk + (mm if ratio == 1.0 else ratio * mm)) + weight
    return total * bytes_per_element


def _zeros(tokens, tp):
    return np.zeros(np.broadcast(np.asarray(tokens), np.asarray(tp)).shape)


def _split(gemms, tokens, tp, experts, routed):
    """Each (K, M) weight of a layer split by tp along M (column-parallel) or K (row-parallel):
    (rows, K, M, is an expert's) with its rows of tokens (`routed` times for the experts'
    last two GEMMs of an MoE layer)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(tp, dtype=np.float64)
    for i, (k, m, column) in enumerate(gemms):
        expert = bool(experts) and i >= len(gemms) - 2
        yield (routed * tokens if expert else tokens), (k if column else k / t), (
            m / t if column else m
        ), expert


FP8_QUANTIZE_BYTES = 6.0
"""Memory traffic per element of a tensor cast to FP8 with current (per-tensor, just-in-time)
scaling, as Transformer Engine's Float8CurrentScalingQuantizer does it
(transformer_engine/pytorch/csrc/quantizer.cpp, quantize_impl): an amax pass reads the
16-bit tensor (2 bytes), the cast pass reads it again (2) and writes its row-wise and its
column-wise (transposed) FP8 copies (1 + 1), the second for the backward GEMM that needs the
tensor transposed."""


def fp8_quantize_bytes(gemms, tokens, tp, forwards=1.0, *, experts=0, routed=1.0):
    """Bytes FP8 current scaling adds per layer and micro-batch: each GEMM's input cast in
    every forward (`forwards`: 1, more with recomputation) and each GEMM's output gradient
    cast in the backward, FP8_QUANTIZE_BYTES per element. The weights are cast once per step
    (kept across micro-batches, `is_first_microbatch`): the estimate adds that apart, once a
    step, not here."""
    total = _zeros(tokens, tp)
    for rows, kk, mm, _ in _split(gemms, tokens, tp, experts, routed):
        total = total + rows * (np.asarray(forwards, dtype=np.float64) * kk + mm)
    return total * FP8_QUANTIZE_BYTES


EAGER_ELEMENTWISE_PASSES = 5.0
"""ELEMENTWISE_PASSES of a stack that runs its elementwise operators eagerly, one kernel each
(PyTorch without torch.compile or fused kernels): every operator reads its inputs from device
memory and writes its output back, where a fused kernel (Transformer Engine's, Apex's, XLA's,
torch.compile's) keeps the intermediates on chip. Set on the tuning split from the one
published pair that differs in this alone: torchtitan's Llama 3.1 8B on 8 and 128 H100 with and
without torch.compile (docs/performance.md at torchtitan 9dec370, Tables 1 and 3: 5,762 ->
6,667 and 5,605 -> 6,514 tokens/s per GPU, 1.157x and 1.162x); with 5.0 the planner's
ratios are 1.153x and 1.151x (benchmarks/planner_constants.py prints them)."""


def elementwise_bytes(stored_activation_bytes, recompute_forwards, fused: bool = True):
    """Memory traffic of the non-GEMM kernels of one layer and micro-batch, all passes:
    ELEMENTWISE_PASSES (EAGER_ELEMENTWISE_PASSES when not `fused`) x stored bytes forward,
    twice that backward, once more per recomputed forward pass."""
    passes = 3.0 + np.asarray(recompute_forwards, dtype=np.float64)
    per_pass = ELEMENTWISE_PASSES if fused else EAGER_ELEMENTWISE_PASSES
    return per_pass * passes * np.asarray(stored_activation_bytes, dtype=np.float64)


CAUSAL_SHARE = 0.5
"""Share of the score blocks a causal flash kernel computes: those on or below the diagonal.
ModelCost.attention_flops_per_token counts all of them (12 L s q, the PaLM / Megatron-LM
convention every published MFU uses); the FlashAttention papers measure their kernels'
FLOP/s over the half they compute ("with causal mask, we divide this number by 2", Dao 2023
§4.1), and every model the planner has is a causal decoder."""


def attention_kernel(rates: dict[str, float], preferred: tuple[str, ...],
                     flash: bool) -> tuple[str, float] | None:
    """The kernel a stack runs on a chip and its rate: the first of the stack's `preferred`
    kernels the chip has a published rate for (catalogue [attention.*]). None: no flash
    kernel (flash False: 2021-era stacks), or none with a rate on this chip; the attention
    core then runs as a full-matrix kernel does, every score computed at the GEMM kernel
    efficiency."""
    if not flash:
        return None
    for kernel in preferred:
        if kernel in rates:
            return kernel, rates[kernel]
    return None


def attention_seconds(flops, peak, kernel: tuple[str, float] | None, gemm_efficiency):
    """Seconds for `flops` of the attention core (forward, backward and its recomputation,
    counted as ModelCost counts them) at `peak` 16-bit FLOP/s: the causal half at the kernel's
    published rate, or, without one, all of it at the GEMM kernel efficiency."""
    flops = np.asarray(flops, dtype=np.float64)
    if kernel is None:
        return flops / (gemm_efficiency * peak)
    return CAUSAL_SHARE * flops / (kernel[1] * peak)


def solve_for_mfu(achieved_mfu: float, target_mfu: float, compute_share: float,
                  efficiency: float) -> float:
    """Kernel efficiency that turns an achieved MFU into the target one, given the share of
    the step that scales with 1 / efficiency (the FLOP term: its part of the compute, the
    bubble that follows it). Step = a / e + b; MFU is proportional to 1 / step."""
    step = 1.0 / achieved_mfu
    scaled = compute_share * step * efficiency  # a
    rest = step - compute_share * step  # b
    want = 1.0 / target_mfu
    if want <= rest:
        return float("inf")
    return scaled / (want - rest)
