from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from sextant.core.errors import UserError
from sextant.results.record import RankSummary, RunRecord
from sextant.results.store import ResultsStore
from sextant.strategy import Strategy
from sextant.sources import resolve_workload


def record(group: str = "g1", step: float = 0.02) -> RunRecord:
    w = resolve_workload("gpt-tiny")
    return RunRecord.from_dict({
        "group_id": group,
        "workload": w.to_dict(),
        "workload_hash": w.content_hash(),
        "strategy": Strategy(framework="torch", parallel="dp", workers=2).to_dict(),
        "metrics": {"step_time_median_s": step, "tokens_per_s": 1024 / step, "final_loss": 2.5},
        "losses": [5.5, 4.0, 2.5],
        "ranks": [{"rank": 0}, {"rank": 1}],
        "fingerprint": {"python": "3.11"},
    })


def test_round_trip(db: Path) -> None:
    with ResultsStore(db) as store:
        run_id = store.add(record())
        got = store.get(run_id)
    assert got.metrics.tokens_per_s == pytest.approx(1024 / 0.02)
    assert got.losses == (5.5, 4.0, 2.5)
    assert got.strategy.framework == "torch" and got.strategy.workers == 2
    assert got.label == "torch dp x2" and got.id == run_id
    assert got == record().replace(id=run_id, created_at=got.created_at)
    # Reopening sees the same data (it was committed).
    with ResultsStore(db) as again:
        assert [r.id for r in again.runs()] == [run_id]
        assert again.latest_group() == "g1"


def test_filters_by_group_and_workload(db: Path) -> None:
    with ResultsStore(db) as store:
        store.add(record("a"))
        store.add(record("b"))
        store.add(record("b"))
        assert len(store.runs(group_id="b")) == 2
        assert store.latest_group() == "b"
        assert len(store.runs(workload_hash=resolve_workload("gpt-tiny").content_hash())) == 3


def test_failed_insert_leaves_store_unchanged(db: Path) -> None:
    with ResultsStore(db) as store:
        store.add(record())
        # A rank detail that is not JSON: the insert must fail as a whole.
        bad = record().replace(ranks=(RankSummary(rank=0, details={"x": {1, 2}}),))
        with pytest.raises(TypeError):
            store.add(bad)
        assert len(store.runs()) == 1


def test_not_a_database_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    path.write_text("this is not sqlite " * 100)
    with pytest.raises(UserError, match="is not a sextant results database"):
        ResultsStore(path)
    assert path.read_text().startswith("this is not sqlite")  # nothing overwritten


def test_missing_store_when_reading(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no results store at"):
        ResultsStore(tmp_path / "none.db", create=False)


def test_newer_schema_refused(db: Path) -> None:
    ResultsStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(UserError, match="newer sextant"):
        ResultsStore(db)


def test_json_columns_are_plain_json(db: Path) -> None:
    with ResultsStore(db) as store:
        store.add(record())
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT metrics_json, losses_json FROM runs").fetchone()
    assert json.loads(row[0])["final_loss"] == 2.5 and json.loads(row[1])[-1] == 2.5
