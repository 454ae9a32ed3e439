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
