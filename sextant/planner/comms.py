"""Alpha-beta costs of collectives, flat and hierarchical (intra-node then inter-node).

Time of a collective over n ranks on a link of bandwidth B (bytes/s per rank and direction)
and per-step latency alpha, for a buffer of M bytes (the full buffer, as nccl-tests counts it):

    ring all-reduce        2(n-1) alpha + 2(n-1)/n * M / B
    ring reduce-scatter     (n-1) alpha +  (n-1)/n * M / B
    ring all-gather         (n-1) alpha +  (n-1)/n * M / B
    tree all-reduce     2 log2(n) alpha +        2 * M / (0.9 B)

Ring costs: Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective Communication
Operations in MPICH", §4; the factors 2(n-1)/n and (n-1)/n are the "bus bandwidth" factors of
nccl-tests (doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for
all-gather and reduce-scatter). Tree: NCCL's double binary tree (Sanders, Speck and Träff
2009) with the bandwidth NCCL's own tuning model gives it (src/graph/tuning.cc: tree bus
bandwidth * 0.9, algorithm bandwidth = bus bandwidth / 2). The cheaper algorithm is taken, as
NCCL's tuner does. Every call also pays the link's fixed `call_latency` (NCCL baseLat).

Across nodes NCCL runs its rings (and trees) over every rank at once, pipelined through the
NVLink and the network hops: the slowest hop sets the rate (hier_all_reduce).

Bandwidth versus message size (ramp_efficiency): measured, NCCL reaches its plateau bus bandwidth only
at hundreds of MiB, far more slowly than the alpha terms above imply (nccl-tests on 8 A100:
busbw 106 GB/s at 16 MiB, 172 at 64 MiB, 194 at 256 MiB, 229 at 1 GiB, 235 at 16 GiB). The
excess over the alpha-beta time is not a constant (about 70 us at 4 MiB, 185 at 64 MiB, 420
at 256 MiB on that sweep), so a latency term, or the equivalent Hockney curve
bw(m) = bw_peak * m / (m + m_half), cannot fit both ends. A link with a published sweep
therefore carries a piecewise-linear-in-log2 table of the *bandwidth efficiency* left after
the model's own latency terms, fitted point by point so that the model reproduces the sweep at
its rank count (catalogue.py, fit_ramp). It is indexed by the bytes each rank holds (M / n,
the chunk a ring step moves): the alpha-beta ring's own efficiency depends on M / n too, and
it is what makes a per-layer all-gather over 1,536 ranks slower than the same buffer over 8.
Outside the sweep the table is held at its end values (np.interp).
"""

from __future__ import annotations

import numpy as np

from sextant.measure.collective_table import DP_SCHEDULES as DP_SCHEDULES
from sextant.measure.collective_table import bus_factor
from sextant.measure.collective_table import dp_bytes_sent as dp_bytes_sent
from sextant.measure.collective_table import dp_collectives as dp_collectives
from sextant.planner.memory import model_of

TREE_BW_FACTOR = 0.9  # NCCL tuning.cc: busBw *= .9 for Tree


def _arr(x):
    return np.asarray(x, dtype=np.float64)


def ramp_efficiency(ramp, per_rank_bytes):
    """Fraction of the plateau bus bandwidth a collective reaches when each rank holds
    `per_rank_bytes` (1.0 without a ramp)."""
    if ramp is None:
        return 1.0
    s = np.maximum(_arr(per_rank_bytes), 1.0)
    return np.interp(np.log2(s), ramp[0], ramp[1])


def _ramp_of(link):
    return link[3] if len(link) > 3 else None


def ring_all_reduce(m, n, bw, lat):
    m, n = _arr(m), _arr(n)
    return np.where(n > 1, 2.0 * (n - 1.0) * lat + bus_factor("all_reduce", n) * m / bw, 0.0)


def ring_reduce_scatter(m, n, bw, lat):
    m, n = _arr(m), _arr(n)
    return np.where(n > 1, (n - 1.0) * lat + bus_factor("reduce_scatter", n) * m / bw, 0.0)


ring_all_gather = ring_reduce_scatter  # the same cost, the data flowing the other way


def ceil_log2(n):
    """ceil(log2(n)) for integer-valued n >= 1, exactly and without a logarithm: the binary
    exponent of n - 1 (frexp(x) = (f, e) with x = f * 2**e, 0.5 <= f < 1)."""
    return np.frexp(np.maximum(_arr(n), 1.0) - 1.0)[1].astype(np.float64)


def tree_all_reduce(m, n, bw, lat):
    m, n = _arr(m), _arr(n)
    return np.where(n > 1, 2.0 * ceil_log2(n) * lat + 2.0 * m / (TREE_BW_FACTOR * bw), 0.0)


def all_reduce(m, n, bw, lat, call=0.0, ramp=None):
    m, n = _arr(m), _arr(n)
    bw = bw * ramp_efficiency(ramp, m / np.maximum(n, 1.0))
    best = np.minimum(ring_all_reduce(m, n, bw, lat), tree_all_reduce(m, n, bw, lat))
    return np.where(n > 1, best + call, 0.0)


def reduce_scatter(m, n, bw, lat, call=0.0, ramp=None):
    m, n = _arr(m), _arr(n)
    bw = bw * ramp_efficiency(ramp, m / np.maximum(n, 1.0))
    return np.where(n > 1, ring_reduce_scatter(m, n, bw, lat) + call, 0.0)


all_gather = reduce_scatter


