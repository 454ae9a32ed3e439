"""What every term of the step reads: one LayoutContext per table of layouts (the layouts,
the job, the parameters each device holds, each group's place on the nodes) and the links
each group's collectives use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sextant.planner import memory, topology
from sextant.planner.hardware import Hardware, attention_kernel
from sextant.planner.models import ModelCost
from sextant.planner.options import PlanOptions
from sextant.planner.topology import Torus

F = np.float64


@dataclass(frozen=True, slots=True)
class LayoutContext:
    """What every term reads: the layouts, the job, and the parameters each device holds."""

    cost: ModelCost
    hw: Hardware
    opts: PlanOptions
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    rc: np.ndarray
    off: np.ndarray
    mbs: np.ndarray
    v: np.ndarray
    sp: np.ndarray
    hs: np.ndarray
    n: np.ndarray
    """Devices of each layout (dp x tp x pp x cp)."""
    m: np.ndarray
    """Micro-batches per step per pipeline."""
    tok_dev: np.ndarray
    """Tokens of one micro-batch on one device (context parallelism splits them)."""
    fwd_rc: np.ndarray
    """Forward passes of the layers' GEMMs and collectives recomputed per micro-batch."""
    gemm_rc: np.ndarray
    """The same for the matmul FLOPs ('op' recomputes its share of them)."""
    lps: np.ndarray
    """Layers on the fullest pipeline stage."""
    layer_local: np.ndarray
    """Parameters of one layer on a rank before TP (1/ep of an MoE layer's experts)."""
    psi_first: np.ndarray
    psi_last: np.ndarray
    """Parameters per device on the first and the last pipeline stage."""
    tp_in: np.ndarray
    tp_out: np.ndarray
    dp_in: np.ndarray
    dp_out: np.ndarray
    cp_in: np.ndarray
    """Each group's ranks inside one node and the nodes it spans (tp, then dp x cp, then
    pp: Megatron-LM's order)."""
    shard: np.ndarray
    """Ranks ZeRO shards over: the dp x cp group, or its intra-node part with HSDP."""
    mem_bw: Any
    """Memory bandwidth per device (a device's share on a shared node)."""
    g: Any
    """Devices per node (a float), or on a TPU the chips of each layout's slice (an array)."""

    @property
    def multi(self) -> np.ndarray:
        return self.pp > 1

    @property
    def per_host(self) -> Any:
        """Devices that share one host's RAM: the node's, or a TPU host's chips."""
        torus = self.hw.torus
        return np.minimum(self.n, self.g if torus is None else float(torus.host_chips))

    @property
    def psi_stage(self) -> np.ndarray:
        return np.maximum(self.psi_first, self.psi_last)

    @property
    def act_bytes(self) -> float:
        return 4.0 if self.opts.precision in memory.FP32_STORAGE else 2.0

    @property
    def tokens_step(self) -> float:
        return float(self.opts.global_batch) * float(self.cost.tokens_per_sample)

    @property
    def attention(self) -> tuple[str, float] | None:
        """The attention kernel the stack runs on this chip (attention_kernel)."""
        return attention_kernel(self.hw.accelerator, self.opts)


def layout_context(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, lay: dict[str, np.ndarray]
) -> LayoutContext:
    dp, tp, pp = lay["dp"].astype(F), lay["tp"].astype(F), lay["pp"].astype(F)
    mbs, rc = lay["mbs"].astype(F), lay["rc"]
    sp = lay["sp"] > 0
    cp = lay["cp"].astype(F) if "cp" in lay else np.ones_like(dp)
    ep = lay["ep"].astype(F) if "ep" in lay else np.ones_like(dp)
    n = dp * tp * pp * cp
    dpc = dp * cp  # the ranks holding the same (non-expert) parameters
    g = hw.node_size(n)
    # 1 forward recomputed with full recomputation, 1/2 when every second layer is
    # checkpointed; "op" recomputes its share of the matmul FLOPs but keeps the collectives'
    # and attention's outputs.
    fwd_rc = (rc == 2) + 0.5 * (rc == 4)
    op_share = cost.op_recompute_flops_per_token / max(cost.full_recompute_flops_per_token, 1.0)
    L = float(cost.n_layers)
    lps = np.ceil(L / pp)
    # An MoE layer keeps its dense part (attention, router) whole and 1/ep of its experts.
    layer_local = cost.layer_params - cost.expert_params + cost.expert_params / ep
    single = (L * layer_local + cost.embed_params + cost.head_params + cost.other_params) / tp
    multi = pp > 1
    last_extra = cost.head_params + cost.tied_copy_params + cost.other_params
    # The data-parallel reduction group is dp x cp (Megatron shards the distributed
    # optimizer over DP x CP).
    dp_in = np.where(tp < g, np.minimum(np.maximum(np.floor(g / tp), 1.0), dpc), 1.0)
    acc = hw.accelerator
    return LayoutContext(
        cost=cost, hw=hw, opts=opts, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=lay["zero"],
        rc=rc, off=lay["off"], mbs=mbs, v=lay["v"].astype(F), sp=sp,
        hs=lay["hs"] > 0 if "hs" in lay else np.zeros_like(sp), n=n,
        m=float(opts.global_batch) / (dp * mbs),
        tok_dev=mbs * float(cost.tokens_per_sample) / cp,
        fwd_rc=fwd_rc, gemm_rc=fwd_rc + (rc == 3) * op_share, lps=lps,
        layer_local=layer_local,
        psi_first=np.where(multi, lps * layer_local / tp + cost.embed_params / tp, single),
        psi_last=np.where(multi, lps * layer_local / tp + last_extra / tp, single),
        tp_in=np.minimum(tp, g), tp_out=np.ceil(tp / g), dp_in=dp_in,
        dp_out=np.ceil(dpc / dp_in), cp_in=np.minimum(cp, np.maximum(np.floor(g / tp), 1.0)),
        shard=np.where(lay["hs"] > 0, dp_in, dpc) if "hs" in lay else dpc,
        mem_bw=(
            (acc.memory_bw or np.inf) / np.minimum(n, g)
            if acc.shared_node
            else acc.memory_bw or np.inf
        ),
        g=g,
    )



