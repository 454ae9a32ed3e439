"""`sextant advise`: recommend a training stack for a team profile, with cost of ownership.

    sextant advise --profile FILE [--plan PLAN.json] [--db PATH] [--json | --markdown]
                   [--rules-file FILE]
    sextant advise init [PATH]          write a commented profile template
    sextant advise rules                list every rule with its rationale
    sextant advise                      ask the profile questions (on a terminal)

The advisor package holds the logic; this module holds the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sextant.commands.common import (
    add_optional_verbs,
    add_store_args,
    db_path,
    inherit_parent_flags,
)
from sextant.core.display import console
from sextant.core.errors import UserError

DEFAULT_PROFILE = "sextant-profile.toml"
# Off a terminal the advice tables are printed this wide (readable in logs and pipes).
_WIDTH = 140


def _add_format_args(p: argparse.ArgumentParser, what: str) -> None:
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help=f"print the {what} as JSON")
    out.add_argument("--markdown", action="store_true", help=f"print the {what} as Markdown")


def _add_rules_file_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules-file", type=Path, default=None, metavar="FILE",
                   help="use this rules file instead of the one shipped with sextant")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "advise",
        help="recommend a training stack for your team, with cost of ownership",
        description="Rank PyTorch, PyTorch+DeepSpeed, JAX, TensorFlow, PaddlePaddle, MindSpore "
                    "and MLX for a team profile: the rules that fired, measured evidence from "
                    "the results store, cost of ownership and the input that would change "
                    "the answer.",
    )
    p.add_argument("--profile", metavar="FILE",
                   help="team profile TOML (see 'sextant advise init')")
    add_store_args(p, purpose="results database with measured runs")
    _add_format_args(p, "advice")
    p.add_argument("--plan", type=Path, default=None, metavar="FILE",
                   help="a planner result ('sextant plan --model M --gpus N --tokens T --json "
                        "> plan.json'): training hours at the target scale come from it")
    _add_rules_file_arg(p)
    p.set_defaults(func=run_advise)

    verbs = add_optional_verbs(
        p, "optional; without one, advise on the profile")
    i = verbs.add_parser("init", help="write a commented profile template",
                         description="Write a commented team-profile template to edit.")
    i.add_argument("path", nargs="?", default=DEFAULT_PROFILE, metavar="PATH",
                   help=f"where to write it (default: {DEFAULT_PROFILE})")
    i.set_defaults(func=run_init)
    r = verbs.add_parser("rules", help="list every rule, constraint and its rationale",
                         description="List every rule, constraint and its rationale.")
    _add_format_args(r, "rules")
    _add_rules_file_arg(r)
    inherit_parent_flags(r)
    r.set_defaults(func=run_rules)


def run_init(args: argparse.Namespace) -> int:
    from sextant.advisor.profile import write_template

    path = write_template(args.path)
    console(_WIDTH).print(f"wrote {path}; edit it, then run: sextant advise --profile {path}")
    return 0


def run_rules(args: argparse.Namespace) -> int:
    from sextant.advisor.render import print_rules, rule_rows, rules_markdown
    from sextant.advisor.rules import load_rules

    rules = load_rules(args.rules_file)
    if args.json:
        keys = ("kind", "id", "when", "effect", "rationale")
        print(json.dumps({"version": rules.version,
                          "rules": [dict(zip(keys, row)) for row in rule_rows(rules)]},
                         indent=2))
    elif args.markdown:
        sys.stdout.write(rules_markdown(rules))
    else:
        print_rules(rules, console(_WIDTH))
    return 0


def run_advise(args: argparse.Namespace) -> int:
    from sextant.advisor.engine import advise
    from sextant.advisor.evidence import (
        applicable,
        evidence_from_deployments,
        evidence_from_runs,
        load_measured_deployments,
        load_measured_runs,
    )
    from sextant.advisor.planned import load_plan
    from sextant.advisor.profile import ask_profile, load_profile
    from sextant.advisor.render import print_advice, render_markdown, to_dict
    from sextant.advisor.rules import load_rules

    out = console(_WIDTH)
    rules = load_rules(args.rules_file)
    if args.profile:
        profile = load_profile(args.profile)
    elif sys.stdin is not None and sys.stdin.isatty():
        out.print("No --profile given: answer the questions (Enter takes the default).")
        profile = ask_profile()
    else:
        raise UserError("no --profile given and stdin is not a terminal to ask the questions; "
                        "pass --profile FILE, or write a template with 'sextant advise init "
                        "[PATH]'")

    runs, note = load_measured_runs(db_path(args))
    runs, elsewhere = applicable(runs, profile.hardware)
    evidence = evidence_from_runs(runs) if runs else []
    evidence += evidence_from_deployments(load_measured_deployments(db_path(args)),
                                          profile.deployment)
    notes = [n for n in (note, elsewhere) if n]
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
        print_advice(advice, out)
    return 0
