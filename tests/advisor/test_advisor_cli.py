"""`sextant advise` through sextant.cli.main: exit codes 0 / 2 and what is printed."""

from __future__ import annotations

import json
import subprocess
import types
import sys
from pathlib import Path

import pytest

from sextant.advisor.profile import TEMPLATE
from sextant.cli import main
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
from tests.advisor.util import EXAMPLES, REPO, run

STARTUP = str(EXAMPLES / "startup-nvidia-pytorch.toml")


@pytest.fixture(autouse=True)
def _no_default_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never read a results store lying in the developer's working directory.
    monkeypatch.setenv("SEXTANT_RESULTS", str(tmp_path / "absent" / "results.db"))


def _store(db: Path, runs: list[RunRecord]) -> Path:
    """A real results store at `db` holding `runs`."""
    with ResultsStore(db) as store:
        for r in runs:
            store.add(r.replace(id=None))
    return db


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--profile", STARTUP]) == 0
    out = capsys.readouterr().out
    for text in ("Ranking", "pytorch", "scale.small.team-pytorch", "Rules that fired",
                 "Cost assumptions", "Sensitivity:", "No measured evidence", "rule of thumb"):
        assert text in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--profile", str(EXAMPLES / "tpu-research-lab-jax.toml"),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["top"] == "jax" and data["ranking"][0]["candidate"] == "jax"
    assert "scale.large.tpu-jax" in [f["id"] for f in data["fired"]]
    assert data["rules_version"] == 1 and data["sensitivity"]["headline"]


def test_markdown_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--profile", str(EXAMPLES / "mobile-product.toml"),
                 "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Stack advice: Mobile product")
    assert "**Recommendation: tensorflow.**" in out and "`deploy.mobile-edge`" in out


def _on_gpu(record: RunRecord) -> RunRecord:
    """A run measured on the startup profile's hardware (an NVIDIA GPU): evidence for it."""
    return record.with_metrics(device="gpu", accelerator="NVIDIA H100 80GB HBM3")