@dataclass(frozen=True, slots=True)
class Links:
    """(bandwidth, latency, call latency, ramp) of the intra-node and inter-node links for
    collectives (the catalogue's achievable bus bandwidth, the network tapered above a leaf
    switch) and for point-to-point sends (nominal bandwidth). `tp`, `cp`, `ep` and `dp` are
    the intra-node link as each group sees it: the same tuple on a switched node, on a TPU
    slice the ICI axes the group lies on (_torus_groups)."""

    intra: tuple
    inter: tuple
    intra_p2p: tuple
    inter_p2p: tuple
    tp: tuple
    cp: tuple
    ep: tuple
    dp: tuple


def links(c: LayoutContext) -> Links:
    hw, opts, le = c.hw, c.opts, c.opts.link_efficiency
    # Each link carries its bandwidth-versus-message-size ramp (comms.ramp_efficiency, fitted
    # to published sweeps); a network without one uses the intra-node link's.
    intra_ramp = hw.intra.ramp
    inter_ramp = hw.inter.ramp if hw.inter.ramp is not None else intra_ramp
    inter_bw: Any = hw.inter_coll_bw_per_device * le
    if opts.oversubscription > 1 and opts.nodes_per_leaf is not None:
        # A group spanning more nodes than one leaf switch crosses the tapered spine.
        nodes = np.ceil(c.n / c.g)
        inter_bw = inter_bw / np.where(nodes > opts.nodes_per_leaf, opts.oversubscription, 1.0)
    intra = (hw.intra.collective_bandwidth * le, hw.intra.latency, hw.intra.call_latency,
             intra_ramp)
    intra_p2p = (hw.intra.bandwidth * le, hw.intra.latency, hw.intra.call_latency, intra_ramp)
    groups = {k: intra for k in ("tp", "cp", "ep", "dp")}
    if hw.torus is not None:
        groups = _torus_groups(c, hw.torus, le, hw.intra.call_latency)
        # A pipeline send goes to the neighbouring chip: one link, one way.
        intra_p2p = (hw.torus.link_bandwidth * le, hw.torus.hop_latency,
                     hw.intra.call_latency, None)
    return Links(
        intra=intra,
        inter=(inter_bw, hw.inter.latency, hw.inter.call_latency, inter_ramp),
        intra_p2p=intra_p2p,
        inter_p2p=(hw.inter_bw_per_device * le, hw.inter.latency, hw.inter.call_latency,
                   inter_ramp),
        **groups,
    )


def _torus_groups(c: LayoutContext, torus: Torus, le: float, call: float) -> dict[str, tuple]:
    """Each group's link on a TPU slice: the tensor-parallel group innermost, then context
    parallelism, then the data-parallel (FSDP) ranks of the slice, the expert group being
    the first of those (topology.place; MaxText's mesh order). Evaluated once per distinct
    (slice, tp, cp, ep, dp) of the table."""
    chips = np.minimum(c.n, c.g)
    ep_in = np.minimum(c.ep, c.dp_in)
    keys = np.stack([chips, c.tp_in, c.cp_in, ep_in, c.dp_in]).T.astype(np.int64)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    table = np.empty((len(uniq), 4, 2))
    fallback = topology.GroupLink(bandwidth=torus.link_bandwidth, latency=torus.hop_latency,
                                  axes=())
    for i, (s, tp, cp, ep, dp) in enumerate(uniq.tolist()):
        placed = [
            topology.groups_links(torus, s, (tp, cp))
            or (fallback, fallback),
            topology.groups_links(torus, s, (tp, ep)) or (fallback, fallback),
            topology.groups_links(torus, s, (tp, dp)) or (fallback, fallback),
        ]
        for j, link in enumerate((placed[0][0], placed[0][1], placed[1][1], placed[2][1])):
            table[i, j] = (link.bandwidth, link.latency)
    out = {}
    for j, name in enumerate(("tp", "cp", "ep", "dp")):
        out[name] = (table[inv, j, 0] * le, table[inv, j, 1], call, None)
    return out


