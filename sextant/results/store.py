"""SQLite results store: one row per run, written in one transaction.

Default location: sextant.core.paths.default_db() (`./sextant-results/results.db`; `--db PATH`
or the SEXTANT_RESULTS environment variable override it). Scalar headline figures have their own columns (for
queries and listing); everything else is JSON in the row, so that the schema does not have to
change with every new metric. `schema_version` lets later versions migrate old stores.
"""

from __future__ import annotations

import json
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError
from sextant.core.paths import default_db
from sextant.results.deploy import DeployRecord
from sextant.results.record import RunRecord

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another writer's lock before giving up."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    group_id TEXT,
    status TEXT NOT NULL,
    workload_name TEXT NOT NULL,
    workload_hash TEXT NOT NULL,
    framework TEXT NOT NULL,
    mode TEXT NOT NULL,
    parallel TEXT NOT NULL,
    workers INTEGER NOT NULL,
    precision TEXT NOT NULL,
    step_time_median_s REAL,
    tokens_per_s REAL,
    final_loss REAL,
    workload_json TEXT NOT NULL,
    strategy_json TEXT NOT NULL,
    metrics_json TEXT NOT NULL,
    losses_json TEXT NOT NULL,
    grad_norms_json TEXT NOT NULL,
    ranks_json TEXT NOT NULL,
    fingerprint_json TEXT NOT NULL,
    run_dir TEXT,
    workload_file TEXT
);
CREATE INDEX IF NOT EXISTS runs_workload ON runs (workload_hash);
CREATE INDEX IF NOT EXISTS runs_group ON runs (group_id);
CREATE TABLE IF NOT EXISTS deployments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    group_id TEXT,
    workload_hash TEXT NOT NULL,
    framework TEXT NOT NULL,
    format TEXT NOT NULL,
    status TEXT NOT NULL,
    record_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS deployments_group ON deployments (group_id);
