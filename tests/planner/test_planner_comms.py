"""Collective costs: nccl-tests bus-bandwidth factors and the alpha-beta model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sextant.planner import comms
from sextant.planner.profiles import PROFILES


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
    # NCCL's ring over all n ranks, pipelined: 2(n-1)/n x M at the slowest hop's rate,
    # min(intra, n_intra x inter per rank); not the sum of intra- and inter-node phases.
    intra, inter = (1e11, 0.0, 0.0), (1e10, 0.0, 0.0)
    m, n_in, n_out = 8e9, 8, 16
    n = n_in * n_out
    expected = 2 * (n - 1) / n * m / min(1e11, 8 * 1e10)
    got = float(comms.hier_all_reduce(m, n_in, n_out, intra, inter))
    assert got == pytest.approx(expected)
    assert np.isfinite(got)
    # One rank per node: the network alone sets the rate.
    got1 = float(comms.hier_reduce_scatter(m, 1, 16, intra, inter))
    assert got1 == pytest.approx((15 / 16) * m / 1e10)


def test_multi_node_all_reduce_matches_the_published_b200_measurement():
    # 4 nodes x 8 B200: NVLink 5 ring 682.2 GB/s (8 GPUs, NVLS off), 8 x 50 GB/s EFA v4 per
    # node; measured 381.80 GB/s bus bandwidth at 16 GiB (Bekman, ml-engineering,
    # network/README.md). The pipelined ring predicts 400 (+5%); summed phases gave 307.
    m = 16 * 2**30
    t = float(comms.hier_all_reduce(m, 8, 4, (682.2e9, 3.4e-6, 8.4e-6), (50e9, 9.6e-6, 8.4e-6)))
    busbw = 2 * 31 / 32 * m / t
    assert busbw == pytest.approx(381.8e9, rel=0.06)


@pytest.mark.parametrize(
    "zero, schedule, expected",
    [
        # (all-reduce, reduce-scatter, all-gather) per step with m = 4 micro-batches
        (0, "zero", (1, 0, 0)),
        (1, "zero", (0, 1, 1)),  # Megatron distributed optimizer / DeepSpeed
        (2, "zero", (0, 4, 1)),
        (3, "zero", (0, 4, 8)),
        (1, "torch", (1, 0, 1)),  # ZeroRedundancyOptimizer over DDP
        (2, "torch", (0, 4, 4)),
        (2, "torch-no-sync", (0, 1, 4)),  # sextant's backends: reduce on the last micro-batch
        (3, "torch-no-sync", (0, 1, 8)),
    ],
)
def test_dp_collectives_table(zero, schedule, expected):
    c = comms.dp_collectives(zero, 4, schedule)
    assert (float(c["all_reduce"]), float(c["reduce_scatter"]), float(c["all_gather"])) == expected


def test_measured_and_planned_bytes_come_from_one_table():
    from sextant.measure.comm import bytes_per_step
    from sextant.strategy import Strategy

    p = 136_960  # gpt-tiny (docs/levers.md)
    got = bytes_per_step(Strategy(framework="torch", parallel="zero1", workers=2), p)
    want = comms.dp_bytes_sent(1, 2, 4.0 * p, 4.0 * p, 1, "torch-no-sync")
    assert got["total"] == pytest.approx(float(want["total"]))
    # docs/levers.md: 0.52 MB for dp and zero2, 0.78 MB for zero1 and fsdp (2 ranks).
    assert got["total"] == pytest.approx(1.5 * 4 * p)
    fsdp = bytes_per_step(Strategy(framework="torch", parallel="fsdp", workers=2), p)
    assert fsdp["total"] == pytest.approx(1.5 * 4 * p)


# --- bandwidth versus message size (the ramp fitted to published sweeps) -------------------


def _tuple(link):
    return (link.collective_bandwidth, link.latency, link.call_latency, link.ramp)


@pytest.mark.parametrize("key", ["nvlink3", "nvlink4", "nvlink5", "ib-ndr"])
def test_ramp_reproduces_its_published_sweep(key):
    # In sample: with the ramp fitted to a sweep, the planner's all-reduce gives that sweep's
    # bus bandwidth back at every point where the sweep is below the catalogue plateau (where
    # it is above, e.g. NVLS, the ramp stays at 1 and the plateau is the answer).
    from sextant.planner.catalogue import load_catalogue

    cat = load_catalogue(calibration=None)
    link = cat.link(key)
    g, nodes = link.sweep_layout
    intra = cat.link(link.sweep_intra_link) if nodes > 1 else link
    n = g * nodes
    for (m, measured), e in zip(link.sweep, link.ramp[1]):
        t = float(comms.hier_all_reduce(m, g, nodes, _tuple(intra), _tuple(link)))
        busbw = 2 * (n - 1) / n * m / t
        if e < 0.999:
            assert busbw == pytest.approx(measured, rel=1e-3), (key, m)
        else:
            assert busbw <= measured * 1.001 or busbw <= link.collective_bandwidth


def test_ramp_slows_mid_size_collectives_and_leaves_large_ones():
    # One 8 x A100 node: 16 MiB measured 106.16 GB/s (nccl-tests), which the alpha-beta
    # model alone put at 162; at 16 GiB both are at the 235 GB/s plateau.
    from sextant.planner.catalogue import load_catalogue

    nv3 = load_catalogue(calibration=None).link("nvlink3")
    plain = (nv3.collective_bandwidth, nv3.latency, nv3.call_latency)
    for m, ratio in ((16 * 2**20, 1.3), (16 * 2**30, 1.0)):
        slow = float(comms.all_reduce(m, 8, *_tuple(nv3)))
        fast = float(comms.all_reduce(m, 8, *plain))
        assert slow >= fast * ratio * 0.999
    # The ramp is indexed by bytes per rank: the same buffer over more ranks is slower per
    # byte (a ZeRO-3 layer gathered over 1,536 ranks, not 8).
    e8 = float(comms.ramp_efficiency(nv3.ramp, 64 * 2**20 / 8))
    e1536 = float(comms.ramp_efficiency(nv3.ramp, 64 * 2**20 / 1536))
    assert e1536 < e8
    assert comms.ramp_efficiency(None, 123.0) == 1.0


def test_a_node_with_half_the_ports_reaches_half_the_bus_bandwidth_at_the_achievable_rate():
    # Two nodes of 8 A100 over InfiniBand HDR at 16 GiB: with a port per GPU the network
    # bounds the ring at 8 x 24 GB/s (HDR's achievable rate, not its nominal 25); with 4 ports
    # a node, at 4 x 24.
    from sextant.planner.evaluators import all_reduce_busbw_gbs

    query = {"accelerator": "a100-80gb", "network": "ib-hdr", "ranks_per_node": 8, "nodes": 2,
             "payload_bytes": 16.0 * 2**30}
    eight = all_reduce_busbw_gbs(**query)
    four = all_reduce_busbw_gbs(**query, nics_per_node=4)
    assert 0.9 * 8 * 24 < eight <= 8 * 24
    assert 0.9 * 4 * 24 < four <= 4 * 24
    assert four == pytest.approx(eight / 2, rel=0.02)


def test_gradient_buckets_follow_the_framework_default():
    assert comms.dp_bucket_bytes("torch", None, 4) == 25 * 2**20  # DDP bucket_cap_mb=25
    assert comms.dp_bucket_bytes("deepspeed", None, 2) == 1e9  # 5e8 elements x 2 bytes
    assert comms.dp_bucket_bytes("megatron", None, 4) == 0.0  # one call
    assert comms.dp_bucket_bytes("torch", 0, 4) == 0.0


def test_ddp_buckets_cost_more_than_one_call_and_can_be_turned_off():
    # DDP over 4 nodes: 25 MiB buckets run at the ramp's rate for ~0.8 MiB per rank.
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
    from sextant.planner.models import preset

    shape = preset("llama2-7b")
    cat = load_catalogue(calibration=None)
    lay = Layout(dp=32, tp=1, pp=1, zero=0, mbs=1, recompute="full")
    dp = {}
    for bucket in (None, 0):
        opts = PlanOptions(
            global_batch=32, stack=replace(PROFILES["torchtitan"], dp_bucket_bytes=bucket)
        )
        hw = resolve_hardware(cat, "a100-80gb", "ib-hdr", options=opts)
        dp[bucket] = float(evaluate_one(shape.cost(), hw, opts, lay).dp_comm)
    assert dp[None] > dp[0] * 1.05


def _tp_case(pp: int, tp: int = 4, batch: int = 8):
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
    from sextant.planner.models import megatron_gpt

    shape = megatron_gpt(n_layers=8, d_model=2048, n_heads=16, global_batch=batch)
    opts = PlanOptions(global_batch=batch)
    hw = resolve_hardware(load_catalogue(calibration=None), "a100-80gb", "ib-hdr", options=opts)
    lay = Layout(dp=1, tp=tp, pp=pp, mbs=1)
    f = evaluate_one(shape.cost(), hw, opts, lay)
    le = (hw.intra.collective_bandwidth, hw.intra.latency, hw.intra.call_latency, hw.intra.ramp)
    tokens = shape.seq_len
    ar_h = float(comms.all_reduce(tokens * 2048 * 2.0, tp, *le))
    ar_ce = float(comms.all_reduce(tokens * 4.0, tp, *le))
    return f.seconds("tp_comm"), ar_h, ar_ce, batch, shape.n_layers // pp


@pytest.mark.parametrize("pp", [1, 2])
def test_tensor_parallel_time_counts_the_vocabulary_parallel_layers(pp):
    """Per micro-batch: 4 all-reduces per layer (no recomputation), the embedding's and the
    output layer's all-reduce of tokens x h (both on one stage, one on the last stage of a
    pipeline) and the cross-entropy's three per-token fp32 all-reduces."""
    got, ar_h, ar_ce, m, layers = _tp_case(pp)
    vocab = 2 if pp == 1 else 1
    expected = m * (layers * 4 * ar_h + vocab * ar_h + 3 * ar_ce)
    assert got == pytest.approx(expected, rel=1e-9)
    # Without the vocabulary-parallel terms the figure would be short by this much.
    assert got - m * layers * 4 * ar_h == pytest.approx(m * (vocab * ar_h + 3 * ar_ce))
