"""Bundled real datasets and deterministic global batches.

Global batch i is a pure function of (dataset, seed, i): the same arrays for every framework
and every worker count. Rank r of N takes the contiguous slice [r*B/N, (r+1)*B/N).

Bundled data (see sextant/data/README.md for sources and licences):
- digits: 1,797 8x8 handwritten digits, 64 features scaled to [0, 1], 10 classes.
- python-reference: the Python language reference help topics (466 KB of English technical
  prose), byte-level tokens (vocabulary 256).

Your own text files (`[data] files`) are tokenized into a memory-mapped token file by
sextant.data.files; rank r gathers only its own rows of each global batch from it.
"""

from __future__ import annotations

import functools
import gzip
import time
from pathlib import Path

import numpy as np

from sextant.core.errors import UserError
from sextant.workloads.spec import MLPSpec, Workload

DATA_DIR = Path(__file__).parent


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(features float32 (1797, 64) in [0, 1], labels int64 (1797,))."""
    with gzip.open(DATA_DIR / "digits.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    features = np.ascontiguousarray(table[:, :-1] / np.float32(16.0))
    labels = table[:, -1].astype(np.int64)
    return features, labels


@functools.cache
def text_tokens(name: str = "python-reference") -> np.ndarray:
    """Byte-level tokens (uint8) of a bundled corpus."""
    with gzip.open(DATA_DIR / f"{name}.txt.gz", "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8)


AHEAD_BYTES = 32 * 2**20
"""How many bytes of global batches `prepare` makes at a time (at most 64 batches)."""


class _Ahead:
    """Global batches made before the step that uses them (by `prepare`, outside the step's
    clock): the timed loop's analogue of an expert's batches built before the loop. Each is
    handed out once; anything not prepared is made on the spot, so results never depend on
    it."""

    def __init__(self) -> None:
        self.owner: Workload | None = None
        self.span = range(0)
        """The steps of the last `prepare`."""
        self.batches: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def take(self, workload: Workload, step: int) -> tuple[np.ndarray, np.ndarray] | None:
        return self.batches.pop(step, None) if workload is self.owner else None


_AHEAD = _Ahead()


def batches_ahead(workload: Workload) -> int:
    """How many global batches `prepare` should make at a time for this workload."""
    model = workload.model
    row = (4 * model.input_dim + 8 if isinstance(model, MLPSpec)
           else 8 * (model.seq_len + 1))
    return int(max(1, min(64, AHEAD_BYTES // max(row * workload.global_batch, 1))))


def prepare(workload: Workload, steps: range) -> None:
    """Make global batches `steps` now, so that global_batch hands them out without
    generating them (the timed loop calls this between steps, outside the clock; the
    generation is the same numpy code for every framework, so no framework's step should
    pay for it). Replaces whatever was prepared before. Not for your own files: each rank
    reads its own rows from their memory map (local_batch), never whole global batches."""
    if workload.data.files:
        return
    _AHEAD.owner, _AHEAD.span = workload, steps
    _AHEAD.batches = {i: _make(workload, i) for i in steps}


def prepare_ahead(workload: Workload, step: int) -> None:
    """What the training loops call before each step's clock starts: unless batch `step` was
    made by the last `prepare` for this workload, make it and the next ones
    (batches_ahead, up to the workload's last step)."""
    if workload is _AHEAD.owner and step in _AHEAD.span:
        return
    if step < workload.steps:
        prepare(workload, range(step, min(step + batches_ahead(workload), workload.steps)))


def global_batch(workload: Workload, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The inputs and targets of global batch `step` (made by `prepare` if it was).

    mlp: (x float32 (B, 64), y int64 (B,)); gpt and llama: (x int64 (B, T), y int64 (B, T)), y being x
    shifted by one byte.
    """
    ready = _AHEAD.take(workload, step)
    return ready if ready is not None else _make(workload, step)


def _make(workload: Workload, step: int) -> tuple[np.ndarray, np.ndarray]:
    if workload.data.files:
        from sextant.data import files

        return files.windows(workload, step, slice(None))
    rng = np.random.default_rng([workload.seed, 0xDA7A, step])
    batch = workload.global_batch
    if not isinstance(workload.model, MLPSpec):
        tokens = text_tokens(workload.data.dataset)
        window = workload.model.seq_len + 1
        offsets = rng.integers(0, tokens.size - window, size=batch)
        # A direct gather: the same windows as sliding_window_view(tokens, window)[offsets]
        # without its ~60 us of Python per call (made ahead of the training steps by
        # `prepare`, or on the spot for a batch that was not).
        windows = tokens[offsets[:, None] + np.arange(window)].astype(np.int64)  # (B, T + 1)
        # Contiguous, as an expert's batches are (a framework would otherwise copy them, or
        # run its first kernels on strided indices).
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])
    features, labels = digits()
    if batch > labels.size:
        raise UserError(
            f"global_batch {batch} exceeds the digits dataset ({labels.size} samples)"
        )
    index = rng.choice(labels.size, size=batch, replace=False)
    return features[index], labels[index]


def shard(array: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Rank `rank`'s contiguous slice of a global batch along axis 0."""
    size = array.shape[0]
    if size % world:
        raise UserError(f"global batch {size} is not divisible by {world} workers")
    per = size // world
    return array[rank * per : (rank + 1) * per]


def local_batch(workload: Workload, step: int, rank: int, world: int,
                fault: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shard of global batch `step`.

    Test hooks (SEXTANT_TEST_FAULT): skew-rank-R gives rank R twice its share (its slice
    repeated), the data skew a badly balanced loader produces; slow-reader[-MS] makes every
    read MS ms (default 30) slower, a pipeline that cannot keep up (sextant.data.probe)."""
    if workload.data.files:  # only this rank's rows leave the memory map
        from sextant.data import files

        if workload.global_batch % world:
            raise UserError(f"global batch {workload.global_batch} is not divisible by "
                            f"{world} workers")
        per = workload.global_batch // world
        x, y = files.windows(workload, step, slice(rank * per, (rank + 1) * per))
    else:
        x, y = global_batch(workload, step)
        x, y = shard(x, rank, world), shard(y, rank, world)
    if fault and f"skew-rank-{rank}" in fault.split(","):
        x, y = np.concatenate([x, x]), np.concatenate([y, y])
    if fault and "slow-reader" in fault:
        time.sleep(slow_reader_s(fault))
    return x, y


def slow_reader_s(fault: str) -> float:
    """The delay of the slow-reader[-MS] test hook, in seconds (0 without it)."""
    for item in fault.split(","):
        parts = item.strip().split("-")
        if item.strip().startswith("slow-reader"):
            return (int(parts[2]) if len(parts) > 2 else 30) / 1e3
    return 0.0