"""

_JSON_COLUMNS = {
    "workload_json": "workload",
    "strategy_json": "strategy",
    "metrics_json": "metrics",
    "losses_json": "losses",
    "grad_norms_json": "grad_norms",
    "ranks_json": "ranks",
    "fingerprint_json": "fingerprint",
}


class StoreLocked(UserError):
    """The database stayed locked (another writer) for longer than the busy timeout."""


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def finite_json(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None: JSON has no such numbers (Python
    would write `NaN`, which other readers reject)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


_ADDED_COLUMNS = {"workload_file": "TEXT"}
"""Nullable columns added after schema 1 was released (older readers ignore them)."""


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    present = {r["name"] for r in conn.execute("PRAGMA table_info(runs)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in present:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


class ResultsStore:
    """Open (creating if needed) a results database."""

    def __init__(self, path: str | Path | None = None, *, create: bool = True,
                 busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path) if path is not None else default_db()
        self.busy_timeout_s = busy_timeout_s
        if not create and not self.path.exists():
            raise UserError(
                f"no results store at {self.path}; run 'sextant compare' or 'sextant run' first"
            )
        if self.path.exists() and self.path.is_dir():
            raise UserError(f"results store path is a directory: {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the results store's directory {self.path.parent}: "
                            f"{exc.strerror}") from None
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s)
            self._conn.row_factory = sqlite3.Row
            with self._conn:
                self._conn.executescript(_SCHEMA)
                row = self._conn.execute(
                    "SELECT value FROM meta WHERE key = 'schema_version'"
                ).fetchone()
                if row is None:
                    self._conn.execute(
                        "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                elif int(row["value"]) > SCHEMA_VERSION:
                    raise UserError(
                        f"{self.path} was written by a newer sextant (schema {row['value']}, "
                        f"this one reads up to {SCHEMA_VERSION})"
                    )
                else:
                    _add_missing_columns(self._conn)
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise StoreLocked(self._locked_message()) from None
            raise UserError(f"{self.path} cannot be opened as a results database ({exc})"
                            ) from None
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path} is not a sextant results database ({exc})") from None

    def _locked_message(self) -> str:
        return (f"results database {self.path} is locked by another process (waited "
                f"{self.busy_timeout_s:g} s)")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, record: RunRecord) -> int:
        """Insert one run record; returns its id."""
        doc = record.to_dict()
        strategy = record.strategy
        values = {
            "created_at": record.created_at or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "group_id": record.group_id,
            "status": record.status,
            "workload_name": record.workload_name,
            "workload_hash": record.workload_hash,
            "framework": strategy.framework,
            "mode": strategy.mode,
            "parallel": strategy.parallel,
            "workers": strategy.workers,
            "precision": strategy.precision,
            "step_time_median_s": record.metrics.step_time_median_s,
            "tokens_per_s": record.metrics.tokens_per_s,
            "final_loss": record.metrics.final_loss,
            "run_dir": record.run_dir,
            "workload_file": record.workload_file,
        }
        for column, key in _JSON_COLUMNS.items():
            values[column] = json.dumps(finite_json(doc[key]), allow_nan=False)
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        try:
            with self._conn:  # one transaction: the row is there completely or not at all
                cur = self._conn.execute(
                    f"INSERT INTO runs ({columns}) VALUES ({marks})", tuple(values.values())
                )
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise StoreLocked(self._locked_message()) from None
            raise
        row_id = cur.lastrowid
        if row_id is None:  # sqlite3 sets it after every INSERT
            raise RuntimeError("the results store did not report the new row's id")
        return int(row_id)

    def _decode(self, row: sqlite3.Row) -> RunRecord:
        """One run; UserError naming the row and the column or field when a cell is not what
        sextant wrote (a hand-edited or damaged database)."""
        doc: dict[str, Any] = {k: row[k] for k in row.keys() if k not in _JSON_COLUMNS}
        for column, key in _JSON_COLUMNS.items():
            try:
                doc[key] = json.loads(row[column])
            except (TypeError, ValueError, RecursionError):
                raise UserError(f"run {row['id']} in {self.path} is unreadable: its {column} "
                                f"is not valid JSON") from None
        for key, kind in (("workload", dict), ("strategy", dict), ("metrics", dict),
                          ("losses", list), ("grad_norms", list)):
            if not isinstance(doc[key], kind):
                raise UserError(f"run {row['id']} in {self.path} is unreadable: its {key} is "
                                f"not a JSON {'object' if kind is dict else 'array'}")
        doc["schema"] = 1  # the store's rows are schema 1 (SCHEMA_VERSION), whatever they say
        return RunRecord.from_dict(doc, name=f"run {row['id']} in {self.path} is unreadable:")

    def _decode_all(self, rows: Any) -> list[RunRecord]:
        """The readable runs; each unreadable one is named on stderr and left out, so one
        damaged row does not hide the others."""
        out = []
        for row in rows:
            try:
                out.append(self._decode(row))
            except UserError as exc:
                sys.stderr.write(f"sextant: warning: {exc}; it is left out\n")
        return out

    def runs(self, *, workload_hash: str | None = None, group_id: str | None = None
             ) -> list[RunRecord]:
        """All runs (oldest first), optionally of one workload or one compare group."""
        query, args = "SELECT * FROM runs", []
        clauses = []
        if workload_hash is not None:
            clauses.append("workload_hash = ?")
            args.append(workload_hash)
        if group_id is not None:
            clauses.append("group_id = ?")
            args.append(group_id)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        return self._decode_all(self._conn.execute(query + " ORDER BY id", args))

    def get(self, run_id: int) -> RunRecord:
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise UserError(f"no run with id {run_id} in {self.path}")
        return self._decode(row)

    def find(self, record: RunRecord) -> int | None:
        """The id of a stored run that is `record` (the same run directory, start time and
        workload), or None."""
        row = self._conn.execute(
            "SELECT id FROM runs WHERE run_dir IS ? AND created_at IS ? AND workload_hash IS ?",
            (record.run_dir, record.created_at, record.workload_hash),
        ).fetchone()
        return None if row is None else int(row["id"])

    def add_deployment(self, record: DeployRecord) -> int:
        """Insert one deployment artifact's row (one transaction); returns its id."""
        created = record.created_at or time.strftime("%Y-%m-%dT%H:%M:%S%z")
        doc = finite_json({**record.to_dict(), "id": None, "created_at": created})
        try:
            with self._conn:
                cur = self._conn.execute(
                    "INSERT INTO deployments (created_at, group_id, workload_hash, framework, "
                    "format, status, record_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (created, record.group_id, record.workload_hash, record.framework,
                     record.format, record.status, json.dumps(doc, allow_nan=False)))
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise StoreLocked(self._locked_message()) from None
            raise
        if cur.lastrowid is None:
            raise RuntimeError("the results store did not report the new row's id")
        return int(cur.lastrowid)

    def deployments(self, *, group_id: str | None = None, workload_hash: str | None = None
                    ) -> list[DeployRecord]:
        """Deployment rows (oldest first), of one group or one workload; an unreadable row is
        named on stderr and left out."""
        query, args = "SELECT id, record_json FROM deployments", []
        clauses = []
        for column, value in (("group_id", group_id), ("workload_hash", workload_hash)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        out = []
        for row in self._conn.execute(query + " ORDER BY id", args):
            name = f"deployment {row['id']} in {self.path} is unreadable:"
            try:
                doc = json.loads(row["record_json"])
                if not isinstance(doc, dict):
                    raise UserError(f"{name} not a JSON object")
                out.append(DeployRecord.from_dict({**doc, "id": row["id"]}, name=name))
            except (ValueError, RecursionError, UserError) as exc:
                message = exc if isinstance(exc, UserError) else f"{name} not valid JSON"
                sys.stderr.write(f"sextant: warning: {message}; it is left out\n")
        return out

    def latest_deployment_group(self) -> str | None:
        row = self._conn.execute("SELECT group_id FROM deployments WHERE group_id IS NOT NULL "
                                 "ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else row["group_id"]

    def latest_group(self) -> str | None:
        row = self._conn.execute(
            "SELECT group_id FROM runs WHERE group_id IS NOT NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        return None if row is None else row["group_id"]
