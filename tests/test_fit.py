"""`workload from-hf --fit` and the long-run warning: what a workload costs on this machine,
estimated before anything runs."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

from sextant.cli import main
from sextant.commands.fit import LONG_RUN_S, estimate, long_run_check
from sextant.core.errors import UserError
from sextant.workloads.spec import load_workload
from tests.helpers import short

LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False}
"""Llama 3 8B's config.json (its shape; nothing is fetched)."""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return path


def _from_hf(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> Path:
    assert main(["workload", "from-hf", *args]) == 0
    out = tmp_path / "fitted.toml"
    out.write_text(capsys.readouterr().out)
    return out


def test_fit_picks_a_shape_within_the_target(config: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    w = load_workload(_from_hf(capsys, tmp_path, str(config), "--fit", "--target-step-s", "2"))
    guess = estimate(w, planner=False)
    assert guess.step_s <= 2.0
    assert "fitted to this machine" in w.description
    # The example: --scale 0.02 keeps seq 8192 and 426M parameters, hours a run.
    big = load_workload(_from_hf(capsys, tmp_path, str(config), "--scale", "0.02"))
    assert estimate(big, planner=False).step_s * big.steps > LONG_RUN_S
    assert w.model.d_model < big.model.d_model and w.model.seq_len < big.model.seq_len
    # A longer target buys more tokens a step, still within it.
    w8 = load_workload(_from_hf(capsys, tmp_path, str(config), "--fit", "--target-step-s", "8"))
    assert estimate(w8, planner=False).step_s <= 8.0
    assert w8.global_batch * w8.model.seq_len >= w.global_batch * w.model.seq_len


def test_fit_refuses_what_it_would_pick_itself(config: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "from-hf", str(config), "--fit", "--seq-len", "128"]) == 2
    assert "--fit picks the scale, sequence length and batch itself; drop --seq-len" in (
        capsys.readouterr().err)
    assert main(["workload", "from-hf", str(config), "--fit", "--target-step-s", "-1"]) == 2
    assert "--target-step-s must be a number of seconds > 0" in capsys.readouterr().err


def test_a_long_run_says_so_and_asks_for_yes_on_a_terminal(
        config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    big_file = _from_hf(capsys, tmp_path, str(config), "--scale", "0.02")
    big = load_workload(big_file)
    # A terminal: one line, and the run waits for --yes (nothing starts).
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: True))
    with pytest.raises(UserError, match=r"steps predicted to take about .* on this machine "
                                        r".*; add --yes to start it anyway") as caught:
        long_run_check(big, "cpu", yes=False)
    assert "\n" not in str(caught.value)
    assert main(["run", "--workload", str(big_file), "--framework", "torch"]) == 2
    assert "add --yes" in capsys.readouterr().err
    long_run_check(big, "cpu", yes=True)  # asked for: no question
    long_run_check(big, "gpu", yes=False)  # this CPU's figures say nothing of a GPU
    long_run_check(short("gpt-tiny", 5), "cpu", yes=False)  # short: nothing said
    # No terminal (CI, scripts): the line, and it goes on.
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: False))
    console = Console(file=io.StringIO(), width=400)
    long_run_check(big, "cpu", yes=False, out=console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "predicted to take about" in text and "starting anyway (no terminal)" in text


def test_a_calibrated_machine_gets_the_planner_s_step_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.report.runs import calibrated_machine

    w = short("gpt-tiny", 5)
    monkeypatch.chdir(tmp_path)
    assert estimate(w).how.startswith("training FLOPs")  # never calibrated here
    (tmp_path / "sextant-results").mkdir()
    assert calibrated_machine(tmp_path / "sextant-results") is not None
    planned = estimate(w)
    assert planned.how == "the planner, on this machine's calibration" and planned.step_s > 0
    assert planned.memory_bytes == estimate(w, planner=False).memory_bytes
