"""TPU slices as ICI tori: slice shapes, where groups lie, what a collective along an axis
reaches, and a search that keeps model parallelism inside a slice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner import comms, topology
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import (
    Layout,
    PlanOptions,
    evaluate,
    layout_context,
    links,
    resolve_hardware,
)
from sextant.planner.models import preset
from sextant.planner.search import enumerate_layouts, search


@pytest.fixture(scope="module")
def cat():
    return load_catalogue(calibration=None)


def _hw(cat, acc, **opts):
    return resolve_hardware(cat, acc, options=PlanOptions(**opts))


def test_slice_shapes_are_the_cloud_topologies(cat):
    pod = cat.accelerator("tpu-v5p").torus
    assert pod is not None and pod.pod == (16, 20, 28)
    shapes = {n: topology.slice_shape(n, pod.pod, pod.wrap_unit) for n in (64, 512, 4096, 8960)}
    assert shapes == {64: (4, 4, 4), 512: (8, 8, 8), 4096: (16, 16, 16), 8960: (16, 20, 28)}
    # No block of a 16x20x28 pod holds 8,192 chips: two slices of 4,096.
    assert topology.slice_shape(8192, pod.pod, pod.wrap_unit) is None
    assert topology.slice_chips(8192, 8960, pod) == 4096
    # The inference chips are 2-D: a v6e pod is one 16x16 slice.
    v6e = cat.accelerator("tpu-v6e").torus
    assert v6e is not None and topology.slice_shape(256, v6e.pod, v6e.wrap_unit) == (16, 16)
    assert topology.slice_shape(512, v6e.pod, v6e.wrap_unit) is None


def test_a_collective_along_one_axis_uses_that_axis_bandwidth(cat):
    v5p = cat.accelerator("tpu-v5p").torus
    v5e = cat.accelerator("tpu-v5e").torus
    assert v5p is not None and v5e is not None
    link = v5p.link_bandwidth
    tp, dp = topology.groups_links(v5p, 64, (4, 16))
    # 4x4x4 with wraparound: tp4 fills one axis (a ring both ways: 2 links' worth), dp16
    # the other two axes (twice that).
    assert tp.bandwidth == pytest.approx(2 * link)
    assert [u.chips for u in tp.axes] == [4]
    assert dp.bandwidth == pytest.approx(4 * link)
    # v5e has wraparound only on a full axis of 16: a 4x16 slice's axis of 4 is a line.
    tp_e, dp_e = topology.groups_links(v5e, 64, (4, 16))
    assert tp_e.bandwidth == pytest.approx(v5e.link_bandwidth)
    assert dp_e.bandwidth == pytest.approx(2 * v5e.link_bandwidth)
    # A group strided over an axis that an inner group shares gets its share of the links.
    _, strided = topology.groups_links(v5p, 4096, (4, 1024))
    assert strided.bandwidth == pytest.approx(2 * link / 4 + 2 * 2 * link)


def test_the_estimator_prices_tp_at_its_axis_bandwidth(cat):
    hw = _hw(cat, "tpu-v5p")
    cost = preset("llama3-8b").cost()
    opts = PlanOptions(global_batch=64)
    lay = Layout(dp=16, tp=4, zero=3).arrays()
    c = layout_context(cost, hw, opts, lay)
    lk = links(c)
    assert float(lk.tp[0][0]) == pytest.approx(2 * hw.torus.link_bandwidth)
    assert float(lk.dp[0][0]) == pytest.approx(4 * hw.torus.link_bandwidth)
    # The TP all-reduce of the estimate is the ring over that one axis.
    m = float(c.tok_dev[0]) * cost.hidden * 2.0
    want = comms.all_reduce(m, 4, *lk.tp[:3])
    got = comms.hier_all_reduce(m, c.tp_in, c.tp_out, lk.tp, lk.inter)
    assert float(got[0]) == pytest.approx(float(want[0]))
    # A slower ICI link makes the step slower.
    slow = _hw(cat, "tpu-v5p")
    slow = type(slow)(**{**{f: getattr(slow, f) for f in slow.__slots__},
                         "accelerator": _with_link(slow.accelerator, 0.25)})
    base = evaluate(cost, hw, PlanOptions(global_batch=64, stack=_blocking()), lay).step
    worse = evaluate(cost, slow, PlanOptions(global_batch=64, stack=_blocking()), lay).step
    assert float(worse[0]) > float(base[0])


def _with_link(acc, factor):
    from dataclasses import replace

    return replace(acc, torus=replace(acc.torus, link_bandwidth=acc.torus.link_bandwidth * factor))


def _blocking():
    from sextant.planner.profiles import profile

    return profile("generic")


def test_the_search_never_puts_tp_across_slices(cat):
    hw = _hw(cat, "tpu-v5p", devices_per_node=256)
    cost = preset("llama3-70b").cost()
    opts = PlanOptions(global_batch=2048)
    lay = enumerate_layouts(cost, 2048, 2048, devices_per_node=256, torus=True)
    assert len(lay["dp"])
    assert np.all(lay["tp"] * lay["cp"] <= 256)
    assert np.all(lay["pp"] == 1)
    res = evaluate(cost, hw, opts, lay)
    assert not np.any(res.part("tp_comm").crosses)
    best = search(cost, hw, opts, 2048)
    i = best.best()
    assert i is not None
    chosen = best.layout(i)
    assert chosen.pp == 1 and chosen.tp * chosen.cp <= 256
    # A pinned pipeline is still the user's to ask for.
    pinned = enumerate_layouts(cost, 2048, 2048, devices_per_node=256, torus=True,
                               fixed={"pp": 2})
    assert len(pinned["dp"]) and np.all(pinned["pp"] == 2)


def test_llama3_70b_on_a_v5p_pod_is_a_slice_layout(capsys):
    rc = main(["plan", "--model", "llama3-70b", "--accelerator", "tpu-v5p", "--gpus", "8960",
               "--mfu", "0.4", "--json", "--no-curve"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    lay = doc["layout"]
    assert lay["pp"] == 1 and lay["tp"] <= 16
    sl = doc["hardware"]["slices"]
    assert sl["count"] * sl["chips"] == 8960 and sl["shape"] == [16, 20, 28]
    assert doc["mfu_target"]["reachable"]
    # 2,048 sequences do not split over 8,960 chips without a pipeline: the batch is a
    # per-chip batch times the chips, and the plan says so.
    assert doc["assumptions"]["global_batch"] % (8960 // lay["tp"]) == 0
    assert any("per_device_batch_size" in w for w in doc["warnings"])


def test_a_given_batch_is_kept(capsys):
    rc = main(["plan", "--model", "llama3-70b", "--accelerator", "tpu-v5p", "--gpus", "8960",
               "--global-batch", "2048", "--no-curve"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "splits the global batch 2048 without a pipeline" in err
    assert len(err.strip().splitlines()) == 1


def test_a_bad_ici_table_is_one_clear_error(tmp_path):
    path = tmp_path / "cat.toml"
    path.write_text('schema = 1\n[accelerators.tpu-v5p.ici]\ntorus = [16, 20, 28, 4]\n')
    with pytest.raises(UserError, match="torus must be 2 or 3 integers"):
        load_catalogue(path, calibration=None)


def test_host_memory_is_counted_per_tpu_host(cat):
    # A v5p host holds 4 chips (2x2x1), not the slice: offloaded states per host are 4
    # chips' worth.
    hw = _hw(cat, "tpu-v5p")
    cost = preset("llama3-8b").cost()
    res = evaluate(cost, hw, PlanOptions(global_batch=64),
                   Layout(dp=64, zero=3, offload="optimizer").arrays())
    assert float(res.host.per_node[0]) == pytest.approx(4 * float(res.host.offload[0]))
