"""`sextant advise`: recommend a training stack for a team profile, with cost of ownership.

    sextant advise --profile FILE [--plan PLAN.json] [--db PATH] [--json | --markdown]
                   [--rules-file FILE]
    sextant advise --init [PATH]       write a commented profile template
    sextant advise --rules             list every rule with its rationale
    sextant advise                     ask the profile questions (on a terminal)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from sextant.errors import UserError

DEFAULT_PROFILE = "sextant-profile.toml"
DEFAULT_DB = Path("sextant-results") / "results.db"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "advise",
        help="recommend a training stack for your team, with cost of ownership",
        description="Rank PyTorch, PyTorch+DeepSpeed, JAX, TensorFlow, PaddlePaddle, MindSpore "
                    "and MLX for a team profile: the rules that fired, measured evidence from "
                    "the results store, cost of ownership and the input that would change "
                    "the answer.",
    )
    p.add_argument("--profile", metavar="FILE", help="team profile TOML (see --init)")
    p.add_argument("--init", nargs="?", const=DEFAULT_PROFILE, default=None, metavar="PATH",
                   help=f"write a commented profile template (default: {DEFAULT_PROFILE})")
    p.add_argument("--db", type=Path, default=None, metavar="PATH",
                   help="results database with measured runs (default: $SEXTANT_RESULTS or "
                        "./sextant-results/results.db)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the advice as JSON")
    out.add_argument("--markdown", action="store_true", help="print the advice as Markdown")
    p.add_argument("--plan", type=Path, default=None, metavar="FILE",
                   help="a planner result ('sextant plan --model M --gpus N --tokens T --json "
                        "> plan.json'): training hours at the target scale come from it")
    p.add_argument("--rules", action="store_true",
                   help="list every rule, constraint and its rationale, then exit")
    p.add_argument("--rules-file", type=Path, default=None, metavar="FILE",
                   help="use this rules file instead of the one shipped with sextant")
    p.set_defaults(func=run_advise)


def load_measured_runs(db: Path | None) -> tuple[list[dict[str, Any]], str | None]:
    """Runs from the results store, or ([], one-line reason) when there are none to read."""
    path = db if db is not None else Path(os.environ.get("SEXTANT_RESULTS") or DEFAULT_DB)
    if not path.is_file():
        return [], (f"No measured evidence: no results store at {path}; advice rests on rules "
                    "of thumb.")
    try:
        store_module = importlib.import_module("sextant.results.store")
    except ModuleNotFoundError as exc:
        if exc.name not in ("sextant.results", "sextant.results.store"):
            raise
        return [], "No measured evidence: this sextant has no results store module."
    store = store_module.ResultsStore(path)
    try:
        runs = list(store.runs())
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    if not runs:
        return [], f"No measured evidence: {path} holds no runs yet."
    return runs, None


def run_advise(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sextant.advisor.engine import advise
    from sextant.advisor.planned import load_plan
    from sextant.advisor.evidence import evidence_from_runs
    from sextant.advisor.profile import ask_profile, load_profile, write_template
    from sextant.advisor.render import print_advice, print_rules, render_markdown, rule_rows
    from sextant.advisor.render import rules_markdown, to_dict
    from sextant.advisor.rules import load_rules

    console = Console(highlight=False)
    if not console.is_terminal and console.width < 140:
        console = Console(highlight=False, width=140)  # readable tables in logs and pipes

    if args.init is not None and (args.profile or args.rules):
        raise UserError("--init writes a template and exits; received it with "
                        f"{'--profile' if args.profile else '--rules'}. Use one at a time")
    rules = load_rules(args.rules_file)
    if args.rules:
        if args.json:
            keys = ("kind", "id", "when", "effect", "rationale")
            print(json.dumps({"version": rules.version,
                              "rules": [dict(zip(keys, row)) for row in rule_rows(rules)]},
                             indent=2))
        elif args.markdown:
            sys.stdout.write(rules_markdown(rules))
        else:
            print_rules(rules, console)
        return 0
    if args.init is not None:
        path = write_template(args.init)
        console.print(f"wrote {path}; edit it, then run: sextant advise --profile {path}")
        return 0

    if args.profile:
        profile = load_profile(args.profile)
    elif sys.stdin is not None and sys.stdin.isatty():
        console.print("No --profile given: answer the questions (Enter takes the default).")
        profile = ask_profile()
    else:
        raise UserError("no --profile given and stdin is not a terminal to ask the questions; "
                        "pass --profile FILE, or write a template with --init [PATH]")

    runs, note = load_measured_runs(args.db)
    evidence = evidence_from_runs(runs) if runs else []
    notes = [note] if note else []
    if runs and not any(e.metric == "throughput_ratio" for e in evidence):
        notes.append(f"{len(runs)} run(s) measured, but no two frameworks on the same workload "
                     "and configuration: compute costs use rules of thumb.")
    planned = load_plan(args.plan, profile) if args.plan is not None else None
    advice = advise(profile, evidence, rules, notes, planned)
    if args.json:
        print(json.dumps(to_dict(advice), indent=2))
    elif args.markdown:
        sys.stdout.write(render_markdown(advice))
    else:
        print_advice(advice, console)
    return 0
