"""Fail a run that compiles its step again after warm-up.

Every later step would pay tracing and compilation again and the timings would be
meaningless, so sextant stops loudly instead (the optax test-utility idea). Backends pass
the framework's own counter: a jitted function's cache size (JAX), a tf.function's tracing
count (TensorFlow).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class RecompiledError(RuntimeError):
    """The training step was compiled again after warm-up."""


def guard_recompiles(fn: Callable[..., Any], warmup: int, count: Callable[[], int]
                     ) -> Callable[..., Any]:
    """`fn`, failing with RecompiledError if `count()` grows after `warmup` calls."""
    state: dict[str, Any] = {"calls": 0, "compiled": None}

    def call(*args: Any) -> Any:
        out = fn(*args)
        state["calls"] += 1
        n = count()
        if state["calls"] == warmup:
            state["compiled"] = n
        elif state["compiled"] is not None and n > state["compiled"]:
            raise RecompiledError(
                f"the train step recompiled after warm-up (call {state['calls']}, {n} compiled "
                "versions): an input changed shape, dtype or sharding"
            )
        return out

    return call
