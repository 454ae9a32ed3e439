"""The expert loops (benchmarks/expert/) must share no code with sextant: a
comparison against a loop that imports sextant's model or batches measures sextant against
itself (the flaw of benchmarks/harness_overhead.py's "hand" loop)."""

from __future__ import annotations

import ast
from pathlib import Path

EXPERT = Path(__file__).resolve().parent.parent / "benchmarks" / "expert"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_expert_loops_import_nothing_from_sextant() -> None:
    files = sorted(EXPERT.glob("*.py"))
    assert {f.name for f in files} >= {"torch_gpt.py", "jax_gpt.py", "tf_gpt.py", "common.py"}
    for f in files:
        leaked = {m for m in imported_modules(f) if m.split(".")[0] == "sextant"}
        assert not leaked, f"{f.name} imports {sorted(leaked)}"
