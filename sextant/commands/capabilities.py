"""`sextant capabilities`: which framework supports which strategy and lever."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from sextant.backends import available, get_backend
from sextant.backends.base import REGISTRY
from sextant.core.display import console
from sextant.strategy import COMPRESSIONS, MODES, PARALLEL, PRECISIONS


def register(sub: Any) -> None:
    p = sub.add_parser("capabilities", help="which framework supports which strategy and lever",
                       description="Print the matrix of frameworks x strategies and levers.")
    p.set_defaults(func=cmd_capabilities)


def matrix() -> tuple[list[str], list[tuple[str, list[bool | str]]]]:
    names = list(REGISTRY)
    caps = {n: get_backend(n).capabilities() for n in names}
    rows: list[tuple[str, list[bool | str]]] = [
        ("installed", [_installed(n) for n in names])]
    rows += [(f"mode {m}", [m in caps[n].modes for n in names]) for m in MODES]
    rows += [(f"parallel {p}", [p in caps[n].parallel for n in names]) for p in PARALLEL]
    rows += [(f"precision {p}", [p in caps[n].precisions for n in names]) for p in PRECISIONS]
    rows += [(f"compress {c}", [c in caps[n].compress for n in names])
             for c in COMPRESSIONS if c != "none"]
    rows.append(("grad accumulation", [caps[n].grad_accum for n in names]))
    rows.append(("activation checkpointing", [caps[n].activation_checkpointing for n in names]))
    rows.append(("checkpoint/resume", [", ".join(caps[n].checkpoint) or False for n in names]))
    rows.append(("deployment formats", [", ".join(f.name for f in caps[n].exports) or False
                                        for n in names]))
    rows += [(f"model {f.replace('_', ' ')}", [f in caps[n].model_features for n in names])
             for f in ("qkv_bias", "tied_gpt_head")]
    return names, rows


def _installed(name: str) -> str:
    own = get_backend(name).ENVIRONMENT
    if own is None:
        return "yes" if available(name) else "no"
    return f"own env: {'yes' if available(name) else 'no'}"


def cmd_capabilities(args: argparse.Namespace) -> int:
    names, rows = matrix()
    table = Table(header_style="bold", title="what each backend supports "
                  "(asking for anything else is an error naming what is supported)",
                  title_justify="left")
    table.add_column("")
    for name in names:
        table.add_column(name, justify="center")
    for label, cells in rows:
        table.add_row(label, *("✓" if c is True else "-" if c is False else str(c)
                               for c in cells))
    out = console()
    out.print(table)
    for name in names:
        own = get_backend(name).ENVIRONMENT
        if own is not None:
            out.print(f"{name} trains in an environment of its own: sextant env create {own}")
        kinds: dict[str, list[str]] = {}  # reason -> strategies, so each reason prints once
        for kind, reason in get_backend(name).capabilities().why_not:
            kinds.setdefault(reason, []).append(kind)
        for reason, which in kinds.items():
            out.print(f"{name} parallel {', '.join(which)}: {reason}")
    return 0
