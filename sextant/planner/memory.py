"""Memory per device: model states under data parallelism / ZeRO / FSDP, and activations.

Every function takes numbers or numpy arrays (broadcasting), so that the same formula serves
one plan and a million-layout search: the estimator (estimate.py) calls these functions and
has no copy of them.

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", §3.1 and §5): mixed-precision Adam keeps 2 bytes of fp16/bf16 parameters,
2 bytes of gradients and K = 12 bytes of optimizer state (fp32 master copy, momentum and
variance) per parameter: 16 bytes. Plain fp32 Adam keeps 4 + 4 + 8 = 16 bytes as well.
ZeRO stage 1 partitions the optimizer state over the N_d data-parallel ranks, stage 2 also the
gradients, stage 3 also the parameters (FSDP FULL_SHARD is stage 3; SHARD_GRAD_OP is stage 2):

    stage 0 (DDP): (2 + 2 + K) * Psi
    stage 1:       (2 + 2) * Psi + K * Psi / N_d
    stage 2:        2 * Psi + (2 + K) * Psi / N_d
    stage 3:       (2 + 2 + K) * Psi / N_d

That is the memory model "zero" (the default, exact against the paper). What frameworks
allocate differs, and `--memory-model` picks it (profiles.toml [memory_models.*],
loaded into MemoryModel records, each with its source):

    megatron   Megatron-LM distributed optimizer (= stage 1): bf16 parameters 2 and fp32 main
               gradients 4 replicated, fp32 master weights + Adam moments 12 / N_d, i.e. the
               "6 + 12/d" of Megatron-Core's table (18 bytes without the distributed optimizer)
    deepspeed  DeepSpeed's own estimators (estimate_zero2/3_model_states_mem_needs): stages 1-2
               keep fp16 parameters and fp16 gradients whole (4 bytes) plus 16 / N_d (fp32
               master, moments and fp32 gradient partition); stage 3 18 / N_d plus the largest
               layer's fp16 parameters and gradients (4 bytes per parameter of that layer)
    torch      PyTorch DDP / ZeroRedundancyOptimizer / FSDP2 with autocast or a bf16
               MixedPrecisionPolicy: fp32 parameters 4, fp32 gradients 4, Adam moments 8;
               the 16-bit compute copies are transient (FSDP gathers them per unit), and DDP
               keeps a second copy of the gradients in its buckets unless
               gradient_as_bucket_view=True (torch.nn.parallel.DistributedDataParallel docs)

CPU offload (ZeRO-Offload, Ren et al. 2021, §4: "offloads the gradients, optimizer states and
optimizer computation to CPU"): the optimizer state and an fp32 gradient partition live in
host memory, the device keeps its 16-bit parameters; ZeRO-Infinity (offload=params) moves the
parameters too. Host memory per node is the per-device host bytes times the devices per node.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from sextant.core.errors import UserError

# Bytes per parameter: (parameters, gradients, optimizer state).
STATE_BYTES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("mixed", "adam"): (2, 2, 12),  # fp32 master + m + v (ZeRO §3.1, K = 12)
    ("fp32", "adam"): (4, 4, 8),  # m + v
    ("mixed", "sgd"): (2, 2, 8),  # fp32 master + momentum
    ("fp32", "sgd"): (4, 4, 4),  # momentum
}
OPTIMIZERS = ("adam", "sgd")
DATA = Path(__file__).with_name("profiles.toml")


@dataclass(kw_only=True, slots=True, frozen=True)
class MemoryModel:
    """A stack's allocation per parameter, as data (profiles.toml [memory_models.*]): what
    each function below reads instead of branching on the model's name."""

    name: str
    source: str
    bf16: tuple[float, float, float]
    """Mixed precision with bf16: (parameter, gradient, optimizer extra) bytes; the extra is
    added to the optimizer's own state (STATE_BYTES): -4 where the fp32 parameters are the
    master copy, +4 where an fp32 gradient partition is counted with the optimizer."""
    fp16: tuple[float, float, float]
    """The same with fp16."""
    comm_bytes: tuple[float, float]
    """Mixed precision: bytes per parameter of the gradient reduction and of the parameter
    all-gather on the wire (fp32 training moves 4 and 4)."""
    param_shard_stage: int = 3
    """The ZeRO stage from which parameters are sharded at rest (FSDP2 shards them from
    SHARD_GRAD_OP, 2)."""
    grad_shard_stage: int = 2
    """The stage from which the kept gradients are sharded (DeepSpeed's estimators keep the
    16-bit gradients whole in stages 1-2: 3)."""
    grads_beside_stage3: bool = True
    """Whether 16-bit gradients are kept apart at stage 3 (DeepSpeed's estimators: no, the
    fp32 partition is in the optimizer's 16 bytes)."""
    host_grad_partition: bool = True
    """With optimizer offload, an fp32 gradient partition in host memory (ZeRO-Offload);
    DeepSpeed's estimators count it in the optimizer's bytes already."""
    gathered_layers: float = 2.0
    """ZeRO-3 / FSDP: layers gathered whole in the compute dtype (one, and the next
    prefetched)."""
    gathered_largest_module_copies: float = 0.0
    """ZeRO-3: copies (parameters, gradients) of the largest module kept whole in the compute
    dtype (DeepSpeed's estimators: 2)."""
    stage2_keeps_gathered: bool = False
    """SHARD_GRAD_OP (stage 2) keeps every gathered layer from forward to backward (FSDP)."""
    root_unit_gathered: bool = False
    """FSDP2's root unit (embedding, final norm, output projection) gathered whole at
    ZeRO-3 (root_unit_bytes)."""
    loss_factor: float = 1.0
    loss_factor_tp: float = 1.0
    """The loss's peak logits bytes over Korthikanti's fp32 logits, without and with
    tensor parallelism (loss_bytes_factor)."""
    ddp_bucket_copy_bytes: float = 0.0
    """Bytes per gradient element DDP's buckets copy at stages 0-1 (torch's
    gradient_as_bucket_view=False: 4); 0: none."""
    dp_bucket_bytes: float = 0.0
    dp_bucket_elements: float = 0.0
    """The stack's default gradient bucket, in bytes or in elements (comms.dp_bucket_bytes);
    both 0: one call over the whole buffer."""
    dp_schedule: str = "zero"
    """The data-parallel schedule a profile takes when `--memory-model` selects this one."""
    note: str = ""
    """What a plan under this model says about its memory figure (empty: nothing)."""


