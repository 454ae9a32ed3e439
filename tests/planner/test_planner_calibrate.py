"""Calibration: the alpha-beta fit, and a real 2-process gloo all-reduce."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from sextant.planner.calibrate import fit_alpha_beta, measure_allreduce, message_sizes


def test_message_sizes_span_1kb_to_64mb():
    sizes = message_sizes(64 * 2**20)
    assert sizes[0] == 1024 and sizes[-1] == 64 * 2**20 and len(sizes) == 9


def test_fit_recovers_alpha_and_beta():
    sizes = np.array(message_sizes(64 * 2**20), dtype=float)
    alpha, beta = 50e-6, 2e-10
    fit = fit_alpha_beta(sizes, alpha + beta * sizes)
    assert fit["alpha_s"] == pytest.approx(alpha, rel=1e-9)
    assert fit["beta_s_per_byte"] == pytest.approx(beta, rel=1e-9)
    assert fit["max_rel_residual"] < 1e-9 and fit["r2"] == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_real_allreduce_between_two_gloo_processes():
    data = measure_allreduce(max_bytes=64 * 1024, timeout=90)
    assert data["backend"] == "gloo" and data["world_size"] == 2
    assert data["sizes_bytes"] == [1024, 4096, 16384, 65536]
    assert all(t > 0 for t in data["times_s"])
    assert np.isfinite(data["fit"]["alpha_s"])
    json.dumps(data)


def test_the_calibration_document_is_typed_at_the_file_boundary(tmp_path):
    """A calibration file reads into a Calibration and writes back to the same JSON, the
    measurement's own keys included; a malformed one is a one-line error."""
    from sextant.core.errors import UserError
    from sextant.planner.calibration_doc import Calibration, from_dict
    from sextant.planner.catalogue import load_catalogue, read_calibration

    raw = {
        "schema": 1, "created": "2026-12-05T12:00:00+0000",
        "host": {"cpu": "test cpu", "cores": 4, "memory_bytes": 8e9, "python": "3.11",
                 "platform": "linux"},
        "gemm": {"numpy": {"n": 1024, "dtype": "float32", "version": "2.0",
                           "flops_1_thread": 5e10, "flops_all_threads": 2e11, "threads": 4}},
        "memory_bw_bytes_per_s": 1e10,
        "allreduce": {"sizes_bytes": [1024.0, 4096.0], "times_s": [1e-4, 2e-4],
                      "alpha_s": 5e-5, "beta_s_per_byte": 1e-9,
                      "bandwidth_bytes_per_s": 1e9, "median_rel_residual": 0.01,
                      "max_rel_residual": 0.02, "backend": "gloo",
                      "placement": {"hosts": 1}},
        "device": None, "seconds": 3.0, "notes": [],
    }
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(raw))
    doc = read_calibration(path)
    assert isinstance(doc, Calibration) and doc.host.cores == 4 and doc.path == str(path)
    assert doc.allreduce is not None and doc.allreduce.extra["placement"] == {"hosts": 1}
    assert json.loads(json.dumps(doc.to_dict())) == raw
    cat = load_catalogue(calibration=path)
    assert cat.accelerator("cpu-local").peak("fp32") == 2e11
    assert cat.link("loopback").bandwidth == pytest.approx(1e9)
    slower = cat.with_loopback_fit(5e-5, 2e-9)
    assert slower.link("loopback").bandwidth == pytest.approx(5e8)
    for bad in ({"schema": 2}, {**raw, "host": [1]}, {**raw, "memory_bw_bytes_per_s": "x"}):
        with pytest.raises(UserError) as err:
            from_dict(bad, "calibration.json")
        assert "\n" not in str(err.value)
