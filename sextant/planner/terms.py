"""The step's terms: small pure functions of one LayoutContext (the layouts, the job, the
parameters each device holds, the links each group uses), each returning its arrays.
estimate.py folds them into an Evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from sextant.planner import comms, efficiency, memory
from sextant.planner.context import LayoutContext, Links
from sextant.planner.hardware import head_flops_per_token, kernel_seconds, per_device_peak
from sextant.planner.models import ModelCost

SELECTIVE_HFU_EXTRA = 2.0
"""Selective recomputation in HFU: Korthikanti et al.'s Eq. 8 counts 12 L s h FLOPs a token
over Eq. 7 (s/3h against s/6h), 3 x the 4 L s h of the forward re-run that their text names
and that the step's time pays; HFU adds the other 2 x."""
HOST_OP_SECONDS = 2e-6
"""Host time of one PyTorch call on a tensor ("on the order of 2 us" from Python, PyTorch's
benchmarks/overrides_benchmark/README.md; a call from C++ that launches a copy is counted at
the same figure). What zero3_gather 'tensor' pays per rank of the sharding group for each
collective, built from and into lists of one slice per rank."""
GATHER_LIST_OPS = 2.0
"""Calls per rank of one per-tensor all-gather: DeepSpeed v0.3.13 `_allgather_param`'s
`flat_tensor.narrow` (Python), then ProcessGroupNCCL::allgather's copy of the flat result
into each rank's output tensor (`outputTensors[i][j].copy_(outputFlattened[i][j])`)."""
SCATTER_LIST_OPS = 3.0
"""The same for one per-tensor reduce-scatter: `_reduce_scatter_gradient`'s
`param.grad.view(-1).narrow` (two Python calls), then ProcessGroupNCCL::reduce_scatter's copy
of each rank's input into its flat buffer (flatten_for_scatter_gather)."""
PERSISTENT_LIST_OPS = 4.0
"""Calls per rank and persistent tensor of the once-per-step gather of the small tensors
(`_allgather_params`: `narrow`, `view`, `narrow`, `copy_` into each tensor's rank slice)."""
PERSISTENCE_THRESHOLD = 1e5
"""Tensors of fewer elements stay gathered between steps (DeepSpeed's
stage3_param_persistence_threshold default, zero/constants.py at v0.3.13)."""
MAX_REUSE_DISTANCE = 1e9
"""DeepSpeed's stage3_max_reuse_distance default (zero/constants.py at v0.3.13): a gathered
tensor is released after its module runs unless the parameters used before its next use
(its reuse distance, counted over the recorded module trace) are fewer elements."""


def gathered_again(weights, max_distance: float | None = None) -> np.ndarray:
    """Which of a recomputed layer's weights (elements, in forward order) DeepSpeed's ZeRO-3
    gathers again for their backward: those whose reuse distance, 2 x the elements of the
    weights after them (their recomputed forward, then their backward), is not under
    `max_distance` (stage3_max_reuse_distance; MAX_REUSE_DISTANCE by default)."""
    limit = MAX_REUSE_DISTANCE if max_distance is None else max_distance
    w = np.asarray(weights, dtype=np.float64)
    later = np.cumsum(w[::-1])[::-1] - w
    return 2.0 * later >= limit