def ring_latency(n_intra, n_inter, lat_intra, lat_inter, rounds=1.0):
    """Latency of a ring collective over n_intra x n_inter ranks as NCCL models it
    (src/graph/tuning.cc, ncclTopoTuneModel): the ring passes every rank, nsteps = n - 1
    (x2 for all-reduce), of which nInterSteps = nodes - 1 cross the network at the network's
    per-step latency and the rest at the intra-node one. It grows with the number of ranks,
    not only of nodes: what ZeRO-3 / FSDP pay per layer at a thousand GPUs."""
    n_intra, n_inter = _arr(n_intra), _arr(n_inter)
    n = n_intra * n_inter
    return rounds * ((n - n_inter) * lat_intra + (n_inter - 1.0) * lat_inter)


def _pipelined_bw(n_intra, intra_bw, inter_bw):
    """Bus bandwidth of a collective whose ring (or tree) crosses nodes: NCCL streams every
    channel through NVLink and network hops at once, so the slowest hop sets the rate, not
    the sum of an intra-node and an inter-node phase. A node's n_intra ranks each drive their
    own NIC share (rail-aligned), so the network side offers n_intra x the per-rank share."""
    return np.minimum(intra_bw, np.maximum(n_intra, 1.0) * inter_bw)


def _multi_node_bw(m, n_intra, n, intra, inter):
    """Pipelined bus bandwidth of a collective over n ranks on several nodes, at the ramp's
    efficiency for its M / n: the network's own multi-node ramp where one is published,
    else the intra-node link's (crossing nodes adds latency, it does not remove any)."""
    ramp = _ramp_of(inter)
    if ramp is None:
        ramp = _ramp_of(intra)
    eff = ramp_efficiency(ramp, m / np.maximum(n, 1.0))
    return _pipelined_bw(n_intra, intra[0], inter[0]) * eff


def hier_all_reduce(m, n_intra, n_inter, intra, inter):
    """All-reduce over n_intra ranks per node times n_inter nodes. `intra`/`inter` are
    (bandwidth, latency, call[, ramp]) tuples; the inter bandwidth is the per-rank share of
    the node's NICs; the ramp (bandwidth versus message size) is optional.

    Bandwidth: NCCL's ring over all n ranks, pipelined: each rank moves 2(n-1)/n x M and the
    slowest hop sets the rate, min(intra, n_intra x inter) (_pipelined_bw). The earlier
    model here summed a reduce-scatter inside the node, an all-reduce of the 1/n_intra shard
    across nodes and an all-gather inside the node, as if the phases ran one after another;
    measured, they overlap: 4 nodes of 8 B200 (NVLink 5 ring 682 GB/s, 8 x 50 GB/s EFA per
    node) reach 381.8 GB/s bus bandwidth at 16 GiB (Bekman, Machine Learning Engineering,
    network/README.md), where the summed phases give 307 and the pipelined ring 400 (the
    `collective-b200-4node-*` rows of docs/validation.md). Latency: NCCL's ring model over
    all ranks, or its tree (2 (n_intra - 1) intra + 2 log2(nodes) inter steps, bandwidth
    x 0.9), whichever is cheaper."""
    m, n_intra, n_inter = _arr(m), _arr(n_intra), _arr(n_inter)
    flat = all_reduce(m, n_intra, *intra)
    n = n_intra * n_inter
    bw = _multi_node_bw(m, n_intra, n, intra, inter)
    ring = bus_factor("all_reduce", n) * m / bw + ring_latency(
        n_intra, n_inter, intra[1], inter[1], 2.0
    )
    tree = (
        2.0 * m / (TREE_BW_FACTOR * bw)
        + 2.0 * (n_intra - 1.0) * intra[1]
        + 2.0 * ceil_log2(n_inter) * inter[1]
    )
    two_level = np.minimum(ring, tree) + inter[2]
    return np.where(n_inter > 1, two_level, flat)


def hier_reduce_scatter(m, n_intra, n_inter, intra, inter):
    """Reduce-scatter (or all-gather: same cost) over n_intra x n_inter ranks: NCCL's ring
    over every rank, pipelined through both kinds of hop ((n-1)/n x M at the slowest hop's
    rate), its ring latency over every rank, one call."""
    m, n_intra, n_inter = _arr(m), _arr(n_intra), _arr(n_inter)
    flat = reduce_scatter(m, n_intra, *intra)
    n = n_intra * n_inter
    multi = (
        bus_factor("reduce_scatter", n) * m / _multi_node_bw(m, n_intra, n, intra, inter)
        + ring_latency(n_intra, n_inter, intra[1], inter[1])
        + inter[2]
    )
    return np.where(n_inter > 1, multi, flat)


hier_all_gather = hier_reduce_scatter


def p2p(m, bw, lat, call=0.0, ramp=None):
    """One point-to-point send of m bytes (pipeline activations), at the ramp's efficiency for
    a ring step of m bytes (a ring collective is a chain of such sends; no send/recv sweep is
    catalogued)."""
    m = _arr(m)
    return call + lat + m / (bw * ramp_efficiency(ramp, m))


# --- gradient buckets ------------------------------------------------------------------------
def dp_bucket_bytes(memory_model: str, override: float | None, grad_bytes_per_elem: float):
    """Bytes per gradient bucket (0: one call over the whole buffer): the override, else the
    memory model's default (MemoryModel.dp_bucket_bytes / dp_bucket_elements: torch DDP's
    bucket_cap_mb = 25, torch.nn.parallel.DistributedDataParallel's signature; DeepSpeed's
    zero_optimization.reduce_bucket_size = 5e8 elements, deepspeed/runtime/zero/config.py:
    "Number of elements reduced/allreduced at a time"; 'zero' and 'megatron' reduce the whole
    contiguous gradient buffer in one call, Megatron-LM's DDP over its grad buffer and the
    ZeRO paper's accounting)."""
    if override is not None:
        return float(override)
    model = model_of(memory_model)
    return float(model.dp_bucket_bytes) + float(model.dp_bucket_elements) * grad_bytes_per_elem
