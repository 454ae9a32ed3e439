"""One place for the results layout and the shared limits, and a RunFailed that says where
its run's logs are."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from sextant.core import defaults, paths
from sextant.cli import build_parser
from sextant.core.errors import RunFailed
from sextant.results.store import ResultsStore


def test_the_default_database_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.RESULTS_ENV, raising=False)
    assert paths.default_db() == Path("sextant-results/results.db")
    monkeypatch.setenv(paths.RESULTS_ENV, str(tmp_path / "x.db"))
    assert paths.default_db() == tmp_path / "x.db"
    with ResultsStore() as store:
        assert store.path == tmp_path / "x.db"


def test_runs_and_calibration_sit_beside_the_database(tmp_path):
    assert paths.runs_beside(tmp_path / "r.db") == tmp_path / "runs"
    assert paths.calibration_in(tmp_path) == tmp_path / "calibration.json"
    assert paths.DEFAULT_CALIBRATION.parent == paths.DEFAULT_DB.parent == paths.DEFAULT_RUNS.parent


def test_the_run_flags_take_their_defaults_from_one_place():
    args = build_parser().parse_args(["run"])
    assert args.timeout == defaults.RUN_TIMEOUT_S
    assert args.collective_timeout == defaults.COLLECTIVE_TIMEOUT_S


@pytest.mark.parametrize("run_dir", [None, "runs/x"])
def test_run_failed_keeps_its_run_directory_through_pickling(run_dir):
    exc = pickle.loads(pickle.dumps(RunFailed("rank 1 died", run_dir=run_dir)))
    assert str(exc) == "rank 1 died"
    assert exc.run_dir == (Path(run_dir) if run_dir else None)
