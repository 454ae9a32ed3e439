"""TPU slices as ICI tori: the slice's shape, where each parallel group lies on its axes, and
the bandwidth a collective over that group reaches.

A TPU pod is a 3-D torus (v4, v5p) or a 2-D one (v5e, v6e) of chips joined by inter-chip
interconnect (ICI) links to their nearest neighbours; a job runs on a *slice*, a rectangular
block of the pod, and several slices talk over the data-centre network (DCN). What follows
is the Scaling Book's model (Austin et al. 2025, "How to Scale Your Model", tpus.md and
sharding.md, github.com/jax-ml/scaling-book):

- A collective along one axis of k chips is a ring over those k chips. With a wraparound
  link on that axis (v4/v5p: an axis whose length is a multiple of 4; v5e/v6e: only the
  full 16) the ring sends both ways at once and reaches twice the one-way link bandwidth;
  without one it reaches the one-way figure.
- A collective over a group that spans several axes runs on all of them at once: the
  bandwidths of the axes add up ("T = V / (W_ici x N_axes)").
- Latency: about one microsecond per hop, over the hops of each axis.

Placement follows MaxText's mesh (MaxText/maxtext_utils.py create_device_mesh over
jax.experimental.mesh_utils): the tensor-parallel group innermost, then context parallelism,
then the expert and FSDP/data axes; only data parallelism crosses slices (dcn_* axes). An
axis a group shares with an inner group is used strided: each of its hops crosses `stride`
links that `stride` groups use at once, so the group gets 1/stride of the axis' bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations_with_replacement


@dataclass(kw_only=True, slots=True, frozen=True)
class Torus:
    """The ICI of one TPU generation, from the catalogue."""

    pod: tuple[int, ...]
    """The largest slice's shape, e.g. (16, 20, 28) for a v5p pod."""
    link_bandwidth: float
    """Bytes/s one way over one ICI link."""
    hop_latency: float
    """Seconds per hop."""
    wrap_unit: int
    """An axis whose length is a multiple of this has a wraparound link (4 on v4/v5p: cubes
    of 4x4x4 joined by optical switches; 16 on v5e/v6e: only the full axis)."""
    host_chips: int
    """Chips on one host (v4/v5p 2x2x1, v5e 4x2): what shares a host's RAM and network."""
    source: str


@dataclass(frozen=True, slots=True)
class AxisUse:
    """A group's share of one axis of the slice."""

    axis: int
    chips: int
    """Chips of the group along the axis."""
    stride: int
    """Chips between two of them (the inner groups' share of the axis)."""
    length: int
    """The axis' length in the slice."""


@dataclass(frozen=True, slots=True)
class GroupLink:
    """What a collective over one group reaches: bytes/s per chip and direction as the
    alpha-beta ring model counts it, and the latency per ring step."""

    bandwidth: float
    latency: float
    axes: tuple[AxisUse, ...]


def slice_shape(chips: int, pod: tuple[int, ...], wrap_unit: int) -> tuple[int, ...] | None:
    """The shape of a slice of `chips` chips: a factorisation that fits inside the pod,
    preferring axes with wraparound, then the most even (Cloud TPU's topologies: 4x4x4,
    8x8x8, 16x16x16, 16x20x28). None when no block of the pod holds that many chips."""
    return _slice_shape(chips, tuple(sorted(pod)), wrap_unit)


@lru_cache(maxsize=4096)
def _slice_shape(chips: int, pod: tuple[int, ...], wrap_unit: int) -> tuple[int, ...] | None:
    if chips < 1 or chips > math.prod(pod):
        return None
    divs = [d for d in range(1, max(pod) + 1) if chips % d == 0]
    best: tuple[tuple[int, int, int], tuple[int, ...]] | None = None
    for dims in combinations_with_replacement(divs, len(pod) - 1):
        rest, last = chips, None
        for d in dims:
            if rest % d:
                break
            rest //= d
        else:
            last = rest
        if last is None:
            continue
        shape = tuple(sorted((*dims, last)))
        if any(a > b for a, b in zip(shape, pod)):
            continue
        no_wrap = sum(1 for a in shape if a > 1 and a % wrap_unit)
        key = (no_wrap, max(shape), -min(shape))
        if best is None or key < best[0]:
            best = (key, shape)
    return None if best is None else best[1]


def place(shape: tuple[int, ...], groups: tuple[int, ...]) -> tuple[tuple[AxisUse, ...], ...] | None:
    """Where each group (inner first) lies on the slice's axes: a group takes an axis it
    fills exactly if there is one, else factors of what is left of the axes, shortest
    first. None when a group does not divide what is left."""
    return _place(tuple(shape), tuple(groups))