def test_cpu_runs_are_not_evidence_for_a_gpu_team(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path / "results.db", [run(1, "torch", 1000.0), run(2, "jax", 4000.0)])
    assert main(["advise", "--profile", STARTUP, "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pytorch = next(r for r in data["ranking"] if r["candidate"] == "pytorch")
    assert pytorch["cost"]["throughput_source"] != "measured"
    assert any("2 run(s) measured on CPU cores, not your target" in n for n in data["notes"])


def test_measured_runs_from_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path / "results.db", [_on_gpu(run(1, "torch", 1000.0)),
                                          _on_gpu(run(2, "jax", 4000.0))])
    assert main(["advise", "--profile", STARTUP, "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pytorch = next(r for r in data["ranking"] if r["candidate"] == "pytorch")
    assert pytorch["cost"]["throughput_factor"] == pytest.approx(0.25)
    assert pytorch["cost"]["throughput_source"] == "measured"
    assert not data["notes"]


def test_env_overrides_the_default_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path / "env.db", [_on_gpu(run(1, "torch", 1000.0))])
    monkeypatch.setenv("SEXTANT_RESULTS", str(db))
    assert main(["advise", "--profile", STARTUP, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes and "no two frameworks" in notes[0]


def test_missing_store_is_one_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--profile", STARTUP, "--db", str(tmp_path / "no.db"),
                 "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert len(notes) == 1 and notes[0].startswith("No measured evidence")


def test_init_writes_a_template_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "team.toml"
    assert main(["advise", "init", str(path)]) == 0
    assert path.exists() and main(["advise", "--profile", str(path)]) == 0
    assert main(["advise", "init", str(path)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_init_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "init"]) == 0
    assert (tmp_path / "sextant-profile.toml").exists()


@pytest.mark.parametrize(("content", "message"), [
    (TEMPLATE.replace('hardware = "nvidia"', 'hardware = "gpu"'),
     "hardware: unknown value 'gpu'; allowed: nvidia, amd, tpu, ascend, apple, cpu"),
    ('colour = "red"\n' + TEMPLATE, "unknown key 'colour'; allowed:"),
    (TEMPLATE.replace('pytorch = "expert"', 'pytorch = "guru"'),
     "experience.pytorch: unknown value 'guru'; allowed: none, some, expert"),
])
def test_bad_profile_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                             message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(content)
    assert main(["advise", "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sextant: error:") and message in err and err.count("\n") == 1


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--profile", str(tmp_path / "missing.toml")]) == 2
    for argv in (["advise", "init", str(tmp_path / "x.toml"), "--profile", STARTUP],
                 ["advise", "--profile", STARTUP, "--json", "--markdown"],
                 ["advise", "--init"], ["advise", "--rules"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
    assert not (tmp_path / "x.toml").exists()
    assert main(["advise", "--profile", STARTUP, "--rules-file", str(tmp_path / "r.toml")]) == 2


def test_no_profile_without_a_terminal_exits_2(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: False))
    assert main(["advise"]) == 2
    err = capsys.readouterr().err
    assert "--profile" in err and "advise init" in err


def test_no_profile_on_a_terminal_asks(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: True))
    replies = {"Hardware": "apple", "model size": "3e9", "with mlx": "expert",
               "Research or production": "research", "Price": "0.4",
               "Number of devices": "1", "Expected training hours": "30",
               "Engineer cost": "600", "Deadline": "2"}

    def fake_input(prompt: str) -> str:
        return next((v for k, v in replies.items() if k in prompt), "")

    monkeypatch.setattr("builtins.input", fake_input)
    assert main(["advise", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["top"] == "mlx"


def test_rules_listing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "rules"]) == 0
    assert "hw.ascend" in capsys.readouterr().out
    assert main(["advise", "rules", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["version"] == 1 and {"constraint", "rule", "evidence", "deadline"} == {
        r["kind"] for r in data["rules"]}


@pytest.mark.parametrize("fmt", [["--json"], ["--markdown"]])
def test_rules_takes_its_format_before_or_after_the_verb(
        fmt: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "rules", *fmt]) == 0
    after = capsys.readouterr()
    assert main(["advise", *fmt, "rules"]) == 0
    before = capsys.readouterr()
    assert before == after and after.err == ""
    assert main(["advise", "rules"]) == 0
    assert capsys.readouterr().out != after.out  # the format was taken, not dropped


def test_import_pulls_in_no_framework() -> None:
    code = ("import sys, sextant.advisor, sextant.commands.advise; "
            "from sextant.strategy import FRAMEWORKS; "
            "bad = set(FRAMEWORKS) & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Path:
    """A real planner result, as `sextant plan ... --json > plan.json` writes it."""
    assert main(["plan", "--model", "llama2-7b", "--accelerator", "h100-sxm", "--no-curve",
                 "--json", *args]) == 0
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    return path


def test_time_to_train_from_a_planner_result(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = _plan(tmp_path, capsys, "--gpus", "16", "--tokens", "1.4e11")
    plan = json.loads(plan_path.read_text())
    assert main(["advise", "--profile", STARTUP, "--plan", str(plan_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    hours = 1.4e11 / plan["throughput"]["tokens_per_s"] / 3600
    planned = [e for e in data["evidence"] if e["metric"] == "training_hours"]
    assert planned and {e["source"] for e in planned} == {"planner"}
    top = data["ranking"][0]
    assert top["cost"]["reference_hours"] == pytest.approx(hours)
    assert top["cost"]["compute_usd"] == pytest.approx(
        top["cost"]["training_hours"] * 16 * 2.49)
    assert any(f"{plan['layout']['label']}" in line for line in data["assumptions"])
    # Without the plan the hours are the rule of thumb (6 x params x tokens at 40% MFU).
    assert main(["advise", "--profile", STARTUP, "--json"]) == 0
    thumb = json.loads(capsys.readouterr().out)["ranking"][0]["cost"]["reference_hours"]
    assert thumb != pytest.approx(hours)


def test_a_plan_for_other_devices_or_hardware(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = _plan(tmp_path, capsys, "--gpus", "64", "--tokens", "1.4e11")
    assert main(["advise", "--profile", STARTUP, "--plan", str(plan_path)]) == 2
    err = capsys.readouterr().err
    assert "is for 64 devices but the profile has devices = 16: plan with --gpus 16" in err
    assert len(err.strip().splitlines()) == 1
    tpu_plan = tmp_path / "tpu.json"
    assert main(["plan", "--model", "llama2-7b", "--accelerator", "tpu-v5p", "--gpus", "16",
                 "--no-curve", "--json"]) == 0
    tpu_plan.write_text(capsys.readouterr().out)
    # No --tokens in the plan: the profile's training_tokens are used.
    assert main(["advise", "--profile", STARTUP, "--plan", str(tpu_plan), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("is not nvidia hardware" in n for n in notes)
    (tmp_path / "bad.json").write_text("{}")
    assert main(["advise", "--profile", STARTUP, "--plan", str(tmp_path / "bad.json")]) == 2
    assert "not the output of 'sextant plan" in capsys.readouterr().err
