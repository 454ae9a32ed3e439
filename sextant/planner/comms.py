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

Hierarchical all-reduce (the 2D scheme of NCCL and Horovod): reduce-scatter inside the node,
all-reduce of the 1/n_intra shard across nodes, all-gather inside the node.
"""

from __future__ import annotations

import numpy as np

TREE_BW_FACTOR = 0.9  # NCCL tuning.cc: busBw *= .9 for Tree


def bus_factor(collective: str, n):
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor."""
    n = np.asarray(n, dtype=np.float64)
    if collective == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1.0) / n
    raise ValueError(f"unknown collective {collective!r}")


def _arr(x):
    return np.asarray(x, dtype=np.float64)


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


def all_reduce(m, n, bw, lat, call=0.0):
    n = _arr(n)
    best = np.minimum(ring_all_reduce(m, n, bw, lat), tree_all_reduce(m, n, bw, lat))
    return np.where(n > 1, best + call, 0.0)


def reduce_scatter(m, n, bw, lat, call=0.0):
    n = _arr(n)
    return np.where(n > 1, ring_reduce_scatter(m, n, bw, lat) + call, 0.0)


all_gather = reduce_scatter


def hier_all_reduce(m, n_intra, n_inter, intra, inter):
    """All-reduce over n_intra ranks per node times n_inter nodes. `intra`/`inter` are
    (bandwidth, latency, call) triples; the inter bandwidth is the per-rank share of the
    node's NICs."""
    m, n_intra, n_inter = _arr(m), _arr(n_intra), _arr(n_inter)
    flat = all_reduce(m, n_intra, *intra)
    two_level = (
        reduce_scatter(m, n_intra, *intra)
        + all_reduce(m / n_intra, n_inter, *inter)
        + all_gather(m, n_intra, *intra)
    )
    return np.where(n_inter > 1, two_level, flat)


def hier_reduce_scatter(m, n_intra, n_inter, intra, inter):
    """Reduce-scatter (or all-gather: same cost) over n_intra x n_inter ranks."""
    m, n_intra, n_inter = _arr(m), _arr(n_intra), _arr(n_inter)
    return reduce_scatter(m, n_intra, *intra) + reduce_scatter(m / n_intra, n_inter, *inter)


hier_all_gather = hier_reduce_scatter


def p2p(m, bw, lat, call=0.0):
    """One point-to-point send of m bytes (pipeline activations)."""
    return call + lat + _arr(m) / bw
