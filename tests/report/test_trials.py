"""Repeated trials in the report and the compare table, on constructed runs: intervals per
configuration, the headline's 'tied', disturbed trials counted apart and never used."""

from __future__ import annotations

import io

from rich.console import Console

from sextant.commands.trials import disturbed_lines, trials_table
from sextant.measure.intervals import distinguishable, verdict_at_least, verdict_below
from sextant.report.model import build_report, headline_text
from sextant.results.record import RunRecord
from tests.report.runs import make_run, with_fingerprint


def _trials(framework: str, mode: str, steps: list[float], spread: float = 0.05,
            disturbed: tuple[int, ...] = ()) -> list[RunRecord]:
    runs = []
    for i, step in enumerate(steps):
        run = make_run(framework, mode, step=step, spread=spread, trial=i + 1,
                       trials=len(steps), disturbed=i in disturbed)
        if i in disturbed:
            run = with_fingerprint(run, interference={
                "reason": "1.00 cores used outside the run", "outside_cores_mean": 1.0})
        runs.append(run)
    return runs


def _interleave(*configs: list[RunRecord]) -> list[RunRecord]:
    return [run for trial in zip(*configs) for run in trial]


def _text(table) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(table)
    return buf.getvalue()


def test_verdict_rules_on_intervals() -> None:
    assert verdict_at_least(1.12, 1.30, 1.10) == "holds"
    assert verdict_at_least(1.02, 1.08, 1.10) == "does not hold here"
    assert verdict_at_least(1.05, 1.20, 1.10) == "inconclusive"  # straddles
    assert verdict_at_least(None, None, 1.10) == "inconclusive"
    assert verdict_below(0.5, 0.9, 0.95) == "holds"
    assert verdict_below(0.9, 1.0, 0.95) == "inconclusive"
    assert distinguishable(1.01, 1.2) and not distinguishable(0.98, 1.2)


def test_clear_winner_is_named() -> None:
    runs = _interleave(_trials("torch", "eager", [0.20, 0.21, 0.20]),
                       _trials("jax", "compiled", [0.10, 0.11, 0.10]))
    report = build_report(runs)
    title, sentence = headline_text(report["summary"])
    assert title == "jax compiled is fastest here" and "95% CI" in sentence
    jax = report["runs"][1]
    assert jax["trials"] == 3 and jax["speedup_ci"]["low"] > 1.5


def test_overlapping_trials_are_tied() -> None:
    # jax's median is 3% lower, but its trials spread over torch's: no winner.
    runs = _interleave(_trials("torch", "eager", [0.20, 0.22, 0.19]),
                       _trials("jax", "compiled", [0.21, 0.18, 0.205]))
    summary = build_report(runs)["summary"]
    title, sentence = headline_text(summary)
    assert summary["fastest"]["verdict"] == "tied"
    assert "tied within the interval" in title and "no winner" in sentence
    assert "fastest here" not in title


def test_disturbed_trials_are_counted_apart_and_not_used() -> None:
    # The disturbed jax trial is fast (a lucky burst), the quiet ones are not.
    runs = _interleave(_trials("torch", "eager", [0.20, 0.20, 0.20], spread=0.01),
                       _trials("jax", "compiled", [0.05, 0.30, 0.30], spread=0.01,
                               disturbed=(0,)))
    report = build_report(runs)
    jax = report["runs"][1]
    assert jax["disturbed_trials"] == 1 and jax["speedup_vs_reference"] < 1
    assert report["summary"]["fastest"]["run"] == "torch eager"
    assert report["summary"]["disturbed"] == [{"run": "jax compiled",
                                               "ids": [runs[1].id]}]
    text = _text(trials_table(runs, "t"))
    assert "2 (+1 disturbed)" in text and "0.67x [" in text
    lines = disturbed_lines(runs)
    assert f"run {runs[1].id} (jax compiled trial 1/3)" in lines[0]
    assert "re-run" in lines[-1]


def test_all_disturbed_names_no_winner() -> None:
    runs = _interleave(_trials("torch", "eager", [0.20, 0.20], disturbed=(0, 1)),
                       _trials("jax", "compiled", [0.05, 0.05], disturbed=(0, 1)))
    title, sentence = headline_text(build_report(runs)["summary"])
    assert "not confirmed" in title and "quiet machine" in sentence
    text = _text(trials_table(runs, "t"))
    assert "0 (+2 disturbed)" in text and "no quiet trial" in text and "(disturbed)" in text


def test_a_winner_that_lost_trials_to_disturbance_is_not_confirmed() -> None:
    """The quiet noise benchmark's case: the fastest run's second trial was disturbed; the
    interval from the one left covers step noise only, so no winner is named on it."""
    runs = _interleave(_trials("torch", "eager", [0.20, 0.20], spread=0.01, disturbed=(1,)),
                       _trials("jax", "compiled", [0.30, 0.30], spread=0.01))
    summary = build_report(runs)["summary"]
    title, sentence = headline_text(summary)
    assert summary["fastest"]["run"] == "torch eager"
    assert title == "torch eager measured fastest, not confirmed"
    assert "quiet machine" in sentence
    quiet = _interleave(_trials("torch", "eager", [0.20, 0.20], spread=0.01),
                        _trials("jax", "compiled", [0.30, 0.30], spread=0.01))
    assert headline_text(build_report(quiet)["summary"])[0] == "torch eager is fastest here"