def _load(path: Path = DATA) -> dict[str, MemoryModel]:
    allowed = {f.name for f in fields(MemoryModel)} - {"name"}
    with path.open("rb") as fh:
        raw = tomllib.load(fh).get("memory_models")
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{path}: expected [memory_models.*] tables")
    out = {}
    for name, table in raw.items():
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise UserError(f"{path} [memory_models.{name}]: unknown keys {unknown}; "
                            f"allowed: {', '.join(sorted(allowed))}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in table.items()}
        out[name] = MemoryModel(name=name, **values)
    return out


MODELS: dict[str, MemoryModel] = _load()
"""Every memory model (profiles.toml), loaded once."""
MEMORY_MODELS = tuple(MODELS)
MEMORY_MODEL_SOURCES = {name: m.source for name, m in MODELS.items()}


def model_of(model: str | MemoryModel) -> MemoryModel:
    """The record of a memory model given by name (`--memory-model`, a profile's field)."""
    if isinstance(model, MemoryModel):
        return model
    if model not in MODELS:
        raise UserError(
            f"unknown memory model {model!r}; allowed: {', '.join(MEMORY_MODELS)}"
        )
    return MODELS[model]


FP32_STORAGE = ("fp32", "tf32")
"""Precisions whose parameters, gradients and activations are fp32 values: TF32 rounds only
the matmuls' inputs, inside the tensor cores."""


def _kind(precision: str) -> str:
    if precision not in ("bf16", "fp16", "tf32", "fp32", "mixed"):
        raise UserError(f"unknown precision {precision!r}; allowed: bf16, fp16, tf32, fp32")
    return "fp32" if precision in FP32_STORAGE else "mixed"


def state_bytes(
    precision: str, optimizer: str = "adam", memory_model: str | MemoryModel = "zero"
) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per parameter; 'bf16' and 'fp16' are mixed precision
    (the model's `bf16` and `fp16` rows; 'mixed' reads as bf16)."""
    kind = _kind(precision)
    if optimizer not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    model = model_of(memory_model)
    pb, gb, ob = STATE_BYTES[(kind, optimizer)]
    if kind == "fp32":
        return (pb, gb, ob)
    p, g, extra = model.fp16 if precision == "fp16" else model.bf16
    return (p, g, ob + extra)


def comm_bytes(precision: str, memory_model: str | MemoryModel = "zero") -> tuple[float, float]:
    """(gradient, parameter) bytes per parameter that the collectives move."""
    if _kind(precision) == "fp32":
        return (4, 4)
    return model_of(memory_model).comm_bytes



def state_coefficients(
    dp=1,
    zero=0,
    *,
    precision: str = "bf16",
    optimizer: str = "adam",
    offload=0,
    memory_model: str | MemoryModel = "zero",
) -> dict[str, np.ndarray]:
    """Per-parameter bytes of each model-state component on one device (and in host memory),
    after ZeRO sharding over `dp` ranks and offload. Multiply by the parameters the device
    holds before data-parallel sharding to get bytes (model_state_bytes)."""
    model = model_of(memory_model)
    pb, gb, ob = state_bytes(precision, optimizer, model)
    dp = np.asarray(dp, dtype=np.float64)
    zero = np.asarray(zero)
    offload = np.asarray(offload)
    inv = 1.0 / dp
    shard_p = zero >= model.param_shard_stage
    shard_g = zero >= model.grad_shard_stage
    # The fp32 gradient partition CPU Adam steps on, where the model keeps it apart.
    host_grads = (4.0 * np.where(zero >= 1, inv, 1.0) if model.host_grad_partition
                  else 0.0)
    if not model.grads_beside_stage3:
        gb = np.where(zero >= 3, 0.0, gb)
    p = pb * np.where(shard_p, inv, 1.0)
    g = gb * np.where(shard_g, inv, 1.0)
    o = ob * np.where(zero >= 1, inv, 1.0)
    host = np.where(offload >= 1, o + host_grads, 0.0) + np.where(offload >= 2, p, 0.0)
    o_dev = np.where(offload >= 1, 0.0, o)
    g_dev = np.where(offload >= 1, 0.0, g)  # gradients stream to the host in buckets
    p_dev = np.where(offload >= 2, 0.0, p)
    return {"params": p_dev, "grads": g_dev, "optimizer": o_dev, "host": host}


def model_state_bytes(
    params,
    dp=1,
    zero=0,
    *,
    precision: str = "bf16",
    optimizer: str = "adam",
    offload=0,
    memory_model: str | MemoryModel = "zero",
) -> dict[str, np.ndarray]:
    """Per-device bytes of parameters, gradients and optimizer state (ZeRO §5).

    `params` is the parameter count this device holds before data-parallel sharding (the
    whole model, or its tensor/pipeline shard). `offload` 1 moves the optimizer state and the
    gradient partition to host memory (ZeRO-Offload, Ren et al. 2021), 2 the parameters as
    well (ZeRO-Infinity, Rajbhandari et al. 2021). Returns device bytes per component plus
    `host`.
    """
    psi = np.asarray(params, dtype=np.float64)
    c = state_coefficients(
        dp, zero, precision=precision, optimizer=optimizer, offload=offload,
        memory_model=memory_model,
    )
    out = {k: psi * v for k, v in c.items()}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def root_unit_bytes(root_params, zero, *, precision: str = "bf16",
                    memory_model: str | MemoryModel = "zero"):
    """FSDP2's root unit, unsharded ("torch" model, ZeRO-3): torchtitan wraps each block in
    its own `fully_shard` and the rest (embedding, final norm, output projection) in the
    root's, whose parameters are gathered whole in the compute dtype when the backward starts,
    the moment the loss's logits peak (torch's `fully_shard`: "we usually set False for the
    root module, because the root module is typically required immediately when the backward
    pass begins"). Per stage: the root parameters that stage holds, over tp."""
    if not model_of(memory_model).root_unit_gathered:
        return np.zeros_like(np.asarray(zero, dtype=np.float64))
    compute = 4.0 if _kind(precision) == "fp32" else 2.0
    return np.where(np.asarray(zero) >= 3, compute * np.asarray(root_params, np.float64), 0.0)


def loss_bytes_factor(memory_model: str | MemoryModel = "zero", precision: str = "bf16", tp=1):
    """The loss's peak logits bytes over Korthikanti's fp32 logits (4 s b V, §4.3).

    "torch": PyTorch's cross-entropy as torchtitan calls it
    (`cross_entropy(pred.flatten(0, 1).float(), labels)`, then `del pred` and the backward:
    train.py at torchtitan 9dec370). Its forward holds the 16-bit logits, their fp32 copy and
    the fp32 log-softmax it saves at once (2 + 4 + 4 bytes a logit; 4 + 4 for fp32 logits);
    its backward more: the saved log-softmax, nll_loss's dense fp32 gradient and
    _log_softmax_backward_data's fp32 result, 4 + 4 + 4 = 12 bytes a logit in either
    precision, 3 times Korthikanti's. With tensor parallelism (tp > 1) torchtitan runs the
    loss inside PyTorch's loss_parallel() (on by default: get_train_context, torchtitan/utils.py
    at 9dec370), whose backward (torch/distributed/tensor/parallel/loss.py,
    `_nll_loss_and_log_softmax_backward`: `(grad_input + torch.exp(x)) * grad_output`) holds
    the saved log-softmax, the zeroed gradient, the sum and the product: 16 bytes a logit of
    its vocabulary shard, 4 times Korthikanti's. Both measured: benchmarks/loss_memory.py.
    Fused losses (Megatron's vocab-parallel cross-entropy, the others): 1."""
    model = model_of(memory_model)
    if np.ndim(tp) == 0:
        return model.loss_factor_tp if tp > 1 else model.loss_factor
    return np.where(np.asarray(tp) > 1, model.loss_factor_tp, model.loss_factor)


def transient_param_bytes(
    layer_params,
    layers_on_device,
    zero,
    *,
    precision: str = "bf16",
    memory_model: str | MemoryModel = "zero",
    largest_module_params=0.0,
):
    """Bytes of parameters (and gradients) materialised whole for compute beyond the states.

    ZeRO-3 / FSDP gather one unit (a transformer layer) and prefetch the next: 2 layers of
    16-bit parameters ("zero", "megatron", "torch"). DeepSpeed's estimator counts its
    largest module's (one nn.Module's own parameters, e.g. the embedding) fp16 parameters and
    gradients: 4 bytes per parameter of that module. With the "torch" model, SHARD_GRAD_OP
    (zero 2) keeps every gathered layer from forward to backward.
    """
    model = model_of(memory_model)
    zero = np.asarray(zero)
    lps = np.asarray(layers_on_device, dtype=np.float64)
    compute = 4.0 if _kind(precision) == "fp32" else 2.0
    z3 = (np.minimum(model.gathered_layers, lps) * layer_params * compute
          + model.gathered_largest_module_copies * compute
          * np.asarray(largest_module_params, dtype=np.float64) * np.ones_like(lps))
    out = np.where(zero >= 3, z3, 0.0)
    if model.stage2_keeps_gathered:
        out = np.where(zero == 2, lps * layer_params * compute, out)
    return out


def buffer_bytes(grad_params, zero, *, dp, precision: str = "bf16",
                 memory_model: str | MemoryModel = "zero"):
    """Communication buffers: DDP's gradient buckets, a copy of every gradient unless
    gradient_as_bucket_view=True (MemoryModel.ddp_bucket_copy_bytes, stages 0 and 1, which
    run DDP). With one data-parallel replica nothing wraps the model in DDP (torchtitan
    applies it only when dp_replicate > 1), so there are no buckets."""
    zero, dp = np.asarray(zero), np.asarray(dp)
    copy = model_of(memory_model).ddp_bucket_copy_bytes
    return np.where((zero <= 1) & (dp > 1), copy * np.asarray(grad_params, dtype=np.float64), 0.0)


def activation_bytes_per_layer(cost, tokens, tp=1, sp=0, recompute=0, act_scale=1.0,
                               fp8_inputs=False):
    """Activation bytes one transformer layer keeps for one micro-batch of `tokens` tokens.

    Korthikanti et al. 2022, Table 2 (16-bit activations, `act_scale` 2 for fp32), written
    per term (see ModelCost): with t = tp,
        no recomputation:        tokens * (R / (t if SP else 1) + S / t + A / t)
        selective recomputation: tokens * (R / (t if SP else 1) + S / t)
        full recomputation:      tokens * 2h / (t if SP else 1)   (the layer input only)
        op (torchtitan's operator-level selective AC): ModelCost.act_op_*
        alternate (every second layer fully recomputed): the mean of none and full
    With `fp8_inputs` (FP8 training in Transformer Engine, which keeps the FP8 copy of a
    linear layer's input for the weight-gradient GEMM), the four linear inputs are 1 byte per
    element instead of 2: ModelCost.act_fp8_saving_* less, without recomputation and with
    selective (half of that with alternate); full and op keep what they keep.
    For a GPT layer R = 10h, S = 24h, A = 5as, which gives the paper's sbh(34 + 5as/h),
    sbh(10 + 24/t + 5as/ht), sbh(34/t + 5as/ht), sbh(10 + 24/t), sbh(34/t) and 2sbh.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(tp, dtype=np.float64)
    sp_div = np.where(np.asarray(sp) > 0, t, 1.0)
    recompute = np.asarray(recompute)
    rep = cost.act_replicated / sp_div
    saving = (
        tokens * (cost.act_fp8_saving_replicated / sp_div + cost.act_fp8_saving_split / t)
        if fp8_inputs
        else 0.0
    )
    full = tokens * (rep + cost.act_split / t + cost.act_scores / t) - saving
    selective = tokens * (rep + cost.act_split / t) - saving
    checkpoint = tokens * cost.act_checkpoint / sp_div
    # "op" (index 3): what operator-level checkpointing keeps (ModelCost.act_op_*);
    # "alternate" (index 4): every second layer checkpointed, so on average half of each.
    op = tokens * (cost.act_op_replicated / sp_div + cost.act_op_split / t)
    out = np.select(
        [recompute == 0, recompute == 1, recompute == 2, recompute == 3],
        [full, selective, checkpoint, op],
        0.5 * (full + checkpoint),
    )
    return out * act_scale


def pipeline_inflight(pp, microbatches, interleave=1):
    """Micro-batches whose activations the first pipeline stage holds at once.

    1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): the first stage keeps min(p, m)
    micro-batches in flight, so it stores the activations of about L layers whatever p is
    (Korthikanti et al. 2022 §4.2.3). The interleaved schedule with v chunks per device needs
    (1 + (p - 1) / (p v)) times that (Korthikanti §4.2.3).
    """
    pp = np.asarray(pp, dtype=np.float64)
    v = np.asarray(interleave, dtype=np.float64)
    base = np.minimum(pp, np.asarray(microbatches, dtype=np.float64))
    return base * np.where(v > 1, 1.0 + (pp - 1.0) / (pp * v), 1.0)
