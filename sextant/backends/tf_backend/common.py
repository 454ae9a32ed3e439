"""Pieces shared by the TensorFlow training modes (no TensorFlow import here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class RetracedError(RuntimeError):
    """The training step was traced again after warm-up: every later step would pay the
    tracing (and XLA compilation) again, and the timings would be meaningless."""


def guard_retracing(fn: Any, warmup: int,
                    counter: Callable[[], int] | None = None) -> Callable[..., Any]:
    """Call `fn`; fail if the tracing count (of the tf.function `fn`, or `counter()`) grows
    after `warmup` calls."""
    state = {"calls": 0, "traces": None}
    count_of = counter or fn.experimental_get_tracing_count

    def call(*args: Any) -> Any:
        out = fn(*args)
        state["calls"] += 1
        count = count_of()
        if state["calls"] == warmup:
            state["traces"] = count
        elif state["traces"] is not None and count > state["traces"]:
            raise RetracedError(
                f"the train step was traced again after warm-up (call {state['calls']}, "
                f"{count} traces): an input changed shape or dtype"
            )
        return out

    return call


def nbytes(arrays: Any) -> int:
    return int(sum(int(np.prod(a.shape)) * 4 for a in arrays))  # fp32 only
