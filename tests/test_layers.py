"""The package's layers point one way: every import (inside functions too) goes from a unit
to one of a lower layer, as pyproject.toml's [tool.sextant] layers state. A unit is a
subpackage of sextant or one of its top-level modules."""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "sextant"
TYPE_ONLY_BACK_EDGES: set[tuple[str, str]] = set()
"""Back-edges that would exist only for the type checker (`if TYPE_CHECKING:`): none. The
test fails when one appears."""


def layers() -> list[list[str]]:
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["sextant"]["layers"]
    return [[unit.strip() for unit in row.split("|")] for row in table]


def unit_of(module: str) -> str | None:
    """'sextant.launch.local' -> 'launch'; the package root itself -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "sextant" and len(parts) > 1 else None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(path: Path, module: str, *, type_only: bool) -> set[str]:
    """Every sextant module that `path` imports anywhere; with type_only, also those in
    `if TYPE_CHECKING:` blocks."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node) and not type_only:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.update([f"{base}.{a.name}" for a in node.names] if base == "sextant"
                         else [base])
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m == "sextant" or m.startswith("sextant.")}


def edges(*, type_only: bool = False) -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the module-level imports behind it."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    known = units()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        source = unit_of(module)
        for target in imported(path, module, type_only=type_only):
            dest = unit_of(target)
            if source and dest in known and dest != source:
                out[source, dest].append(f"{module} -> {target}")
    return out


def units() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {
        p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def test_every_unit_has_one_place_in_the_layers():
    listed = [u for row in layers() for u in row]
    assert sorted(listed) == sorted(set(listed)), "a unit is listed twice"
    assert set(listed) == units()


def test_imports_point_down_the_layers():
    level = {u: i for i, row in enumerate(reversed(layers())) for u in row}
    upward = {f"{a} -> {b}": where[:3] for (a, b), where in edges().items()
              if level[b] >= level[a]}
    assert not upward, upward


def test_the_type_only_back_edges_are_the_known_ones():
    level = {u: i for i, row in enumerate(reversed(layers())) for u in row}
    back = {pair for pair in edges(type_only=True) if level[pair[1]] >= level[pair[0]]}
    assert back == TYPE_ONLY_BACK_EDGES


def test_the_units_form_no_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges():
        graph[a].add(b)
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node in done:
            return
        for nxt in graph[node]:
            visit(nxt, (*path, node))
        done.add(node)

    for node in list(graph):
        visit(node, ())