@lru_cache(maxsize=65536)
def _place(shape: tuple[int, ...], groups: tuple[int, ...]) -> tuple[tuple[AxisUse, ...], ...] | None:
    left = list(shape)
    stride = [1] * len(shape)
    out: list[tuple[AxisUse, ...]] = []
    for size in groups:
        uses: list[AxisUse] = []
        need = size
        exact = [j for j in range(len(left)) if left[j] == need and need > 1]
        order = exact[:1] + sorted(
            (j for j in range(len(left)) if j not in exact[:1]), key=lambda j: left[j]
        )
        for j in order:
            if need == 1:
                break
            f = math.gcd(need, left[j])
            if f == 1:
                continue
            uses.append(AxisUse(axis=j, chips=f, stride=stride[j], length=shape[j]))
            stride[j] *= f
            left[j] //= f
            need //= f
        if need != 1:
            return None
        out.append(tuple(uses))
    return tuple(out)


def group_link(torus: Torus, uses: tuple[AxisUse, ...]) -> GroupLink:
    """Bandwidth and per-step latency of a ring collective over a group lying on `uses`."""
    bw = 0.0
    hops = 0.0
    chips = 1
    for u in uses:
        wraps = u.chips * u.stride == u.length and u.length % torus.wrap_unit == 0
        both_ways = wraps and u.chips > 2
        bw += torus.link_bandwidth * (2.0 if both_ways else 1.0) / u.stride
        hops += (u.chips - 1) * u.stride
        chips *= u.chips
    if chips <= 1:
        return GroupLink(bandwidth=math.inf, latency=0.0, axes=uses)
    # The alpha-beta ring counts (n - 1) steps; on a torus the group's axes run at once, so
    # the latency is that of the longest chain of hops, spread over the n - 1 steps.
    return GroupLink(
        bandwidth=bw, latency=torus.hop_latency * hops / (chips - 1), axes=uses
    )


def groups_links(
    torus: Torus, chips: int, groups: tuple[int, ...]
) -> tuple[GroupLink, ...] | None:
    """The GroupLink of each group (inner first) on a slice of `chips` chips, or None when
    the slice or the placement does not exist."""
    return _groups_links(torus, chips, tuple(groups))


@lru_cache(maxsize=65536)
def _groups_links(
    torus: Torus, chips: int, groups: tuple[int, ...]
) -> tuple[GroupLink, ...] | None:
    shape = slice_shape(chips, torus.pod, torus.wrap_unit)
    if shape is None:
        return None
    placed = place(shape, groups)
    if placed is None:
        return None
    return tuple(group_link(torus, uses) for uses in placed)


def describe(torus: Torus, chips: int, groups: dict[str, int]) -> str:
    """One line: the slice's shape and each group's axes, e.g. 'slice 16x20x28: tp4 on
    axis 0 (4 of 16, 2 x 100 GB/s), ...'."""
    shape = slice_shape(chips, torus.pod, torus.wrap_unit)
    if shape is None:
        return f"no slice of {chips} chips fits a pod of {'x'.join(map(str, torus.pod))}"
    names = [k for k, v in groups.items() if v > 1]
    placed = place(shape, tuple(groups[k] for k in names))
    head = f"slice {'x'.join(map(str, shape))}"
    if placed is None or not names:
        return head
    parts = []
    for name, uses in zip(names, placed, strict=True):
        link = group_link(torus, uses)
        where = ", ".join(
            f"{u.chips} of axis {u.axis} ({u.length}{'' if u.stride == 1 else f', stride {u.stride}'})"
            for u in uses
        )
        parts.append(f"{name}{groups[name]} on {where}: {link.bandwidth / 1e9:.0f} GB/s")
    return head + ": " + "; ".join(parts)


def slice_chips(devices: int, largest: int, torus: Torus) -> int:
    """Chips per slice for a job of `devices` chips: the largest slice of at most `largest`
    chips (the pod, or --gpus-per-node) that divides the job and has a shape in the pod.
    8,192 v5p chips are two slices of 4,096: no 16x20x28 block holds 8,192."""
    return _slice_chips(int(devices), int(largest), torus)


@lru_cache(maxsize=4096)
def _slice_chips(devices: int, largest: int, torus: Torus) -> int:
    for size in sorted((d for d in _divisors(devices) if d <= largest), reverse=True):
        if slice_shape(size, torus.pod, torus.wrap_unit) is not None:
            return size
    return 1


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
