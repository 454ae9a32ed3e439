"""`sextant calibrate --device gpu` on its CPU path: the workload's GEMM shapes, their
FLOP-weighted efficiency from real torch products, the bus bandwidth of a real all-reduce
between processes, and a plan that uses a device section. The CUDA path (bf16 products on
the GPU, NCCL between the host's GPUs) runs the same code with device 'cuda';
test_the_gpu_path_on_a_gpu runs it where torch sees a GPU and is skipped elsewhere."""

from __future__ import annotations

import json
import math

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner.calibration_doc import Calibration, DeviceGemm, device_from_dict
from sextant.planner.device_calibration import (
    accelerator_of,
    calibrate_device,
    gemm_shapes,
    kernel_efficiency,
)
from sextant.planner.models import TransformerShape

torch = pytest.importorskip("torch")

H, L, V, T = 128, 2, 512, 64
TINY = TransformerShape(name="tiny", n_layers=L, d_model=H, n_heads=4, n_kv_heads=4,
                        d_ff=4 * H, vocab_size=V, seq_len=T, global_batch=4, gated_mlp=False)


def _flops(shapes):
    return sum(2.0 * m * k * n * count for m, k, n, count in shapes)


def test_the_shapes_are_a_step_of_the_layers_and_the_output_projection():
    """Forward, input gradient and weight gradient of every weight: 6 T x the GEMM
    parameters (12 h^2 per GPT layer, h V for the projection); tp splits them."""
    shapes = gemm_shapes(TINY.cost(), T)
    assert _flops(shapes) == 6.0 * T * (12 * H * H * L + H * V)
    assert _flops(gemm_shapes(TINY.cost(), T, tp=2)) == _flops(shapes) / 2
    assert all(min(m, k, n) >= 1 for m, k, n, _ in shapes)
    with pytest.raises(UserError, match="tokens and tp must be >= 1"):
        gemm_shapes(TINY.cost(), 0)


def test_efficiency_is_the_flop_weighted_rate_over_peak():
    rows = [DeviceGemm(m=2, k=3, n=4, count=2, seconds_best=1.0),
            DeviceGemm(m=1, k=1, n=1, count=4, seconds_best=0.5)]
    assert kernel_efficiency(rows, peak=10.0) == pytest.approx((96 + 8) / 4.0 / 10.0)


def test_device_names_map_to_the_catalogue():
    assert accelerator_of("NVIDIA H200") == "h200"
    assert accelerator_of("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert accelerator_of("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    assert accelerator_of("Some GPU") is None


def test_cpu_path_measures_real_products_and_a_real_all_reduce():
    doc = calibrate_device(cost=TINY.cost(), tokens=T, device="cpu", peak=1e12, world=2,
                           max_bytes=4 * 2**20, timeout=120)
    assert doc.dtype == "fp32" and doc.accelerator is None
    assert len(doc.gemms) == len(gemm_shapes(TINY.cost(), T))
    assert all(g.seconds_best > 0 and math.isfinite(g.flops) for g in doc.gemms)
    assert 0 < doc.kernel_efficiency == pytest.approx(kernel_efficiency(doc.gemms, 1e12))
    ar = doc.allreduce
    assert ar is not None and ar.backend == "gloo" and ar.world == 2
    assert ar.sizes_bytes == (2**20, 4 * 2**20)
    for size, t, bw in zip(ar.sizes_bytes, ar.times_s, ar.busbw_bytes_per_s):
        assert bw == pytest.approx(size / t)  # 2 (n-1)/n = 1 for two ranks
    assert ar.plateau_busbw_bytes_per_s == ar.busbw_bytes_per_s[-1]
    # The document's file round trip keeps every field.
    assert device_from_dict(json.loads(json.dumps(Calibration(device=doc).to_dict()))[
        "device"]) == doc


def test_one_device_measures_no_collective():
    doc = calibrate_device(cost=TINY.cost(), tokens=8, device="cpu", peak=1e12, world=1,
                           timeout=120)
    assert doc.allreduce is None and "one device" in doc.notes[0]


def _calibration(tmp_path, accelerator="h100-sxm", efficiency=0.5, busbw=100e9):
    section = {"device": "gpu", "accelerator": accelerator, "device_name": "test device",
               "workload": "llama3-8b", "tokens": 8192, "tp": 1, "kernel_efficiency":
               efficiency, "allreduce": {"world": 8, "plateau_busbw_bytes_per_s": busbw}}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"schema": 1, "host": {}, "gemm": {}, "device": section}))
    return path


def _plan(capsys, *extra):
    argv = ["plan", "--model", "llama3-8b", "--gpus", "16", "--accelerator", "h100-sxm",
            "--no-curve", "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_plan_uses_the_device_section_of_its_accelerator(tmp_path, capsys):
    base = _plan(capsys, "--calibration", str(_calibration(tmp_path, accelerator="a100-80gb")))
    assert base["assumptions"]["calibrated_on"] is None
    doc = _plan(capsys, "--calibration", str(_calibration(tmp_path)))
    assert doc["assumptions"]["kernel_efficiency"] == 0.5
    assert doc["assumptions"]["calibrated_on"] == "test device"
    assert any("measured by sextant calibrate on test device" in w for w in doc["warnings"])
    assert doc["throughput"]["tokens_per_s"] < base["throughput"]["tokens_per_s"]
    # An explicit --kernel-efficiency wins over the measured one.
    pinned = _plan(capsys, "--calibration", str(_calibration(tmp_path)),
                   "--kernel-efficiency", "0.7")
    assert pinned["assumptions"]["kernel_efficiency"] == 0.7


def test_a_slower_measured_link_slows_the_plan(tmp_path, capsys):
    pins = ("--tp", "8", "--pp", "1", "--zero", "0", "--mbs", "1")
    fast = _plan(capsys, "--calibration", str(_calibration(tmp_path, busbw=400e9)), *pins)
    slow = _plan(capsys, "--calibration", str(_calibration(tmp_path, busbw=20e9)), *pins)
    def tp(doc):
        return next(p["value"] for p in doc["time"]["parts"] if p["name"] == "tp_comm")

    assert tp(slow) > 4 * tp(fast)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU visible to torch")
def test_the_gpu_path_on_a_gpu():
    """bf16 products of Llama 3 8B's layers at 4,096 tokens on the GPU, against the
    catalogue's peak of the device its name maps to: a large GEMM mix runs between a fifth
    of peak and peak."""
    from sextant.planner.models import preset

    doc = calibrate_device(cost=preset("llama3-8b").cost(), tokens=4096, device="gpu",
                           max_bytes=2**26, timeout=600)
    assert doc.dtype == "bf16" and doc.accelerator is not None
    assert 0.2 < doc.kernel_efficiency <= 1.0
    if doc.device_count >= 2:
        assert doc.allreduce is not None and doc.allreduce.backend == "nccl"
