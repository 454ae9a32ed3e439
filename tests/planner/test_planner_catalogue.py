"""The hardware catalogue: one data file, every entry cited, user overrides, calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue

REQUIRED_ACCELERATORS = {
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "h800",
    "h20",
    "b200",
    "mi300x",
    "tpu-v4",
    "tpu-v5e",
    "tpu-v5p",
    "ascend-910b",
    "apple-m2-ultra",
    "apple-m4-max",
    "cpu-local",
}
REQUIRED_LINKS = {
    "nvlink3",
    "nvlink4",
    "nvlink5",
    "nvlink4-h800",
    "pcie4",
    "pcie5",
    "ib-hdr",
    "ib-ndr",
    "ethernet-10g",
    "ethernet-25g",
    "ethernet-100g",
    "ethernet-400g",
    "ici-v4",
    "loopback",
}


def test_catalogue_covers_the_issue_and_cites_sources():
    cat = load_catalogue(calibration=None)
    assert REQUIRED_ACCELERATORS <= set(cat.accelerators)
    assert REQUIRED_LINKS <= set(cat.links)
    for acc in cat.accelerators.values():
        assert acc.source
        if not acc.measured:
            assert acc.peak_flops and acc.memory_bytes > 0
    for link in cat.links.values():
        assert link.source
    assert cat.price_date and "not a quote" in cat.price_basis
    assert cat.price("h100-sxm") > 0


def test_published_figures():
    cat = load_catalogue(calibration=None)
    assert cat.accelerators["a100-80gb"].peak("bf16") == 312e12
    assert cat.accelerators["h100-sxm"].peak("bf16") == pytest.approx(989.4e12)
    assert cat.links["ib-ndr"].bandwidth == 50e9
    assert cat.links["ethernet-10g"].bandwidth == 1.25e9


def test_the_h20_is_a_hopper_with_a_seventh_of_the_compute_and_more_memory():
    cat = load_catalogue(calibration=None)
    h20, h100 = cat.accelerators["h20"], cat.accelerators["h100-sxm"]
    assert not h20.verified and h20.architecture == "hopper"
    assert h20.peak("bf16") < h100.peak("bf16") / 6
    assert h20.memory_bytes > h100.memory_bytes and h20.memory_bw > h100.memory_bw


def test_the_h800_is_an_h100_with_a_slower_nvlink():
    """Same peaks and memory; NVLink at DeepSeek-V3's 160 GB/s achievable: a tensor-parallel
    layout inside the node pays more for its all-reduces, and the plan says the figures are
    not vendor-checked."""
    from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
    from sextant.planner.models import preset

    cat = load_catalogue(calibration=None)
    h800, h100 = cat.accelerators["h800"], cat.accelerators["h100-sxm"]
    assert h800.peak_flops == {k: v for k, v in h100.peak_flops.items() if k != "fp32"}
    assert not h800.verified and cat.links["nvlink4-h800"].collective_bandwidth == 160e9
    opts = PlanOptions(global_batch=64)
    cost = preset("llama3-70b").cost()
    lay = Layout(dp=8, tp=8, zero=1, mbs=1)
    tp = {key: evaluate_one(cost, resolve_hardware(cat, key, options=opts), opts, lay)
          .seconds("tp_comm") for key in ("h800", "h100-sxm")}
    assert tp["h800"] > 2 * tp["h100-sxm"]


def test_unknown_names_list_the_allowed_ones():
    cat = load_catalogue(calibration=None)
    with pytest.raises(UserError, match="unknown accelerator 'h900'.*a100-40gb"):
        cat.accelerator("h900")
    with pytest.raises(UserError, match="unknown network/link 'ib-xdr'.*ib-ndr"):
        cat.link("ib-xdr")
    with pytest.raises(UserError, match="no published fp32 peak"):
        cat.accelerator("tpu-v4").peak("fp32")


def test_measured_entries_need_a_calibration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cat = load_catalogue()
    with pytest.raises(UserError, match="sextant calibrate"):
        cat.accelerator("cpu-local")
    with pytest.raises(UserError, match="sextant calibrate"):
        cat.link("loopback")


def test_calibration_fills_this_machine(tmp_path):
    calib = {
        "schema": 1,
        "host": {"cores": 4, "memory_bytes": 16e9},
        "gemm": {"numpy": {"flops_all_threads": 200e9, "flops_1_thread": 60e9}},
        "memory_bw_bytes_per_s": 20e9,
        "allreduce": {"alpha_s": 100e-6, "beta_s_per_byte": 1e-9},
    }
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(calib))
    cat = load_catalogue(calibration=path)
    acc = cat.accelerator("cpu-local")
    assert acc.peak("fp32") == 200e9 and acc.memory_bytes == 16e9 and acc.shared_node
    link = cat.link("loopback")
    assert link.bandwidth == pytest.approx(1e9) and link.latency == pytest.approx(50e-6)


def test_user_file_overrides_one_price(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[prices]\nh100-sxm = 1.99\n")
    cat = load_catalogue(override=path, calibration=None)
    assert cat.price("h100-sxm") == 1.99
    assert cat.price("a100-80gb") == load_catalogue(calibration=None).price("a100-80gb")
    bad = tmp_path / "bad.toml"
    bad.write_text("[accelerators.x]\nname = 'x'\nbf16_tflops = 1\nmemory_gib = 1\n")
    with pytest.raises(UserError, match="cite a source"):
        load_catalogue(override=bad, calibration=None)


def test_advisor_reads_peaks_from_the_catalogue():
    # One source of truth for peak FLOP/s: the advisor names catalogue entries.
    from sextant.advisor import load_rules
    from sextant.planner.catalogue import load_catalogue

    rules = load_rules()
    cat = load_catalogue(calibration=None)
    for hw, key in rules.accelerators.items():
        assert key in cat.accelerators, hw
        if not cat.accelerators[key].measured:
            assert rules.peak_tflops(hw) * 1e12 in cat.accelerators[key].peak_flops.values()
    rules_text = (Path(__file__).resolve().parents[2] / "sextant/advisor/rules.toml").read_text()
    assert "tflops" not in rules_text.split("[hardware.nvidia]")[1].split("[[constraint]]")[0]


def test_a_sweep_must_be_well_formed_and_cited(tmp_path):
    base = "[links.nvlink3]\n"
    cases = {
        "sweep = [[1, 2]]\n": "sweep must be a list",
        "sweep = [[2, 1], [1, 2]]\n": "sizes increasing",
        "sweep = [[1, 1], [2, 2]]\nsweep_source = ''\n": "must cite a source",
        "sweep = [[1, 1], [2, 2]]\nsweep_source = 'x'\nsweep_layout = [4, 2]\n": (
            "needs sweep_intra_link"
        ),
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.toml"
        path.write_text(base + text)
        with pytest.raises(UserError, match=message):
            load_catalogue(override=path, calibration=None)


def test_links_with_published_sweeps_carry_a_ramp():
    cat = load_catalogue(calibration=None)
    for key in ("nvlink3", "nvlink4", "nvlink5", "ib-ndr"):
        link = cat.link(key)
        assert link.ramp is not None and "29c6b70" in link.sweep_source
        assert 0 < min(link.ramp[1]) and max(link.ramp[1]) <= 1.0
    assert cat.link("ib-hdr").ramp is None  # no published sweep: plateau at every size


def test_a_link_without_a_published_benchmark_is_said_to_be_nominal(capsys):
    from sextant.cli import main

    cat = load_catalogue(calibration=None)
    assert not cat.link("ethernet-100g").achievable_published
    assert cat.link("nvlink4").achievable_published and cat.link("ib-ndr").achievable_published
    assert cat.link("ib-hdr").achievable_published  # NVIDIA's 24 GB/s per port, no sweep
    base = ["plan", "--model", "llama2-7b", "--gpus", "64", "--no-curve"]
    assert main([*base, "--accelerator", "a100-80gb", "--network", "ethernet-100g"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ethernet-100g: no published collective benchmark" in out
    assert "nominal 12.5 GB/s" in out
    assert main([*base, "--accelerator", "h100-sxm", "--network", "ib-ndr"]) == 0
    assert "no published collective benchmark" not in capsys.readouterr().out


def test_the_plan_gives_each_link_its_nominal_and_its_achievable_rate(capsys):
    import json

    from sextant.cli import main

    argv = ["plan", "--model", "llama3-70b", "--gpus", "64", "--accelerator", "h800",
            "--no-curve"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    hw = doc["hardware"]
    # DeepSeek-V3's achievable 160 GB/s for the H800's NVLink, beside its nominal 200.
    assert (hw["intra_bw"], hw["intra_bus_bw"]) == (200e9, 160e9)
    assert doc["time"]["main_overhead"].startswith("TP all-reduces on nvlink4-h800")
    assert "160 GB/s/device" in doc["time"]["main_overhead"]
