"""`sextant runs list | show ID | export`: read the results store."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from sextant.commands.common import add_store_args, open_store
from sextant.core.display import console, fmt_ms, fmt_rate
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_text
from sextant.results.record import RUN_STATUSES, RunRecord
from sextant.results.store import finite_json
from sextant.workloads.spec import workload_from_dict

# Flat columns of a CSV export: run identity, then every scalar metric.
_IDENTITY = ("id", "created_at", "group_id", "workload_name", "workload_hash", "framework",
             "mode", "parallel", "workers", "precision", "status")


def register(sub: Any) -> None:
    p = sub.add_parser("runs", help="list, show and export stored runs",
                       description="Read the results store.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True,
                             parser_class=type(p))
    ls = verbs.add_parser("list", help="one line per stored run")
    add_store_args(ls)
    ls.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="everything stored about one run, as JSON")
    show.add_argument("id", type=int)
    add_store_args(show)
    show.set_defaults(func=cmd_show)
    export = verbs.add_parser("export", help="all runs as CSV or JSON")
    export.add_argument("--format", default="csv", help="csv (default) or json")
    export.add_argument("--out", default=None, help="file to write (default: standard output)")
    add_store_args(export)
    export.set_defaults(func=cmd_export)
    imp = verbs.add_parser("import", help="add a run record kept aside (record.json) to a store")
    imp.add_argument("record", type=Path, help="the record.json a run kept when the database "
                                                "was locked")
    add_store_args(imp)
    imp.set_defaults(func=cmd_import)


def cmd_list(args: argparse.Namespace) -> int:
    with open_store(args, create=False) as store:
        runs = store.runs()
    table = Table(header_style="bold")
    for col in ("id", "created", "workload", "run", "status", "step ms", "tokens/s",
                "final loss", "group"):
        table.add_column(col)
    for r in runs:
        m = r.metrics
        table.add_row(str(r.id), r.created_at[:19], escape(r.workload_name),
                      escape(r.label), escape(r.status) + (" (disturbed)" if m.disturbed else ""),
                      fmt_ms(m.step_time_median_s), fmt_rate(m.tokens_per_s),
                      f"{m.final_loss:.4f}" if m.final_loss is not None else "-",
                      r.group_id or "-")
    console().print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with open_store(args, create=False) as store:
        record = store.get(args.id)
    sys.stdout.write(json.dumps(finite_json(record.to_dict()), indent=2, sort_keys=True) + "\n")
    return 0


def flat_row(run: RunRecord) -> dict[str, Any]:
    doc = run.to_dict()
    row = {k: doc[k] for k in _IDENTITY}
    for key, value in sorted(doc["metrics"].items()):
        if value is None or isinstance(value, (int, float, str)):
            row[key] = value
    return row


def cmd_export(args: argparse.Namespace) -> int:
    if args.format not in ("csv", "json"):
        raise UserError(f"unknown export format {args.format!r}; allowed: csv, json")
    with open_store(args, create=False) as store:
        runs = store.runs()
    if args.format == "json":
        text = json.dumps(finite_json([r.to_dict() for r in runs]), indent=1, sort_keys=True,
                          allow_nan=False) + "\n"
    else:
        rows = [finite_json(flat_row(r)) for r in runs]
        fields = list(dict.fromkeys(k for row in rows for k in row)) or list(_IDENTITY)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    if args.out:
        atomic_write_text(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


RECORD_KEYS = ("workload", "workload_hash", "strategy", "metrics")


def cmd_import(args: argparse.Namespace) -> int:
    path: Path = args.record
    if not path.is_file():
        raise UserError(f"no record file at {path}"
                        + (" (it is a directory)" if path.is_dir() else ""))
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UserError(f"{path} is not a JSON run record") from None
    if not isinstance(record, dict) or any(k not in record for k in RECORD_KEYS):
        raise UserError(f"{path} is not a run record: it needs the keys "
                        f"{', '.join(RECORD_KEYS)}")
    status = record.get("status", "ok")
    if status not in RUN_STATUSES:
        raise UserError(f"{path}: status must be one of {', '.join(RUN_STATUSES)}. Received: "
                        f"{str(status)[:40]!r}")
    try:
        workload_from_dict(record["workload"])
        run = RunRecord.from_dict({**record, "id": None}, name=f"{path}:")
    except (UserError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is not a valid run record ({exc})") from None
    with open_store(args) as store:
        existing = store.find(run)
        if existing is not None:
            raise UserError(f"{path} is already stored as run {existing} in {store.path}")
        run_id = store.add(run)
    console().print(f"stored as run {run_id} in {store.path}", markup=False)
    return 0
