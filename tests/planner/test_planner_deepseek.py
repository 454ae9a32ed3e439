"""The DeepSeek-V3 preset: MLA, shared and routed experts, dense first layers, and expert
parallelism in the search."""

from __future__ import annotations

import numpy as np
import pytest

from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate, resolve_hardware
from sextant.planner.models import TransformerShape, preset
from sextant.planner.search import enumerate_layouts

V3 = preset("deepseek-v3")


def test_parameter_counts_match_the_report():
    # arXiv:2412.19437 §4.2: "671B total parameters, of which 37B are activated for each
    # token" (without the multi-token-prediction module).
    assert V3.total_params() == pytest.approx(671e9, rel=0.01)
    # The active count as the 6N FLOPs count it (every multiplied parameter: the input
    # embedding is looked up) and as a parameter count (with it): the report prints both
    # rounded to the billion, 37.
    matmul = V3.active_params() - V3.embedding_params()
    assert round(matmul / 1e9) == 37
    assert int(V3.active_params() // 1e9) == 37
    assert 6.0 * matmul == pytest.approx(
        V3.cost().model_flops_per_token - V3.cost().attention_flops_per_token
    )


def test_mla_attention_is_the_papers_projections():
    h, nh, dh, dr, dv, dq, dc = 7168, 128, 128, 64, 128, 1536, 512
    want = (
        h * dq  # W^DQ
        + dq * nh * (dh + dr)  # W^UQ and W^QR
        + h * (dc + dr)  # W^DKV and W^KR
        + dc * nh * (dh + dv)  # W^UK and W^UV
        + nh * dv * h  # W^O
    )
    assert V3._attention_params() == want
    # One MoE layer's tensors: attention, 256 routed + 1 shared experts, router, norms.
    moe_layer = (
        want + 257 * 3 * h * 2048 + 256 * h + 2 * h + dq + dc
    )
    assert sum(V3.layer_tensors()) == moe_layer


def test_dense_first_layers_and_shared_experts_are_counted_once():
    h, f, fe = 7168, 18432, 2048
    dense_only = TransformerShape(**{**_fields(V3), "n_dense_layers": 0})
    # Three MoE layers become dense: each loses 256 routed + 1 shared experts and the router
    # and gains one dense MLP.
    diff = dense_only.total_params() - V3.total_params()
    assert diff == 3 * (257 * 3 * h * fe + 256 * h - 3 * h * f)
    # The shared expert is active for every token, the routed ones top_k of 256.
    no_shared = TransformerShape(**{**_fields(V3), "n_shared_experts": 0})
    assert V3.active_params() - no_shared.active_params() == 58 * 3 * h * fe


def _fields(shape):
    return {k: getattr(shape, k) for k in TransformerShape.__slots__}


def test_bad_moe_fields_are_one_clear_error():
    with pytest.raises(UserError, match="n_dense_layers needs experts"):
        TransformerShape(**{**_fields(preset("llama3-8b")), "n_dense_layers": 2})
    with pytest.raises(UserError, match="n_kv_heads must equal n_heads"):
        TransformerShape(**{**_fields(V3), "n_kv_heads": 8})


def test_expert_parallelism_is_searched_and_splits_the_experts():
    cost = V3.cost()
    lay = enumerate_layouts(cost, 2048, 15360, fixed={"tp": 1, "pp": 16, "zero": 1, "mbs": 1,
                                                        "rc": 0})
    assert set(np.unique(lay["ep"])) >= {1, 2, 4, 8, 16, 32, 64, 128}
    hw = resolve_hardware(load_catalogue(calibration=None), "h800")
    opts = PlanOptions(global_batch=15360)
    base = {"dp": 128, "pp": 16, "zero": 1, "mbs": 1}
    one = evaluate(cost, hw, opts, Layout(**base).arrays())
    ep64 = evaluate(cost, hw, opts, Layout(**base, ep=64).arrays())
    # DeepSeek-V3's own layout (§3.2: PP 16, EP 64, ZeRO-1 DP): the experts' states split
    # 64 ways, the all-to-alls paid.
    assert float(ep64.params_per_device[0]) < float(one.params_per_device[0]) / 8
    assert float(ep64.seconds("ep_comm")[0]) > 0.0 and float(one.seconds("ep_comm")[0]) == 0.0
