"""The typed contracts between the launcher, the harness and a backend.

`WorkerContext` is what a backend's `run` receives inside its worker process; `RankResult` is
what it returns (the raw measurements of one rank, which `sextant.runner.aggregate` and
`rank_summaries` turn into the stored run record). They live below every part that names
them (the backends, the timed loop in `sextant.measure`, checkpoints, the launchers), so that
each imports them downward: `sextant.launch.worker` builds a WorkerContext, a backend reads
it, and nothing here imports a framework or a launcher.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO, TypedDict

from sextant.strategy import Strategy
from sextant.workloads.spec import Workload

EVENT_SCHEMA = 1
"""Version of the progress-event lines a rank writes (rank{r}.events.jsonl)."""

RANK_RESULT_SCHEMA = 1
"""Version of the RankResult shape below. Rank results are not stored as they are: the run
record (sextant.results.record.RunRecord) is assembled from them, so a change here that keeps the
keys the runner reads keeps every stored record readable."""


class Sender(Protocol):
    """Where a rank sends its events and result when it shares no filesystem with the
    launching process (sextant.launch.collector.Channel, authenticated)."""

    def send(self, msg: dict[str, Any]) -> None: ...


@dataclass(kw_only=True)
class WorkerContext:
    """One rank of one run, as its worker process sees it."""

    workload: Workload
    strategy: Strategy
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    run_dir: Path
    threads: int
    collective_timeout_s: float
    roles: tuple[str, ...] = ()
    """Role of every rank (see backends.base.ProcessLayout)."""
    ports: tuple[int, ...] = ()
    """A free port reserved for every rank."""
    addresses: tuple[str, ...] = ()
    """Address of every rank's host (loopback on one machine)."""
    local_world: int = 1
    """Ranks on this rank's host."""
    fault: str | None = None
    """Test hook (SEXTANT_TEST_FAULT): a deliberate bug, so tests can prove they fail on it."""
    resume_step: int | None = None
    """With --resume: the checkpoint step the launching process accepted (0: none yet), which
    every rank must load (sextant.checkpoint.resume_point); None when it did not say."""
    _events: TextIO | None = field(default=None, repr=False)
    channel: Sender | None = field(default=None, repr=False)
    """Connection to the run's collector when the ranks share no filesystem with it."""

    @property
    def role(self) -> str:
        return self.roles[self.rank]

    def endpoint(self, rank: int) -> str:
        """host:port a rank's server listens on (TF_CONFIG and the like)."""
        return f"{self.addresses[rank]}:{self.ports[rank]}"

    @property
    def is_distributed(self) -> bool:
        return self.strategy.parallel != "single"

    def emit(self, kind: str, **payload: Any) -> None:
        """Append one event line (schema-versioned) to this rank's event file."""
        if self._events is None:
            self._events = open(self.run_dir / f"rank{self.rank}.events.jsonl", "a")
        record = {"schema": EVENT_SCHEMA, "event": kind, "rank": self.rank,
                  "time": time.time(), **payload}
        self._events.write(json.dumps(record) + "\n")
        self._events.flush()
        if self.channel is not None:
            self.channel.send({"kind": "event", "event": record})


class Event(TypedDict):
    """What every event line carries (rank{r}.events.jsonl, metrics.jsonl, the collector's
    event messages); the kind's own fields follow (EVENTS)."""

    schema: int
    event: str
    rank: int
    time: float


class StartEvent(TypedDict):
    steps: int


class StepEvent(TypedDict):
    step: int
    loss: float | None
    step_time_s: float
    data_time_s: float
    rows: int | None


class PhaseEvent(TypedDict):
    name: str


class CheckpointEvent(TypedDict):
    step: int
    seconds: float


class ResumedEvent(TypedDict):
    step: int


class WarningEvent(TypedDict):
    message: str


class DoneEvent(TypedDict):
    pass


EVENTS: dict[str, type] = {
    "start": StartEvent, "step": StepEvent, "phase": PhaseEvent,
    "checkpoint": CheckpointEvent, "resumed": ResumedEvent, "warning": WarningEvent,
    "done": DoneEvent,
}
"""Each event kind's own fields (sextant.core.schema.problem checks them); readers keep kinds they
do not know, which a newer worker may write."""


class EventMessage(TypedDict):
    kind: str
    event: dict[str, Any]


class ResultMessage(TypedDict):
    kind: str
    result: dict[str, Any]


class ErrorMessage(TypedDict):
    kind: str
    text: str


MESSAGES: dict[str, type] = {"event": EventMessage, "result": ResultMessage,
                             "error": ErrorMessage}
"""What a rank sends its collector after the hello (sextant.launch.collector), by kind."""


class _RankResultOptional(TypedDict, total=False):
    rank: int
    """Added by the worker (sextant.launch.worker.run_rank) after `run` returns."""
    world: int
    device_peak_bytes: int
    """Accelerator allocator peak, where the framework reports one."""
    startup: dict[str, float | None]
    """Wall-clock marks of the edit-run loop (the timed loop's loop_start_time and
    first_step_end_time; the worker's process_start_time and import_s)."""


class RankResult(_RankResultOptional):
    """What one primary rank returns (schema RANK_RESULT_SCHEMA), as a JSON-ready dict.

    The timed loop (`sextant.measure.loop.timed_training`) fills the timing and numerics
    keys; the backend adds the accounting, details and fingerprint; the worker adds rank and
    world. Lists are per step, from `start_step`. (Optional keys are declared in a
    `total=False` base: `NotRequired` is not seen under postponed annotations on 3.11.)
    """

    step_times_s: list[float]
    data_times_s: list[float]
    losses: list[float]
    grad_norms: list[float]
    start_step: int
    rows_per_step: list[int | None]
    checkpoint_times_s: list[float]
    warmup_steps: int
    peak_rss_bytes: int
    rss_start_bytes: int
    sync_step_times_s: list[float]
    """Exposed-communication pairs: steps with gradient sync (empty without a no-sync step)."""
    nosync_step_times_s: list[float]
    final_params_sha256: str | None
    """Digest of the final canonical parameters (rank 0 only; None elsewhere)."""
    memory_accounting: dict[str, Any]
    comm: dict[str, Any]
    details: dict[str, Any]
    fingerprint: dict[str, Any]


RANK_RESULT_KEYS: frozenset[str] = frozenset(RankResult.__required_keys__)
"""The keys every backend's `run` must return."""


def result_problem(result: Any) -> str | None:
    """What is wrong with a rank's result against RankResult (a key missing, or one of
    another type), or None; the runner refuses a run whose rank returned such a result."""
    from sextant.core.schema import problem

    return problem(result, RankResult)