def _per_tensor_zero3(cost: ModelCost, lps, grad_bytes, param_bytes, group, ranks):
    """ZeRO-3 issued one collective per parameter tensor, as DeepSpeed did before its
    coalesced gathers (v0.5.5; v0.3.13 partition_parameters.py and stage3.py). Returns the
    time of one reduce-scatter pass and of one all-gather pass over the layers of a stage,
    of the gathers a recomputed forward adds, and of what is paid once per step, each with
    its host work.

    * Tensors of fewer than PERSISTENCE_THRESHOLD elements (biases, norms) persist: gathered
      once per step after the optimizer, in one call (`_allgather_params`), never per pass.
    * Each other tensor is all-gathered on its own every pass (`_allgather_param`), its bytes
      at the ramp's efficiency for its share of the layer.
    * Every tensor's gradient is reduce-scattered on its own (`_reduce_scatter_gradient`):
      the large ones carry the bytes, each small one pays a collective's latency.
    * Each collective is built from lists of one slice per rank (GATHER_LIST_OPS,
      SCATTER_LIST_OPS, PERSISTENT_LIST_OPS calls per rank, HOST_OP_SECONDS each).
    * A recomputed layer (activation checkpointing) runs its forward again inside the
      backward: the module hooks gather each tensor for that forward and release it after
      (post_sub_module_forward_function), then gather it again for its backward, unless its
      reuse distance is under MAX_REUSE_DISTANCE (`_keep_for_later`). After the recomputed
      forward of the layer's i-th weight the modules that run before its backward are the
      later weights, forward and then backward: a distance of 2 x their elements. The last
      weight (distance 0) stays; the others of a wide layer are gathered a third time."""
    sizes = np.asarray(cost.layer_tensors or (1.0,), dtype=np.float64)
    large = sizes >= PERSISTENCE_THRESHOLD
    n_large, n_small = float(large.sum()), float((~large).sum())
    share = float(sizes[large].sum() / sizes.sum())
    weights = sizes[large]  # layer_tensors lists the weights in forward order, then the rest
    again = gathered_again(weights)
    n_again, share_again = float(again.sum()), float(weights[again].sum() / sizes.sum())
    s_in, s_out, intra, inter = group
    host = ranks * HOST_OP_SECONDS
    ag = 0.0
    ag_again = 0.0
    rs = lps * n_small * comms.hier_reduce_scatter(
        grad_bytes * (1.0 - share) / np.maximum(n_small * lps, 1.0), s_in, s_out, intra, inter
    )
    if n_large:
        units = lps * n_large
        ag = units * (
            comms.hier_all_gather(param_bytes * share / units, s_in, s_out, intra, inter)
            + GATHER_LIST_OPS * host
        )
        rs = rs + units * comms.hier_reduce_scatter(
            grad_bytes * share / units, s_in, s_out, intra, inter
        )
    if n_again:
        units = lps * n_again
        ag_again = units * (
            comms.hier_all_gather(param_bytes * share_again / units, s_in, s_out, intra, inter)
            + GATHER_LIST_OPS * host
        )
    rs = rs + lps * (n_large + n_small) * SCATTER_LIST_OPS * host
    once = 0.0
    if n_small:
        once = comms.hier_all_gather(param_bytes * (1.0 - share), s_in, s_out, intra, inter) + (
            GATHER_LIST_OPS + lps * n_small * PERSISTENT_LIST_OPS
        ) * host
    return rs, ag, ag_again, once


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    memory: np.ndarray
    capacity: np.ndarray
    fits: np.ndarray
    raw: np.ndarray
    psi_worst: np.ndarray
    coef: dict[str, np.ndarray]
    gather: np.ndarray
    buckets: np.ndarray
    """DDP's gradient bucket copies (memory.buffer_bytes)."""
    activations: np.ndarray
    host_per_node: np.ndarray


def _state_coefficients(c: LayoutContext) -> dict[str, np.ndarray]:
    """Model-state bytes per parameter after ZeRO sharding and offload (memory.py); an MoE
    layer's expert states are sharded over the dp x cp / ep ranks holding the same experts,
    the coefficients averaged over the dense and expert parts."""
    opts, cost = c.opts, c.cost
    def coefficients(ranks: np.ndarray) -> dict[str, np.ndarray]:
        return memory.state_coefficients(ranks, c.zero, precision=opts.precision,
                                         optimizer=opts.optimizer, offload=c.off,
                                         memory_model=opts.stack.memory_model)

    coef = coefficients(c.shard)
    if cost.n_experts:
        coef_e = coefficients(np.maximum(c.shard / c.ep, 1.0))
        psi_e = np.where(c.multi, c.lps, float(cost.n_layers)) * cost.expert_params / (
            c.ep * c.tp)
        share_e = psi_e / np.maximum(c.psi_first, 1.0)
        coef = {k: coef[k] * (1.0 - share_e) + coef_e[k] * share_e for k in coef}
    return _frozen_base(c, coef) if cost.frozen_bytes else coef


