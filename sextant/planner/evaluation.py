"""What the estimator returns: an Evaluation of named, typed parts.

The step is a sum of StepParts, each carrying the link it runs on; memory is a list of
MemoryParts. One Evaluation holds a whole table of layouts (each figure an array, one entry
per layout) or, after `row(i)`, one layout (each figure a Python number): the same type in
the search, the plan and the references. Whatever explains, tabulates or prints a step (the
largest overhead, the plan's tables, `--json`) iterates over the parts instead of listing
keys again (optax's named_chain: each transform keyed by its name, the fold one loop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sextant.planner.hardware import Hardware

Figure = Any
"""A figure of every layout of a table (numpy array) or of one layout (float or bool)."""


@dataclass(frozen=True, slots=True)
class StepPart:
    """One part of the step, in seconds per optimizer step on the slowest device."""

    name: str
    """Its key in the plan's `time` table and `--json`."""
    label: str
    """What the plan's table calls it."""
    cause: str
    """What it is called as the step's largest overhead."""
    seconds: Figure
    crosses: Figure = False
    """Whether it runs over the network between nodes (or between TPU slices)."""
    names_link: bool = False
    """A collective or send whose link (intra-node or network) the cause names."""
    point_to_point: bool = False
    """Sends between two ranks, at the link's nominal rate (collectives run at its
    achievable bus bandwidth)."""


@dataclass(frozen=True, slots=True)
class MemoryPart:
    """One part of a device's memory, in bytes (on the fuller pipeline stage)."""

    name: str
    label: str
    bytes: Figure


@dataclass(frozen=True, slots=True)
class HostFigures:
    """Host RAM a layout needs (bytes)."""

    offload: Figure
    """Per device: the optimizer states (and parameters) CPU offload keeps on the host."""
    per_node: Figure
    """Offloaded bytes of all the devices sharing one host."""
    load_per_rank: Figure
    """While the model is built: a stack that loads it whole keeps it in fp32 per rank."""
    load_per_node: Figure


@dataclass(frozen=True, slots=True)
class ComputeFigures:
    """What the compute part is made of (seconds, and FLOPs per token)."""

    flops_bound: Figure
    """GEMMs and attention at their kernels' rates."""
    scaled_bound: Figure
    """The part of flops_bound that scales with 1 / kernel efficiency."""
    memory_ops: Figure
    """GEMM operands and elementwise kernels at the memory bandwidth."""
    weights_bound: Figure
    """The roofline's weight reads."""
    hw_flops_per_token: Figure
    """Hardware FLOPs per token, recomputation included."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """What the search ranks a table of layouts by."""

    fits: Figure
    memory: Figure
    tokens_per_s: Figure


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Memory and time of a table of layouts (or of one, after `row`)."""

    devices: Figure
    microbatches: Figure
    """Micro-batches per step per pipeline."""
    params_per_device: Figure
    memory_parts: tuple[MemoryPart, ...]
    memory: Figure
    """Bytes per device: the parts, the fragmentation allowance and the runtime's share."""
    capacity: Figure
    fits: Figure
    """In device memory (and in host memory where --host-memory-gb bounds it)."""
    host: HostFigures
    compute: ComputeFigures
    step_parts: tuple[StepPart, ...]
    step: Figure
    """The sum of step_parts, in their order."""
    dp_comm: Figure
    """All data-parallel collectives, hidden and exposed."""
    step_no_overlap: Figure
    """The step with nothing of the data-parallel communication hidden."""
    tokens_per_s: Figure
    mfu: Figure
    """Model FLOPs (attention included, no recomputation) / peak / step time."""
    mfu_6n: Figure
    """The same with 6 x parameters FLOPs per token (Kaplan et al.'s 6N, no attention)."""
    hfu: Figure
    """Hardware FLOPs (recomputation included) / peak / step time."""
    offload: Figure
    weights_bound: Figure
    """The compute is bound by reading the weights, not by its FLOPs."""

    def part(self, name: str) -> StepPart:
        for p in self.step_parts:
            if p.name == name:
                return p
        raise KeyError(f"no step part {name!r}; parts: {[p.name for p in self.step_parts]}")

    def seconds(self, name: str) -> Figure:
        return self.part(name).seconds

    def memory_of(self, name: str) -> Figure:
        for p in self.memory_parts:
            if p.name == name:
                return p.bytes
        raise KeyError(f"no memory part {name!r}")

    @property
    def exposed_communication(self) -> Figure:
        """The communication parts of the step (what is left of them after overlap)."""
        return sum_parts(p for p in self.step_parts if p.names_link or p.name in COMM_PARTS)

    def row(self, i: int) -> Evaluation:
        """Layout i's figures as Python numbers."""
        return tree_map(lambda a: np.asarray(a)[i].item(), self)

    def ranking(self) -> Ranking:
        return Ranking(fits=self.fits, memory=self.memory, tokens_per_s=self.tokens_per_s)

    def overhead(self, hw: Hardware) -> tuple[str, float]:
        """The largest part of one layout's step that is not compute, named with the link it
        runs on, and its share of the step."""
        candidates = [p for p in self.step_parts if p.name != "compute"]
        # Ties go to the communication first (a step with no overhead names its TP link).
        candidates = candidates[1:] + candidates[:1]
        worst = max(candidates, key=lambda p: p.seconds)
        share = float(worst.seconds / self.step)
        if worst.name == "optimizer":
            return ("CPU offload (host link and host optimizer step)" if self.offload
                    else "optimizer step"), share
        if not worst.names_link:
            return worst.cause, share
        crosses = bool(worst.crosses)
        link = hw.inter if crosses else hw.intra
        if worst.point_to_point:
            bw = hw.inter_bw_per_device if crosses else hw.intra.bandwidth
        else:
            bw = hw.inter_coll_bw_per_device if crosses else hw.intra.collective_bandwidth
        where = "inter-node" if crosses else "intra-node"
        if hw.torus is not None:
            # A slice's groups each have the bandwidth of the ICI axes they lie on (the
            # plan's slice line gives it); between slices, the data-centre network.
            where = "between slices" if crosses else "the slice's ICI axes"
            if not crosses:
                return f"{worst.cause} on {link.key} ({where})", share
        return f"{worst.cause} on {link.key} ({where}, {bw / 1e9:.3g} GB/s/device)", share


COMM_PARTS = ("cp_comm", "ep_comm")
"""Communication parts whose cause names no link (they pick theirs per message)."""


def sum_parts(parts: Any) -> Figure:
    """The parts' seconds added in their order (the step's own order of additions)."""
    total: Figure = 0.0
    for p in parts:
        total = total + p.seconds
    return total


def tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    """`fn` over the figures of equally shaped Evaluations (or parts), leaving names, labels
    and flags that are not figures as they are."""
    first = trees[0]
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return type(first)(**{
            f.name: tree_map(fn, *(getattr(t, f.name) for t in trees))
            for f in dataclasses.fields(first)
        })
    if isinstance(first, tuple):
        return tuple(tree_map(fn, *items) for items in zip(*trees, strict=True))
    if first is None or isinstance(first, (str, bool)):
        return first
    return fn(*trees)


def concatenate(parts: list[Evaluation]) -> Evaluation:
    """One Evaluation of the tables evaluated chunk by chunk."""
    return tree_map(lambda *a: np.concatenate(a), *parts)
