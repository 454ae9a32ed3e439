"""benchmarks/gpu_check.py, the GPU acceptance check, run in its CPU smoke mode: the same
parts (compare as a user runs it, fp32 against tf32, the independent loops) on gpt-tiny, so
the script is known to work before a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def test_gpu_check_smoke_runs_every_part(tmp_path: Path) -> None:
    out = tmp_path / "gc"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--smoke",
         "--frameworks", "torch", "--steps", "6", "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["compare"]["rc"] == 0
    labels = [r["label"] for r in doc["compare"]["rows"]]
    assert labels[0] == "torch eager bf16" and "torch eager" in labels  # the fp32 anchor
    anchor = next(r for r in doc["compare"]["rows"] if r["label"] == "torch eager")
    assert anchor["not_ranked"] == "precision fp32 vs bf16"
    agreement = {g["run"]: g for g in doc["compare"]["agreement"]}
    assert agreement["torch compiled bf16"]["agrees"] is True
    effective = {r["run"]: r["effective"] for r in doc["precision"]["runs"]}
    assert effective == {"torch eager": "fp32", "torch eager tf32": "fp32"}  # no TF32 on CPU
    expert = {r["run"]: r for r in doc["expert"]}
    assert expert["torch eager bf16"]["ratio"] is not None
    assert "| torch eager bf16 |" in (out / "gpu_check.md").read_text()


def test_gpu_check_refuses_a_host_without_gpus(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"),
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin"})
    assert done.returncode == 2 and "no visible GPU" in done.stderr
