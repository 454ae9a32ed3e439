"""`sextant plan` and `sextant calibrate` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sextant.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_plan_on_a_preset_prints_tables(capsys):
    rc = main(
        [
            "plan",
            "--model",
            "llama-70b",
            "--gpus",
            "64",
            "--accelerator",
            "h100-sxm",
            "--network",
            "ib-ndr",
            "--tokens",
            "2e12",
            "--search",
            "--top",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for text in ("Memory per device", "Step time", "tokens/s", "days", "Best layouts", "Scaling"):
        assert text in out


def test_bad_accelerator_is_a_one_line_error(capsys):
    rc = main(["plan", "--model", "llama-70b", "--gpus", "8", "--accelerator", "h900"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "unknown accelerator 'h900'" in err and "h100-sxm" in err


def test_bad_network_and_preset(capsys):
    assert main(["plan", "--model", "llama-70b", "--gpus", "8", "--network", "carrier-pigeon"]) == 2
    assert "ib-ndr" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt-9", "--gpus", "8"]) == 2
    assert "llama2-7b" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-70b"]) == 2
    assert "--gpus" in capsys.readouterr().err


def test_plan_json(capsys):
    rc = main(
        [
            "plan",
            "--model",
            "llama3-8b",
            "--gpus",
            "16",
            "--accelerator",
            "a100-80gb",
            "--tokens",
            "1e12",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["memory"]["fits"] is True
    lay = doc["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 16
    assert doc["training"]["days"] > 0 and doc["training"]["cost_usd"] > 0
    # The step is the sum of its parts, each named once, each with the link it runs on.
    parts = doc["time"]["parts"]
    assert [p["name"] for p in parts] == ["compute", "optimizer", "tp_comm", "cp_comm",
                                          "ep_comm", "pp_comm", "bubble", "dp_exposed"]
    assert sum(p["value"] for p in parts) == pytest.approx(doc["time"]["step"], rel=1e-12)
    assert {p["link"] for p in parts if p["name"] in ("tp_comm", "dp_exposed")} <= {
        doc["hardware"]["intra_link"], doc["hardware"]["network"]}
    assert doc["throughput"]["mfu_6n"] < doc["throughput"]["mfu"]


def test_pinned_layout_that_cannot_fit_says_so(capsys):
    rc = main(
        [
            "plan",
            "--model",
            "llama2-70b",
            "--gpus",
            "8",
            "--accelerator",
            "a100-40gb",
            "--dp",
            "8",
            "--zero",
            "0",
            "--json",
            "--no-curve",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["memory"]["fits"] is False
    assert any("does not fit" in w for w in doc["warnings"])


def test_invalid_pinned_layout(capsys):
    rc = main(["plan", "--model", "llama2-7b", "--gpus", "8", "--tp", "3"])
    assert rc == 2 and "tp" in capsys.readouterr().err


def test_slow_network_warning(capsys):
    rc = main(
        [
            "plan",
            "--model",
            "llama2-7b",
            "--gpus",
            "64",
            "--accelerator",
            "a100-80gb",
            "--network",
            "ethernet-10g",
            "--gpus-per-node",
            "8",
            "--nics-per-node",
            "1",
            "--json",
            "--no-curve",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert any("below 10 Gb/s" in w for w in doc["warnings"])


def test_plan_from_a_workload_file(capsys):
    path = ROOT / "sextant" / "workloads" / "gpt-small.toml"
    if not path.is_file():
        path = ROOT / "workloads" / "gpt-small.toml"
    rc = main(
        [
            "plan",
            "--workload",
            str(path),
            "--gpus",
            "4",
            "--accelerator",
            "a100-40gb",
            "--json",
            "--no-curve",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["model"]["family"] == "transformer"


def test_list_and_references(capsys):
    assert main(["plan", "list"]) == 0
    assert "llama3-405b" in capsys.readouterr().out
    assert main(["plan", "references", "--only", "zero-fig1-stage1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["published"] == 31.4 and abs(rows[0]["error"]) < 0.01


def test_validate_without_a_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEXTANT_RESULTS", raising=False)
    assert main(["plan", "validate"]) == 2
    assert "sextant compare" in capsys.readouterr().err
    assert main(["plan", "validate", "--db", str(tmp_path / "none.db")]) == 2
    assert "none.db" in capsys.readouterr().err


@pytest.mark.parametrize(
    "old",
    [
        ["plan", "--list", "--json"],
        ["plan", "--references", "--only", "zero-fig1-stage1", "--json"],
        ["plan", "--validate", "--db", "none.db"],
    ],
)
def test_mode_flags_are_verbs_only(old, tmp_path, monkeypatch, capsys):
    """`list`, `references` and `validate` are verbs; as mode flags of `plan` they are a
    one-line argument error (exit 2), and nothing is planned or printed."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(old)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("sextant: error: ") and err.count("\n") == 1


def test_calibrate_rejects_bad_flags(capsys):
    assert main(["calibrate", "--max-bytes", "10"]) == 2
    assert "--max-bytes" in capsys.readouterr().err
