"""`sextant compare` end to end through the console entry point, then runs and report."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from tests.helpers import needs_torch, run_cli

pytestmark = [needs_torch, pytest.mark.slow]


def test_compare_runs_matrix_stores_and_reports(tmp_path: Path) -> None:
    db = tmp_path / "out" / "results.db"
    # torch only: the other frameworks' rows are covered by their own parity tests, and the
    # whole matrix would cost minutes of CI.
    # Two interleaved trials: the smallest count with a between-trial interval.
    proc = run_cli("compare", "--frameworks", "torch", "--steps", "8", "--repeats", "2",
                   "--db", str(db), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = proc.stdout
    for label in ("torch eager", "torch compiled", "torch dp x2"):
        assert re.search(rf"│ {label}\s+│", out), out
    assert "ref" in out and "%" in out  # reference row, exposed communication share
    # Each configuration's row counts its trials and carries its speed-up's interval.
    assert "speed-up [95% CI]" in out
    # (On a busy machine the trials are disturbed: counted apart, left out of verdicts.)
    assert re.search(r"│ torch compiled\s+│\s+[012]( \(\+[12] disturbed\))?\s+│", out), out
    assert re.search(r"\d\.\d\dx \[\d\.\d\d-\d\.\d\d\]|no quiet trial", out), out
    # The iteration leg: each configuration's edit-run loop, import and set-up, in seconds.
    iteration = out[out.index("edit-run loop"):]
    assert re.search(r"│ torch eager\s+│\s+\d+\.\d\d\s+│\s+\d+\.\d\d\s+│\s+\d+\.\d\d\s+│",
                     iteration), out
    # The headline names a winner only if the interval supports it.
    assert re.search(r"is fastest here|tied within the interval|not confirmed", out), out
    report = db.parent / "report.html"
    assert f"report: {report.resolve()}" in out
    page = report.read_text()
    assert "<svg" in page and "identical data flow" in page
    # The first compare calibrates the machine (real GEMMs and gloo all-reduces), so the
    # scaling chart carries the planner's prediction next to the measured points.
    assert "calibrating this machine" in out and (db.parent / "calibration.json").is_file()
    assert "torch dp, planner" in page and "Dotted lines: the planner" in page
    # Self-contained: nothing loaded from anywhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<script" not in page

    listing = run_cli("runs", "list", "--db", str(db))
    assert listing.returncode == 0 and listing.stdout.count("gpt-tiny") == 6
    shown = json.loads(run_cli("runs", "show", "2", "--db", str(db)).stdout)
    assert shown["strategy"]["mode"] == "compiled" and len(shown["losses"]) == 8
    assert (shown["metrics"]["trial"], shown["metrics"]["trials"]) == (1, 2)
    assert shown["fingerprint"]["interference"]["sampled"] is True
    assert isinstance(shown["metrics"]["disturbed"], bool)
    # Interleaved: A B C, A B C, all in one group.
    later = json.loads(run_cli("runs", "show", "5", "--db", str(db)).stdout)
    assert later["metrics"]["trial"] == 2 and later["strategy"]["mode"] == "compiled"
    assert later["group_id"] == shown["group_id"]
    exported = run_cli("runs", "export", "--format", "csv", "--db", str(db)).stdout
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [r["parallel"] for r in rows] == ["single", "single", "dp"] * 2
    assert float(rows[2]["exposed_comm_s"]) == pytest.approx(
        json.loads(run_cli("runs", "show", "3", "--db", str(db)).stdout)["metrics"]["exposed_comm_s"]
    )
    out_json = tmp_path / "runs.json"
    assert run_cli("runs", "export", "--format", "json", "--out", str(out_json),
                   "--db", str(db)).returncode == 0
    assert len(json.loads(out_json.read_text())) == 6
    as_json = json.loads(run_cli("report", "--format", "json", "--out", "-",
                                 "--db", str(db)).stdout)
    compiled = next(r for r in as_json["runs"] if r["label"] == "torch compiled")
    assert compiled["trials"] == 2 and set(compiled["speedup_ci"]) >= {"low", "high"}
    assert all(c["verdict"] in ("holds", "does not hold here", "inconclusive", "not measured")
               for c in as_json["claims"])

    again = run_cli("report", "--db", str(db), "--out", str(tmp_path / "r2.html"))
    assert again.returncode == 0 and (tmp_path / "r2.html").read_text().count("<tr>") > 3


def test_report_escapes_user_strings(tmp_path: Path) -> None:
    from sextant.report import render_html
    from tests.test_store import record

    rec = record()
    rec = rec.replace(workload={**rec.workload, "name": "<script>alert(1)</script>"},
                      created_at="2026-11-30T00:00:00", id=1, grad_norms=(1.0, 1.0, 1.0),
                      ranks=())
    rec = rec.with_metrics(step_time_p10_s=0.01, step_time_p90_s=0.03, steps_timed=3,
                           first_step_s=0.1, achieved_flops_per_s=1e9, peak_rss_bytes=1e8)
    page = render_html([rec])
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
