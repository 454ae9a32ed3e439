"""One way to declare and check a JSON message: a TypedDict, read by `problem`.

What crosses a process boundary as JSON (a rank's events, the collector's messages, the lines
of metrics.jsonl) is declared once as a TypedDict (sextant.contracts, sextant.monitor), and
checked against that declaration by `problem`, from its annotations. JSON's own rules apply:
true is not a number, and a float field takes integers. Optional keys are those of a
`total=False` TypedDict. Range checks (a port below 65536, a rank inside the world) stay with
the code that knows the range.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Union, get_args, get_origin, get_type_hints


def _accepts(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return any(_accepts(value, h) for h in get_args(hint))
    if hint is None or hint is type(None):
        return value is None
    kind = origin or hint  # dict[str, Any] -> dict, list[float] -> list
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


def _names(hint: Any) -> list[str]:
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return [n for h in get_args(hint) for n in _names(h)]
    if hint is None or hint is type(None):
        return ["NoneType"]
    kind = origin or hint
    return ["int", "float"] if kind is float else [getattr(kind, "__name__", str(kind))]


@functools.cache
def _hints(shape: type) -> dict[str, Any]:
    return get_type_hints(shape)


def problem(record: Any, shape: type, where: str = "") -> str | None:
    """None when `record` (parsed JSON) has every required key of the TypedDict `shape` and
    each key it has holds a value of the declared type; else the first thing wrong, prefixed
    by `where`. Keys `shape` does not declare are allowed (a newer writer may add some)."""
    if not isinstance(record, dict):
        return f"{where}not a JSON object"
    required: frozenset[str] = getattr(shape, "__required_keys__", frozenset())
    for name, hint in _hints(shape).items():
        if name not in record:
            if name in required:
                return f"{where}missing field {name!r}"
            continue
        value = record[name]
        if not _accepts(value, hint):
            return (f"{where}{name!r} has type {type(value).__name__}; allowed: "
                    f"{', '.join(_names(hint))}")
    return None
