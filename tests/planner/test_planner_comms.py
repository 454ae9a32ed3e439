"""Collective costs: nccl-tests bus-bandwidth factors and the alpha-beta model."""

from __future__ import annotations

import numpy as np
import pytest

from sextant.planner import comms


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1024])
def test_bus_bandwidth_factors(n):
    assert float(comms.bus_factor("all_reduce", n)) == pytest.approx(2 * (n - 1) / n)
    assert float(comms.bus_factor("all_gather", n)) == pytest.approx((n - 1) / n)
    assert float(comms.bus_factor("reduce_scatter", n)) == pytest.approx((n - 1) / n)


@pytest.mark.parametrize("n", [2, 8, 100])
def test_ring_costs_are_bus_factor_times_bytes_over_bandwidth(n):
    m, bw = 1e9, 1e11
    assert float(comms.ring_all_reduce(m, n, bw, 0.0)) == pytest.approx(2 * (n - 1) / n * m / bw)
    assert float(comms.ring_reduce_scatter(m, n, bw, 0.0)) == pytest.approx((n - 1) / n * m / bw)
    assert float(comms.ring_all_gather(m, n, bw, 0.0)) == pytest.approx((n - 1) / n * m / bw)
    # Latency: 2(n-1) steps for all-reduce, (n-1) for the others.
    assert float(comms.ring_all_reduce(0, n, bw, 1e-6)) == pytest.approx(2 * (n - 1) * 1e-6)
    assert float(comms.ring_all_gather(0, n, bw, 1e-6)) == pytest.approx((n - 1) * 1e-6)


def test_one_rank_costs_nothing():
    assert float(comms.all_reduce(1e9, 1, 1e9, 1e-5, 1e-5)) == 0
    assert float(comms.hier_all_reduce(1e9, 1, 1, (1e9, 1e-5, 0), (1e9, 1e-5, 0))) == 0


def test_all_reduce_takes_the_cheaper_of_ring_and_tree():
    # Small message, many ranks: latency-bound, the tree's log2(n) steps win.
    small = float(comms.all_reduce(1e3, 1024, 1e10, 1e-5))
    assert small == pytest.approx(float(comms.tree_all_reduce(1e3, 1024, 1e10, 1e-5)))
    # Large message: bandwidth-bound, the ring's 2(n-1)/n < 2/0.9 wins.
    large = float(comms.all_reduce(1e10, 8, 1e10, 1e-5))
    assert large == pytest.approx(float(comms.ring_all_reduce(1e10, 8, 1e10, 1e-5)))


def test_hierarchical_on_one_node_is_flat():
    intra, inter = (3e11, 3e-6, 8e-6), (2.5e10, 1e-5, 8e-6)
    flat = comms.all_reduce(1e9, 8, *intra)
    assert float(comms.hier_all_reduce(1e9, 8, 1, intra, inter)) == pytest.approx(float(flat))


def test_hierarchical_volume():
    # RS + AG inside the node (bus factor (n-1)/n each) plus the all-reduce of 1/n_intra.
    intra, inter = (1e11, 0.0, 0.0), (1e10, 0.0, 0.0)
    m, n_in, n_out = 8e9, 8, 16
    expected = 2 * (7 / 8) * m / 1e11 + 2 * (15 / 16) * (m / 8) / 1e10
    got = float(comms.hier_all_reduce(m, n_in, n_out, intra, inter))
    assert got == pytest.approx(expected)
    assert np.isfinite(got)
