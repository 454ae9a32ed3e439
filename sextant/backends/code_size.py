"""How much sextant code a strategy needed, counted in the source without importing the
framework (the parent process never imports one).

A backend names, per parallel strategy, the functions and classes that implement it
(`BackendBase.strategy_code`: "module:qualname" entries); their statements are counted with
`ast`: lines of code, not blank lines, comments or docstrings. What every strategy shares (the
model, the timed loop, the optimizer, checkpoints) is not counted. It is the articles'
"control vs automation" trade in one number: a declared layout needs a few lines of
PartitionSpecs, a hand-written one needs its collectives written out.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.lru_cache(maxsize=None)
def _source(module: str) -> tuple[str, ast.Module]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"no source for module {module}")
    text = Path(spec.origin).read_text()
    return text, ast.parse(text)


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _find(tree: ast.Module, qualname: str) -> Definition:
    node: ast.AST = tree
    found: Definition | None = None
    for part in qualname.split("."):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) \
                    and child.name == part:
                node = found = child
                break
        else:
            raise LookupError(f"{qualname}: not found")
    assert found is not None
    return found


def code_lines(entry: str) -> int:
    """Lines of code of one "module:qualname" (its docstrings, comments and blank lines
    excluded)."""
    module, qualname = entry.split(":")
    text, tree = _source(module)
    node = _find(tree, qualname)
    lines = text.splitlines()
    docstrings: set[int] = set()
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    count = 0
    for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        stripped = lines[number - 1].strip()
        if stripped and not stripped.startswith("#") and number not in docstrings:
            count += 1
    return count


def strategy_lines(entries: tuple[str, ...]) -> int | None:
    """Total lines of the entries; None when the backend names none."""
    return sum(code_lines(e) for e in entries) if entries else None