def _frozen_base(c: LayoutContext, trained: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LoRA (finetune.py): the trained coefficients scaled to the adapters' share, plus the
    frozen base's weights in its own dtype, sharded at rest where the stack shards
    parameters (memory.state_coefficients' rule) and in host memory with offload=params."""
    share, mm = c.cost.trainable_share, c.opts.stack.memory_model
    at_rest = memory.state_coefficients(c.shard, c.zero, precision=c.opts.precision,
                                        optimizer=c.opts.optimizer, memory_model=mm)["params"]
    whole = memory.state_coefficients(1, 0, precision=c.opts.precision,
                                      optimizer=c.opts.optimizer, memory_model=mm)["params"]
    frozen = c.cost.frozen_bytes * at_rest / whole
    return {
        "params": share * trained["params"] + np.where(c.off >= 2, 0.0, frozen),
        "grads": share * trained["grads"],
        "optimizer": share * trained["optimizer"],
        "host": share * trained["host"] + np.where(c.off >= 2, frozen, 0.0),
    }


def _activations(c: LayoutContext) -> tuple[np.ndarray, np.ndarray]:
    """Activation bytes on the first and last stage (memory.py: Korthikanti et al. 2022
    Table 2, the 1F1B in-flight count), the loss's logits on the last."""
    cost, opts, tp = c.cost, c.opts, c.tp
    act_scale = c.act_bytes / 2.0
    per_layer = memory.activation_bytes_per_layer(
        cost, c.tok_dev, tp, c.sp, c.rc, act_scale, fp8_inputs=opts.fp8
    )
    full = memory.activation_bytes_per_layer(cost, c.tok_dev, tp, c.sp, 0, act_scale)
    working = ((c.rc == 2) | (c.rc == 4)) * full  # the layer being recomputed
    logits = c.tok_dev * cost.logits_bytes_per_token / tp * memory.loss_bytes_factor(
        opts.stack.memory_model, opts.precision, tp
    )
    inflight = memory.pipeline_inflight(c.pp, c.m, c.v)
    act_first = per_layer * c.lps * inflight + working + np.where(c.multi, 0.0, logits)
    act_last = np.where(c.multi, per_layer * c.lps + working + logits, act_first)
    return act_first, act_last


def _root_units(c: LayoutContext) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2's root unit (embedding, final norm, output projection), whole at the backward's
    start: the first stage holds the embedding, the last the rest, one stage all of it."""
    cost, tp = c.cost, c.tp
    kw = {"precision": c.opts.precision, "memory_model": c.opts.stack.memory_model}
    root_all = (cost.embed_params + cost.head_params + cost.other_params) / tp
    first = memory.root_unit_bytes(
        np.where(c.multi, cost.embed_params / tp, root_all), c.zero, **kw
    )
    last = memory.root_unit_bytes(
        np.where(c.multi, (cost.head_params + cost.other_params) / tp, root_all), c.zero, **kw
    )
    return first, last


def memory_term(c: LayoutContext) -> MemoryTerm:
    """Bytes per device on the fuller of the first and last pipeline stage."""
    opts, cost, acc, mm = c.opts, c.cost, c.hw.accelerator, c.opts.stack.memory_model
    coef = _state_coefficients(c)
    c_states = coef["params"] + coef["grads"] + coef["optimizer"]
    # Parameters gathered whole for compute (ZeRO-3 / FSDP units) and DDP bucket copies.
    gather = memory.transient_param_bytes(
        c.layer_local / c.tp, c.lps, c.zero, precision=opts.precision, memory_model=mm,
        largest_module_params=cost.largest_module_params / c.tp,
    )
    act_first, act_last = _activations(c)
    root_first, root_last = _root_units(c)
    # Gradient buckets hold the trained parameters' gradients only (LoRA: the adapters'), and
    # exist where gradients are reduced: over dp x cp.
    share = cost.trainable_share
    buffers = partial(memory.buffer_bytes, zero=c.zero, dp=c.dp * c.cp, memory_model=mm)
    buckets_first, buckets_last = buffers(share * c.psi_first), buffers(share * c.psi_last)
    raw_first = c.psi_first * c_states + gather + root_first + buckets_first + act_first
    raw_last = c.psi_last * c_states + gather + root_last + buckets_last + act_last
    worst_last = raw_last > raw_first
    raw = np.where(worst_last, raw_last, raw_first)
    psi_worst = np.where(worst_last, c.psi_last, c.psi_first)
    mem = raw * (1.0 + opts.fragmentation) + opts.fixed_overhead_gb * 1e9
    g = np.minimum(c.n, c.g)
    capacity = acc.memory_bytes / g if acc.shared_node else np.full_like(c.n, acc.memory_bytes)
    # The host memory a node's ranks ask for: their offloaded bytes and the stack's buffers.
    host_per_node = psi_worst * coef["host"] * c.per_host * opts.stack.host_buffer_factor
    fits = mem <= capacity
    if opts.host_memory_gb is not None:
        fits = fits & (host_per_node <= opts.host_memory_gb * 1e9)
    return MemoryTerm(
        memory=mem, capacity=capacity, fits=fits, raw=raw, psi_worst=psi_worst, coef=coef,
        gather=gather + np.where(worst_last, root_last, root_first),
        buckets=np.where(worst_last, buckets_last, buckets_first),
        activations=np.where(worst_last, act_last, act_first), host_per_node=host_per_node,
    )


@dataclass(frozen=True, slots=True)
class HostLoad:
    per_rank: np.ndarray
    per_node: np.ndarray
    fits: np.ndarray


def host_load_term(c: LayoutContext, offload_per_node: np.ndarray) -> HostLoad:
    """Host RAM while the model is built: a stack that loads the whole model on every rank
    (StackProfile.load 'full') holds its fp32 parameters in host memory per rank before
    moving and sharding them; one that creates each rank's shard on the device holds none.
    With --host-memory-gb, the larger of this and the offloaded states must fit a node."""
    params = float(c.cost.total_params) * np.ones_like(c.n)
    per_rank = 4.0 * params if c.opts.stack.load == "full" else np.zeros_like(c.n)
    per_node = per_rank * c.per_host * c.opts.stack.host_buffer_factor
    ram = c.opts.host_memory_gb
    fits = (
        np.ones_like(c.n, dtype=bool)
        if ram is None
        else np.maximum(per_node, offload_per_node) <= ram * 1e9
    )
    return HostLoad(per_rank=per_rank, per_node=per_node, fits=fits)


@dataclass(frozen=True, slots=True)
class ComputeTerm:
    seconds: np.ndarray
    flops_bound: np.ndarray
    scaled_bound: np.ndarray
    """The part of flops_bound that scales with 1 / kernel efficiency (the GEMMs, and the
    attention core where no kernel rate is published)."""
    memory_ops: np.ndarray
    weights_bound: np.ndarray
    hw_flops_per_token: Any
    peak: Any


def _stage_share(c: LayoutContext, layers_t: Any, head_t: Any) -> Any:
    """The slowest stage's share of the model's time x pp. The last stage holds ceil(L/p)
    layers and the output projection (Narayanan et al. 2021 §2.2: every stage processes
    every micro-batch); with balanced stages (Megatron-Core's uneven first/last stage,
    torchtitan, Llama 3 §3.3.2) it gives up layers so that its layers plus the projection come
    closest to the others'."""
    if c.cost.family != "transformer":
        return 1.0
    L, pp, lps = float(c.cost.n_layers), c.pp, c.lps
    layer_t = layers_t / L
    slowest = lps * layer_t + head_t  # even split: ceil(L/p) layers everywhere
    if c.opts.stack.balanced_stages:
        for k in (lps - 1.0, lps - 2.0):  # layers left on the last stage
            others = np.ceil((L - np.maximum(k, 0.0)) / np.maximum(pp - 1.0, 1.0))
            cand = np.maximum(others * layer_t, np.maximum(k, 0.0) * layer_t + head_t)
            slowest = np.minimum(slowest, cand)
    return np.where(c.multi, slowest * pp / (layers_t + head_t), 1.0)


def _memory_ops(c: LayoutContext, full_act: Any) -> Any:
    """Memory traffic of the GEMM operands and of the elementwise kernels (efficiency.py):
    the part of the compute that depends on width, tokens per micro-batch and TP degree. On
    a shared CPU node (cpu-local) the fitted kernel efficiency already holds all of it."""
    cost, opts, acc = c.cost, c.opts, c.hw.accelerator
    if acc.shared_node or not acc.memory_bw:
        return np.zeros_like(c.n)
    routed = cost.top_k * cost.capacity_factor
    # FP8 GEMMs read 1-byte operands and write 16-bit results; casting their inputs and
    # output gradients to FP8 is traffic of its own (efficiency.fp8_quantize_bytes).
    operands = efficiency.gemm_operand_bytes(
        cost.gemms, c.tok_dev, c.tp, 1.0 if opts.fp8 else c.act_bytes,
        experts=cost.n_experts,
        local_experts=(cost.n_experts / c.ep if cost.n_experts else 1.0), routed=routed,
        output_bytes=c.act_bytes,
    )
    elementwise = efficiency.elementwise_bytes(full_act, c.fwd_rc + (c.rc == 3),
                                               opts.stack.fused_elementwise)
    if opts.fp8:
        elementwise = elementwise + efficiency.fp8_quantize_bytes(
            cost.gemms, c.tok_dev, c.tp, 1.0 + c.gemm_rc, experts=cost.n_experts, routed=routed
        )
    # forward, input gradient, weight gradient (none for a frozen matrix), recompute
    passes = 2.0 + cost.weight_grad_passes + c.gemm_rc
    t = c.m * c.lps * (passes * operands + elementwise) / c.mem_bw
    if opts.fp8:
        # The layers' weights are cast once per step (at the first micro-batch, then kept).
        layer_dev = c.lps * c.layer_local / c.tp
        t = t + layer_dev * efficiency.FP8_QUANTIZE_BYTES / c.mem_bw
    return t


def compute_term(c: LayoutContext) -> ComputeTerm:
    """GEMM and attention FLOPs at the kernel efficiency over the slowest stage, plus their
    memory traffic; or the weights' reads (roofline), whichever is longer."""
    cost, opts, acc = c.cost, c.opts, c.hw.accelerator
    sel = c.rc == 1
    flash_or_sel = np.where(
        sel, cost.selective_recompute_flops_per_token, cost.flash_recompute_flops_per_token
    )
    extra = (c.fwd_rc * cost.full_recompute_flops_per_token + flash_or_sel
             + (c.rc == 3) * cost.op_recompute_flops_per_token)
    hw_flops_tok = cost.model_flops_per_token + extra + cost.padding_flops_per_token
    peak: Any
    if acc.shared_node:
        peak = per_device_peak(acc, opts.precision, np.minimum(c.n, c.g))
    else:
        peak = acc.peak(opts.precision)
    head_tok = head_flops_per_token(cost)
    # The attention core (with its recomputation) runs in its own kernel, at its rate.
    attn_tok = cost.attention_flops_per_token * (1.0 + c.fwd_rc / 3.0) + flash_or_sel
    gemm_t, head_t, attn_t = kernel_seconds(hw_flops_tok - head_tok - attn_tok, head_tok,
                                            attn_tok, peak, acc, opts)
    share = _stage_share(c, gemm_t + attn_t, head_t)
    t_gemm = c.tokens_step * share * (gemm_t + head_t) / c.n
    t_attn = c.tokens_step * share * attn_t / c.n
    t_flops = t_gemm + t_attn
    # Roofline (Williams et al. 2009): every micro-batch reads the device's weights forward
    # and twice backward (once for a frozen matrix; +1 forward with full recomputation).
    pb = cost.frozen_bytes or memory.state_bytes(opts.precision, opts.optimizer,
                                                 opts.stack.memory_model)[0]
    reads = 2.0 + cost.weight_grad_passes + c.gemm_rc
    t_weights = (c.m * reads) * c.psi_stage * (pb / c.mem_bw)
    full_act = memory.activation_bytes_per_layer(
        cost, c.tok_dev, c.tp, c.sp, 0, c.act_bytes / 2.0
    )
    t_memops = _memory_ops(c, full_act)
    return ComputeTerm(
        seconds=np.maximum(t_flops + t_memops, t_weights), flops_bound=t_flops,
        scaled_bound=t_gemm if c.attention is not None else t_flops, memory_ops=t_memops,
        weights_bound=t_weights, peak=peak,
        # Hardware FLOPs as Korthikanti et al. 2022 count selective recomputation (Eq. 8:
        # 72 B L s h^2 (1 + s/3h + v/12hL), its Table 5's HFU): the attention core's forward
        # and backward again, 3 x the forward that the step's time pays (their text's
        # "additional forward pass").
        hw_flops_per_token=hw_flops_tok + (c.rc == 1) * SELECTIVE_HFU_EXTRA
        * cost.selective_recompute_flops_per_token,
    )


def optimizer_term(c: LayoutContext) -> np.ndarray:
    """The optimizer step on the local shard: memory-bound, ~2 (param + optimizer) + grad
    bytes; with offload, over PCIe and host memory (ZeRO-Offload), and with parameters
    offloaded (ZeRO-Infinity) their fetch every micro-batch."""
    opts, hw = c.opts, c.hw
    pb, gb, ob = memory.state_bytes(opts.precision, opts.optimizer, opts.stack.memory_model)
    inv_dp = 1.0 / c.shard
    # Only the trained parameters are updated (LoRA: the adapters).
    psi_opt = c.cost.trainable_share * c.psi_stage * np.where(c.zero >= 1, inv_dp, 1.0)
    opt_traffic = psi_opt * (2.0 * (pb + ob) + gb)
    pcie = hw.host.bandwidth if hw.host is not None else np.inf
    t_offload = (
        psi_opt * ((gb + pb) / pcie)
        + opt_traffic / (opts.host_bw_gbs * 1e9)
        + (c.off >= 2) * (c.m * 2.0 * pb / pcie) * c.psi_stage * inv_dp
    )
    return np.where(c.off >= 1, t_offload, opt_traffic / c.mem_bw)


def tp_term(c: LayoutContext, lk: Links) -> np.ndarray:
    """Tensor parallelism: per layer and micro-batch 4 all-reduces of tokens x h (2 more per
    recomputed forward); with a transformer, the vocabulary-parallel embedding and output
    layer (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy; Shoeybi
    et al. 2019 §3): one all-reduce of tokens x h each per micro-batch (the embedding on the
    first stage, the output layer on the last; both with one stage) and three all-reduces of
    one fp32 value per token for the cross-entropy over the split logits. Neither layer is
    recomputed."""
    cost, opts, m = c.cost, c.opts, c.m
    tp_multi = c.tp > 1
    ar_tp = np.where(
        tp_multi,
        comms.hier_all_reduce(c.tok_dev * (cost.hidden * c.act_bytes), c.tp_in, c.tp_out,
                              lk.tp, lk.inter),
        0.0,
    )
    t_tp = (m * c.lps * (4.0 + 2.0 * c.fwd_rc) * (1.0 - opts.tp_overlap)) * ar_tp
    if cost.family != "transformer":
        return t_tp
    ar_ce = np.where(
        tp_multi,
        comms.hier_all_reduce(c.tok_dev * 4.0, c.tp_in, c.tp_out, lk.tp, lk.inter),
        0.0,
    )
    vocab_ars = np.where(c.pp > 1, 1.0, 2.0)
    return t_tp + m * (vocab_ars * ar_tp + 3.0 * ar_ce) * (1.0 - opts.tp_overlap)


def pp_term(c: LayoutContext, lk: Links) -> np.ndarray:
    """Pipeline sends: one activation and one gradient per micro-batch and model chunk, over
    the network when the pipeline spans nodes."""
    msg = c.tok_dev * (c.cost.hidden * c.act_bytes) / c.tp
    send = np.where(c.n > c.g, comms.p2p(msg, *lk.inter_p2p), comms.p2p(msg, *lk.intra_p2p))
    return c.multi * (2.0 * c.m * c.v * send)


def cp_term(c: LayoutContext, lk: Links, peak: Any) -> np.ndarray:
    """Context parallelism (ring attention, Liu et al. 2023; Megatron-Core CP): per layer and
    micro-batch the K and V blocks go round the cp ranks forward, again backward with dK and
    dV: 3 passes (+1 with full recomputation) of (cp - 1) steps, hidden behind the attention
    core as far as it lasts; with all-gather CP only the local block's share (1 / cp) of the
    attention can compute during the gather."""
    cost, opts, cp = c.cost, c.opts, c.cp
    if not np.any(cp > 1):
        return np.zeros_like(c.n)
    # A rank circulates the K/V of its own tensor-parallel share of the heads: the
    # n_kv_heads split over tp, or one head (replicated) when tp exceeds n_kv_heads.
    kv_heads_rank = cost.n_kv_heads / np.minimum(c.tp, cost.n_kv_heads)
    kv_block = c.tok_dev * (2.0 * kv_heads_rank * cost.hidden / cost.n_heads) * c.act_bytes
    crosses = cp > c.cp_in
    cp_bw = np.where(
        crosses,
        lk.inter[0] * comms.ramp_efficiency(lk.inter[3], kv_block),
        lk.cp[0] * comms.ramp_efficiency(lk.cp[3], kv_block),
    )
    ring_pass = (cp - 1.0) * (kv_block / cp_bw + np.where(crosses, lk.inter[1], lk.cp[1]))
    t_all = c.m * c.lps * (3.0 + c.fwd_rc) * ring_pass
    attn_core_tok = cost.attention_flops_per_token * (1.0 + c.fwd_rc / 3.0)
    t_attention = c.tokens_step * efficiency.attention_seconds(
        attn_core_tok, peak, c.attention, opts.compute_efficiency) / c.n
    hidden = t_attention / cp if opts.stack.cp_method == "allgather" else t_attention
    return np.where(cp > 1, np.maximum(t_all - hidden, 0.0), 0.0)


def ep_term(c: LayoutContext, lk: Links) -> np.ndarray:
    """Expert parallelism: per MoE layer and micro-batch, dispatch and combine all-to-alls
    forward and backward (4; 6 with full recomputation) of the routed tokens, padded to the
    capacity (Lepikhin et al. 2020, GShard §2.2), inside the node while the ep ranks fit."""
    cost, ep = c.cost, c.ep
    if not cost.n_experts:
        return np.zeros_like(c.n)
    routed = c.tok_dev * cost.top_k * cost.capacity_factor * cost.hidden * c.act_bytes
    routed = routed / np.where(c.sp, c.tp, 1.0)
    crosses = ep > np.minimum(ep, c.dp_in)
    chunk = routed / ep  # to every peer, at the ramp's efficiency for that size
    a2a_bw = np.where(
        crosses,
        lk.inter[0] * comms.ramp_efficiency(lk.inter[3], chunk),
        lk.ep[0] * comms.ramp_efficiency(lk.ep[3], chunk),
    )
    a2a_lat = np.where(crosses, lk.inter[1], lk.ep[1])
    a2a = (ep - 1.0) / ep * routed / a2a_bw + (ep - 1.0) * a2a_lat + lk.ep[2]
    return np.where(ep > 1, c.m * c.lps * (4.0 + 2.0 * c.fwd_rc) * a2a, 0.0)


def tp_hidden_term(c: LayoutContext, t_tp: np.ndarray, t_compute: np.ndarray) -> Any:
    """What of the TP collectives a stack with asynchronous collectives hides behind the
    compute (StackProfile.async_collectives); the data-parallel ones then have what is left
    of the compute to hide behind. 0 for a stack whose TP collectives block."""
    return np.minimum(t_tp, t_compute) if c.opts.stack.async_collectives else 0.0


def bubble_term(c: LayoutContext, per_microbatch_work: np.ndarray) -> np.ndarray:
    """The pipeline bubble: (p - 1) / (v m) of the step's work per pipeline."""
    return (c.pp - 1.0) / (c.v * c.m) * per_microbatch_work


@dataclass(frozen=True, slots=True)
class DPTerm:
    seconds: np.ndarray
    hidden: np.ndarray
    exposed: np.ndarray


def _dp_collectives(c: LayoutContext, lk: Links) -> np.ndarray:
    """Seconds of the data-parallel collectives of comms.dp_collectives (one table with the
    measured runs' bytes), each over the rank's gradient or parameter payload."""
    opts, stack = c.opts, c.opts.stack
    grad_wire, param_wire = memory.comm_bytes(opts.precision, stack.memory_model)
    counts = comms.dp_collectives(c.zero, c.m, stack.dp_schedule)
    # Gradients of the trained parameters only (LoRA: the adapters'); ZeRO-3 still gathers
    # every weight, frozen or not, while ZeRO-1/2 gather the updated ones.
    share = c.cost.trainable_share
    grad_b = share * c.psi_stage * grad_wire
    # Gradient buckets: one collective per bucket, each at the bandwidth of its own size.
    bucket = comms.dp_bucket_bytes(stack.memory_model, stack.dp_bucket_bytes, grad_wire)
    buckets = np.maximum(np.ceil(grad_b / bucket), 1.0) if bucket else np.ones_like(grad_b)
    ar = buckets * comms.hier_all_reduce(grad_b / buckets, c.dp_in, c.dp_out, lk.dp, lk.inter)
    # ZeRO-3 / FSDP gather and reduce one layer (unit) at a time (ZeRO §5.3; FSDP's
    # fully_shard per block). HSDP: the sharded collectives stay inside the node; each
    # gradient reduction adds an all-reduce of the 1/dp_in shard across the dp_out replicas.
    z3 = c.zero >= 3
    units = np.where(z3, c.lps, buckets)
    s_out = np.where(c.hs, 1.0, c.dp_out)
    group = (c.dp_in, s_out, lk.dp, lk.inter)
    rs = units * comms.hier_reduce_scatter(grad_b / units, *group)
    param_b = c.psi_stage * param_wire * np.where(z3, 1.0, share)
    ag = units * comms.hier_all_gather(param_b / units, *group)
    once: Any = 0.0
    if stack.zero3_gather == "tensor":
        # One collective per parameter tensor instead (_per_tensor_zero3); once a step the
        # persistent tensors' gather, per recomputed forward the tensors gathered again.
        rs_t, ag_t, again_t, once_t = _per_tensor_zero3(
            c.cost, c.lps, grad_b, c.psi_stage * param_wire, group, c.shard
        )
        rs, ag = np.where(z3, rs_t, rs), np.where(z3, ag_t, ag)
        once = np.where(z3, once_t + c.m * c.fwd_rc * again_t, 0.0)
    replicas = (
        np.where(c.hs, comms.all_reduce(grad_b / c.dp_in, c.dp_out, *lk.inter), 0.0)
        if np.any(c.hs) else 0.0
    )
    return (counts["all_reduce"] * ar + counts["reduce_scatter"] * (rs + replicas)
            + counts["all_gather"] * ag + once)


def dp_term(c: LayoutContext, lk: Links, t_compute: np.ndarray) -> DPTerm:
    """Data parallelism, hidden behind the backward as far as `overlap` and the window allow
    (one micro-batch's backward with ZeRO 0-1, every micro-batch's with ZeRO-2, the whole
    compute with ZeRO-3)."""
    t_dp = _dp_collectives(c, lk)
    bwd_mb = (2.0 / 3.0) * t_compute / c.m
    window = np.select([c.zero <= 1, c.zero == 2], [bwd_mb, c.m * bwd_mb], t_compute)
    hidden = np.minimum(c.opts.overlap * t_dp, window)
    return DPTerm(seconds=t_dp, hidden=hidden, exposed=t_dp - hidden)


