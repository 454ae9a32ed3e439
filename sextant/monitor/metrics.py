"""One JSON-lines file of per-step metrics per run: `<run_dir>/metrics.jsonl`.

Every worker appends its own events to `rank{r}.events.jsonl` while it trains (schema 1,
written by `sextant.launch.worker`). `write_metrics(run_dir)` merges them, in time order,
into one file that a dashboard, a notebook or `jq` can read without knowing about ranks or
files:

    line 1   {"schema": 1, "event": "run", "run": NAME, "world": N, "roles": [...],
              "workload": NAME, "label": "torch dp x2", "tokens_per_sample": T,
              "global_batch": B, "steps": S}
    then     one object per worker event, each with schema, event, rank, time (unix s):
      start       steps, start_step
      step        step (1-based), loss (null except every log_every steps), step_time_s,
                  data_time_s, rows, plus derived compute_time_s (step - data wait) and,
                  when known, rss_bytes
      phase       name
      checkpoint  step, seconds
      resumed     step, checkpoint
      warning     message
      done
    Other event kinds are kept as written (a newer worker may add some); readers must
    ignore kinds they do not know.

`validate_record` is the schema's checker; the tests run it over every line of real runs.
A worker killed mid-write leaves a partial last line: it is skipped, not an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypedDict

from sextant.contracts import EVENTS
from sextant.core.fsutil import atomic_write_text
from sextant.core.schema import problem

METRICS_SCHEMA = 1
METRICS_FILE = "metrics.jsonl"

_NUMBER = (int, float)


class RunLine(TypedDict):
    """The first line of metrics.jsonl (the run it describes); events follow (EVENTS)."""

    run: str
    world: int


class MetricsSchemaError(ValueError):
    """A metrics record does not follow the schema; the message names the field."""


def validate_record(record: Any) -> None:
    """Raise MetricsSchemaError unless `record` is a valid metrics.jsonl object."""
    if not isinstance(record, dict):
        raise MetricsSchemaError(f"record must be a JSON object, got {type(record).__name__}")
    if record.get("schema") != METRICS_SCHEMA:
        raise MetricsSchemaError(
            f"schema must be {METRICS_SCHEMA}. Received: {record.get('schema')!r}")
    kind = record.get("event")
    if not isinstance(kind, str) or not kind:
        raise MetricsSchemaError("missing 'event' (a non-empty string)")
    if kind != "run":
        rank = record.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise MetricsSchemaError(f"{kind}: 'rank' must be an integer >= 0. Received: {rank!r}")
        t = record.get("time")
        if isinstance(t, bool) or not isinstance(t, _NUMBER) or not math.isfinite(t):
            raise MetricsSchemaError(f"{kind}: 'time' must be a finite number. Received: {t!r}")
    shape = RunLine if kind == "run" else EVENTS.get(kind)
    wrong = problem(record, shape, f"{kind}: ") if shape is not None else None
    if wrong is not None:
        raise MetricsSchemaError(wrong)
    if kind == "step":
        if record["step"] < 1:
            raise MetricsSchemaError(f"step: 'step' must be >= 1. Received: {record['step']}")
        for name in ("step_time_s", "data_time_s"):
            if record[name] < 0 or not math.isfinite(record[name]):
                raise MetricsSchemaError(f"step: {name!r} must be finite and >= 0. "
                                         f"Received: {record[name]!r}")


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete lines of one rank's event file (a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a worker killed mid-write
    return out


def rank_event_files(run_dir: Path) -> dict[int, Path]:
    files = {}
    for path in run_dir.glob("rank*.events.jsonl"):
        digits = path.name[4:].split(".", 1)[0]
        if digits.isdigit():
            files[int(digits)] = path
    return dict(sorted(files.items()))


def _header(run_dir: Path, world: int) -> dict[str, Any]:
    head: dict[str, Any] = {"schema": METRICS_SCHEMA, "event": "run", "run": run_dir.name,
                            "world": world}
    try:
        plan = json.loads((run_dir / "plan.json").read_text())
    except (OSError, json.JSONDecodeError):
        return head
    workload = plan.get("workload") or {}
    model = workload.get("model") or {}
    head.update(
        world=len(plan.get("roles") or []) or world,
        roles=plan.get("roles"),
        workload=workload.get("name"),
        label=_label(plan.get("strategy")),
        global_batch=workload.get("global_batch"),
        steps=workload.get("steps"),
        tokens_per_sample=model.get("seq_len", 1) if isinstance(model, dict) else 1,
    )
    return head


def _label(strategy: Any) -> str | None:
    if not isinstance(strategy, dict):
        return None
    try:
        from sextant.strategy import Strategy

        return Strategy.from_dict(strategy).label
    except Exception:  # noqa: BLE001 - a label is a nicety; an older plan must still merge
        return strategy.get("framework")


def _normalise(event: dict[str, Any]) -> dict[str, Any]:
    record = {**event, "schema": METRICS_SCHEMA}
    if record.get("event") == "step":
        step_s, data_s = record.get("step_time_s"), record.get("data_time_s")
        if isinstance(step_s, _NUMBER) and isinstance(data_s, _NUMBER):
            record["compute_time_s"] = max(0.0, step_s - data_s)
    return record


def merged_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Header plus every rank's events, in time order (ties: rank order)."""
    run_dir = Path(run_dir)
    files = rank_event_files(run_dir)
    events = []
    for rank, path in files.items():
        for n, event in enumerate(read_events(path)):
            event.setdefault("rank", rank)
            events.append((event.get("time", 0.0), rank, n, _normalise(event)))
    events.sort(key=lambda e: e[:3])
    return [_header(run_dir, len(files))] + [e[3] for e in events]


def write_metrics(run_dir: str | Path) -> Path:
    """Merge the ranks' event files of `run_dir` into `run_dir/metrics.jsonl` (atomically)
    and return its path. Safe to call after a failed run: whatever was written is kept."""
    run_dir = Path(run_dir)
    records = merged_records(run_dir)
    for record in records:
        validate_record(record)
    path = run_dir / METRICS_FILE
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return path


def read_metrics(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a metrics.jsonl file, each validated."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            try:
                validate_record(record)
            except MetricsSchemaError as exc:
                raise MetricsSchemaError(f"{path}:{n}: {exc}") from None
            yield record


def steps_by_rank(records: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The step records of each rank, in step order."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("event") == "step":
            out.setdefault(int(r["rank"]), []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["step"])
    return dict(sorted(out.items()))
