"""Fine-tuning in a plan (`plan --finetune full|lora`): what trains, what is frozen.

'full' trains every parameter: the plan is the pre-training one (the memory and FLOPs do not
depend on where the weights came from). 'lora' (Hu et al. 2021, "LoRA: Low-Rank Adaptation
of Large Language Models", §4) freezes the base and trains, beside each target projection
W (in x out) of every layer, A (in x r) and B (r x out):

* memory: the frozen base holds its weights only (no gradient, no optimizer state), in its
  own dtype (`base_dtype`); the adapters hold weights, gradients and optimizer state as any
  trained parameter does under the stack's memory model; the activations are those of
  training, since the input gradients still flow through every layer;
* FLOPs: a frozen matrix costs its forward (2 per parameter and token) and its input
  gradient (2), not its weight gradient (2): 4N instead of 6N, the attention core unchanged;
  the adapters add 6 per adapter parameter and token;
* communication: data parallelism reduces the adapters' gradients only; ZeRO-3 still gathers
  the frozen weights for every pass.

The adapter's parameters are spread evenly over the devices that hold the base (an
approximation: the embedding and the output projection carry none).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sextant.core.errors import UserError
from sextant.planner.memory import FP32_STORAGE
from sextant.planner.models import ModelCost
from sextant.workloads.spec import FINETUNE_METHODS, GPT_LORA_TARGETS, LORA_TARGETS

BASE_DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
"""Bytes of one frozen base parameter in each dtype the base may be held in."""
MAX_RANK = 1 << 16


@dataclass(kw_only=True, slots=True, frozen=True)
class FineTune:
    """What a fine-tuning plan trains (`--finetune`, `--lora-rank`, `--lora-targets`,
    `--base-dtype`; a workload's [finetune] table)."""

    method: str = "full"
    """'full' (every parameter trains) or 'lora' (adapters beside a frozen base)."""
    rank: int = 8
    """LoRA's rank r."""
    targets: tuple[str, ...] = ("q", "v")
    """Projections that get an adapter (PEFT's default for Llama: q and v)."""
    base_dtype: str | None = None
    """The frozen base's dtype (fp32, bf16 or fp16); None: the plan's precision's (fp32 for
    fp32, else the 16-bit type)."""

    def __post_init__(self) -> None:
        if self.method not in FINETUNE_METHODS:
            raise UserError(f"finetune method must be one of {list(FINETUNE_METHODS)}. "
                            f"Received: {self.method!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not (
                1 <= self.rank <= MAX_RANK):
            raise UserError(f"--lora-rank must be an integer in [1, {MAX_RANK}]. "
                            f"Received: {self.rank!r}")
        targets = tuple(self.targets)
        known = dict.fromkeys((*LORA_TARGETS, *GPT_LORA_TARGETS))
        if not targets or any(t not in known for t in targets) or len(set(targets)) != len(
                targets):
            raise UserError(f"--lora-targets must list distinct projections among "
                            f"{','.join(known)}. Received: {','.join(map(str, targets))}")
        if self.base_dtype is not None and self.base_dtype not in BASE_DTYPE_BYTES:
            raise UserError(f"--base-dtype must be one of {', '.join(BASE_DTYPE_BYTES)}. "
                            f"Received: {self.base_dtype!r}")

    @property
    def lora(self) -> bool:
        return self.method == "lora"

    def base_dtype_in(self, precision: str) -> str:
        """The frozen base's dtype in a plan of `precision`: its own where set, else the
        precision's storage dtype (fp32 for tf32)."""
        return self.base_dtype or ("fp32" if precision in FP32_STORAGE else precision)

    def base_bytes(self, precision: str) -> float:
        """Bytes per frozen base parameter."""
        return BASE_DTYPE_BYTES[self.base_dtype_in(precision)]


def adapter_params(cost: ModelCost, ft: FineTune) -> float:
    """LoRA's trainable parameters: r x (in + out) of every target matrix of every layer."""
    widths = dict(cost.lora_matrices)
    if not widths:
        raise UserError(f"LoRA needs a transformer's projections; {cost.name} is a "
                        f"{cost.family} model (use --finetune full)")
    missing = [t for t in ft.targets if t not in widths]
    if missing:
        raise UserError(f"--lora-targets {','.join(missing)}: {cost.name} has no such "
                        f"projection; it has {','.join(widths)}")
    return float(ft.rank * cost.n_layers * sum(widths[t] for t in ft.targets))


def adapted(cost: ModelCost, ft: FineTune | None, precision: str) -> ModelCost:
    """The cost of training `ft` on the model: unchanged for full fine-tuning (and for a cost
    already adapted), else with LoRA's trainable share, frozen bytes and FLOPs (module
    docstring)."""
    if ft is None or not ft.lora or cost.adapter_params:
        return cost
    adapters = adapter_params(cost, ft)
    six_n = cost.model_flops_per_token - cost.attention_flops_per_token
    return replace(
        cost,
        model_flops_per_token=six_n * 4.0 / 6.0 + cost.attention_flops_per_token
        + 6.0 * adapters,
        trainable_share=adapters / cost.total_params,
        frozen_bytes=ft.base_bytes(precision),
        weight_grad_passes=0.0,
        adapter_params=adapters,
    )
