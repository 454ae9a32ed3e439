"""The machine a plan runs on (Hardware: accelerator, links, node size) and the kernel rates
every term prices compute at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sextant.planner import efficiency, topology
from sextant.planner.catalogue import Accelerator, Catalogue, Link
from sextant.planner.models import ModelCost
from sextant.planner.options import PlanOptions
from sextant.planner.topology import Torus


@dataclass(kw_only=True, slots=True, frozen=True)
class Hardware:
    """The machine a plan runs on: accelerator, links, node size."""

    accelerator: Accelerator
    intra: Link
    """Intra-node link (the inter link when nodes have one device)."""
    inter: Link
    """Inter-node network."""
    host: Link | None
    """Device-host link for offload (None: unified memory)."""
    devices_per_node: int
    nics_per_node: int

    @property
    def inter_bw_per_device(self) -> float:
        """A device's share of its node's network ports."""
        return self.inter.bandwidth * self.nics_per_node / self.devices_per_node

    @property
    def inter_coll_bw_per_device(self) -> float:
        """The same share at the network's achievable collective bus bandwidth."""
        return self.inter.collective_bandwidth * self.nics_per_node / self.devices_per_node

    @property
    def torus(self) -> Torus | None:
        """The accelerator's ICI torus (TPUs): a node is then one slice of the pod."""
        return self.accelerator.torus

    def node_size(self, devices: Any) -> Any:
        """Devices per node for a job of `devices` devices: the catalogue's (or
        --gpus-per-node) figure, or on a TPU the chips of one slice (topology.slice_chips:
        the largest slice that divides the job and fits the pod)."""
        if self.torus is None:
            return float(self.devices_per_node)
        n = np.asarray(devices, dtype=np.int64)
        uniq, inv = np.unique(n, return_inverse=True)
        sizes = np.array(
            [topology.slice_chips(int(k), self.devices_per_node, self.torus) for k in uniq],
            dtype=np.float64,
        )
        return sizes[inv].reshape(n.shape)


def resolve_hardware(
    cat: Catalogue,
    accelerator: str,
    network: str | None = None,
    *,
    intra_link: str | None = None,
    options: PlanOptions | None = None,
) -> Hardware:
    acc = cat.accelerator(accelerator)
    inter = cat.link(network or acc.inter_link)
    intra_key = intra_link or acc.intra_link
    intra = cat.link(intra_key) if intra_key else inter
    host = cat.links.get(acc.host_link) if acc.host_link != "unified" else None
    opts = options or PlanOptions()
    g = opts.devices_per_node or acc.devices_per_node
    if not intra_key:
        g = opts.devices_per_node or 1
    nics = opts.nics_per_node or g
    return Hardware(
        accelerator=acc, intra=intra, inter=inter, host=host, devices_per_node=g, nics_per_node=nics
    )


def head_flops_per_token(cost: ModelCost) -> float:
    """FLOPs of a transformer's output projection per token, forward and backward (6 V h;
    4 V h when it is frozen: no weight gradient); 0 for other families."""
    if cost.family != "transformer":
        return 0.0
    return (4.0 + 2.0 * cost.weight_grad_passes) * (cost.logits_bytes_per_token / 4.0) * cost.hidden


def attention_kernel(acc: Accelerator, opts: PlanOptions) -> tuple[str, float] | None:
    """The attention kernel opts' stack runs on `acc`, with its published rate
    (efficiency.attention_kernel); None: a full-matrix kernel at the GEMM efficiency."""
    return efficiency.attention_kernel(acc.attention_rates, opts.stack.attention_kernels,
                                       opts.flash_attention)


def kernel_seconds(gemm_flops, head_flops, attention_flops, peak, acc: Accelerator,
                   opts: PlanOptions) -> tuple[Any, Any, Any]:
    """Seconds per token of the layers' GEMMs, of the output projection and of the attention
    core, at the kernel efficiency and the attention kernel's rate. FP8 GEMMs (Micikevicius et
    al. 2022) run the layers' matrix multiplies at the fp8 peak; the attention core and the
    output projection stay at the 16-bit `peak`: neither stack quantizes the projection
    (Megatron-Core's output_layer is outside Transformer Engine; torchtitan's float8
    converter skips "output")."""
    eff = opts.compute_efficiency
    gemm = gemm_flops / ((acc.peak("fp8") if opts.fp8 else peak) * eff)
    attention = efficiency.attention_seconds(attention_flops, peak,
                                             attention_kernel(acc, opts), eff)
    return gemm, head_flops / (peak * eff), attention


def per_device_peak(acc: Accelerator, precision: str, devices_on_node) -> np.ndarray:
    """Peak FLOP/s per device. On a shared node (cpu-local) the workers split the cores:
    with `cores / n` threads each, interpolate linearly between the measured one-thread and
    all-thread GEMM rates; with one core each, the one-thread rate (n single-threaded
    processes reach n x the one-thread rate, more than one process with n threads: that is
    the whole speed-up of data parallelism on one CPU); more workers than cores share the
    cores' one-thread rates."""
    peak = acc.peak(precision)
    n = np.asarray(devices_on_node, dtype=np.float64)
    if not acc.shared_node:
        return np.full_like(n, peak)
    (_, f1), (cores, fall) = acc.flops_by_threads
    threads = np.maximum(1.0, np.floor(cores / np.maximum(n, 1.0)))
    per = f1 + (fall - f1) * (threads - 1.0) / max(cores - 1.0, 1.0)
    return np.where(n > cores, f1 * cores / np.maximum(n, 1.0), per)

