"""One way to lay a model over devices (Layout), its knobs as table columns (KNOBS) for the
vectorised search, and the checks that a layout runs a model on a device count."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sextant.core.errors import UserError
from sextant.planner.models import ModelCost

RECOMPUTE = ("none", "selective", "full", "op", "alternate")
"""Activation recomputation: none; selective (the attention core, Korthikanti et al. 2022);
full (every layer from its input); op (torchtitan's "selective op" AC: every other matmul and
every elementwise op recomputed); alternate (torchtitan's "selective layer" AC with its
default option 2: every second layer fully recomputed). The search tries the first three;
the last two are taken when pinned (--recompute)."""
OFFLOAD = ("none", "optimizer", "params")
ZERO_STAGES = (0, 1, 2, 3)
"""ZeRO stages: 0 plain data parallelism, 1 optimizer states sharded, 2 and gradients, 3 and
parameters."""
KNOBS = ("dp", "tp", "pp", "zero", "mbs", "rc", "sp", "off", "v", "hs", "cp", "ep")
"""The columns of a table of layouts (estimate.evaluate): one int array per knob."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Layout:
    """One way to lay a model over devices."""

    dp: int = 1
    """Data-parallel degree."""
    tp: int = 1
    """Tensor-parallel degree (Megatron-LM)."""
    pp: int = 1
    """Pipeline-parallel stages."""
    zero: int = 0
    """ZeRO stage over the data-parallel group: 0 (DDP), 1, 2, 3 (= FSDP full shard)."""
    mbs: int = 1
    """Micro-batch size in sequences."""
    recompute: str = "none"
    """Activation recomputation (RECOMPUTE): none, selective (attention core), full, op,
    alternate."""
    sp: bool = False
    """Sequence parallelism (needs tp > 1)."""
    offload: str = "none"
    """CPU offload: none, optimizer (ZeRO-Offload), params (ZeRO-Infinity, needs zero 3)."""
    interleave: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B schedule)."""
    hsdp: bool = False
    """Hybrid sharding: ZeRO shards within the node's data-parallel ranks and replicates
    across nodes (FSDP HYBRID_SHARD / HSDP, DeepSpeed ZeRO++ hpZ); needs zero >= 1."""
    cp: int = 1
    """Context parallelism: the sequence split over cp ranks (ring attention exchanging K and
    V blocks); devices = dp x tp x pp x cp."""
    ep: int = 1
    """Expert parallelism (MoE): the experts split over ep ranks of the dp x cp group, tokens
    exchanged with all-to-alls."""

    def __post_init__(self) -> None:
        for key in ("dp", "tp", "pp", "mbs", "interleave", "cp", "ep"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{key} must be an integer >= 1. Received: {value!r}")
        if self.zero not in ZERO_STAGES:
            raise UserError(f"zero stage must be 0, 1, 2 or 3. Received: {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise UserError(
                f"recompute must be one of {', '.join(RECOMPUTE)}. Received: {self.recompute!r}"
            )
        if self.offload not in OFFLOAD:
            raise UserError(
                f"offload must be one of {', '.join(OFFLOAD)}. Received: {self.offload!r}"
            )
        if self.sp and self.tp == 1:
            raise UserError("sequence parallelism needs tp > 1. Received: tp=1, sp=True")
        if self.offload == "params" and self.zero != 3:
            raise UserError(f"offload=params needs zero 3. Received: zero={self.zero}")
        if self.interleave > 1 and self.pp == 1:
            raise UserError("an interleaved schedule needs pp > 1. Received: pp=1")
        if self.hsdp and self.zero == 0:
            raise UserError("hybrid sharding (hsdp) needs a ZeRO stage >= 1. Received: zero=0")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def label(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.interleave > 1:
            parts.append(f"v{self.interleave}")
        parts.append(f"zero{self.zero}")
        parts.append(f"mbs{self.mbs}")
        if self.sp:
            parts.append("sp")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.offload != "none":
            parts.append(f"offload-{self.offload}")
        if self.hsdp:
            parts.append("hsdp")
        return " ".join(parts)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "dp": np.array([self.dp]),
            "tp": np.array([self.tp]),
            "pp": np.array([self.pp]),
            "zero": np.array([self.zero]),
            "mbs": np.array([self.mbs]),
            "rc": np.array([RECOMPUTE.index(self.recompute)]),
            "sp": np.array([int(self.sp)]),
            "off": np.array([OFFLOAD.index(self.offload)]),
            "v": np.array([self.interleave]),
            "hs": np.array([int(self.hsdp)]),
            "cp": np.array([self.cp]),
            "ep": np.array([self.ep]),
        }

    @staticmethod
    def from_row(arrays: dict[str, np.ndarray], i: int) -> Layout:
        return Layout(
            dp=int(arrays["dp"][i]),
            tp=int(arrays["tp"][i]),
            pp=int(arrays["pp"][i]),
            zero=int(arrays["zero"][i]),
            mbs=int(arrays["mbs"][i]),
            recompute=RECOMPUTE[int(arrays["rc"][i])],
            sp=bool(arrays["sp"][i]),
            offload=OFFLOAD[int(arrays["off"][i])],
            interleave=int(arrays["v"][i]),
            hsdp=bool(arrays["hs"][i]) if "hs" in arrays else False,
            cp=int(arrays["cp"][i]) if "cp" in arrays else 1,
            ep=int(arrays["ep"][i]) if "ep" in arrays else 1,
        )


def check_layout(cost: ModelCost, layout: Layout, devices: int, global_batch: int) -> None:
    """UserError unless the layout is a valid way to run this model on `devices` devices."""
    for key in ("tp", "pp", "cp"):
        value = getattr(layout, key)
        if devices % value:
            raise UserError(
                f"{key} must divide the device count. Received: {key}={value}, "
                f"devices={devices}"
            )
    if devices % (layout.tp * layout.pp * layout.cp):
        raise UserError(
            f"tp x pp x cp must divide the device count. Received: {layout.tp} x {layout.pp} "
            f"x {layout.cp} = {layout.tp * layout.pp * layout.cp}, devices={devices}"
        )
    if layout.devices != devices:
        raise UserError(
            f"dp x tp x pp x cp must equal the device count. Received: {layout.dp} x "
            f"{layout.tp} x {layout.pp} x {layout.cp} = {layout.devices}, devices={devices}"
        )
    if layout.cp > 1 and cost.tokens_per_sample % (2 * layout.cp):
        raise UserError(
            "context parallelism must divide the sequence into 2 x cp chunks (load-balanced "
            f"causal ring attention). Received: seq_len={cost.tokens_per_sample}, cp={layout.cp}"
        )
    if layout.ep > 1 and not cost.n_experts:
        raise UserError(f"expert parallelism needs an MoE model. Received: ep={layout.ep}, "
                        f"{cost.name} has no experts")
    if cost.n_experts and cost.n_experts % layout.ep:
        raise UserError(
            f"ep must divide the number of experts. Received: ep={layout.ep}, "
            f"experts={cost.n_experts}"
        )
    if (layout.dp * layout.cp) % layout.ep:
        raise UserError(
            f"ep must divide dp x cp (experts are split over the data-parallel ranks). "
            f"Received: ep={layout.ep}, dp={layout.dp}, cp={layout.cp}"
        )
    if not cost.supports_model_parallel and (layout.tp > 1 or layout.pp > 1 or layout.cp > 1):
        raise UserError(
            f"{cost.name} ({cost.family}) supports data parallelism only; "
            f"received tp={layout.tp}, pp={layout.pp}, cp={layout.cp}"
        )
    if cost.n_heads % layout.tp:
        raise UserError(
            f"tp must divide the number of attention heads. Received: tp={layout.tp}, "
            f"heads={cost.n_heads}"
        )
    if layout.pp * layout.interleave > cost.n_layers:
        raise UserError(
            f"pp x interleave must not exceed the layer count. Received: "
            f"{layout.pp} x {layout.interleave} > {cost.n_layers}"
        )
    if global_batch % (layout.dp * layout.mbs):
        raise UserError(
            f"global batch must be a multiple of dp x micro-batch. Received: batch={global_batch}, "
            f"dp={layout.dp}, mbs={layout.mbs}"
        )
    m = global_batch // (layout.dp * layout.mbs)
    if layout.interleave > 1 and m % layout.pp:
        raise UserError(
            f"the interleaved schedule needs micro-batches per step ({m}) to be a multiple of "
            f"pp ({layout.pp}) (Narayanan et al. 2021 §2.2.2)"
        )

