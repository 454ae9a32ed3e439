"""The run record: what one run was, what it measured and how it trained, typed.

`RunRecord.from_dict` is the one place a record is built from its stored form (a results-store
row, a record kept beside a run's logs, the runner's aggregate), and `to_dict` the one place it
is written back; every reader (report, claims, advisor, checks, `plan validate`) takes the
typed record. A stored value of the wrong kind refuses the whole record with a message that
names the field, so a hand-edited or damaged row cannot reach a verdict as a silent None.

The JSON shape is versioned (`RECORD_VERSION`, the `schema` key of a kept record). Version 1
rows (every store written so far) read as they are: fields added since then (the device axis,
effective precision, MFU) come out as their defaults, which is what those runs did (CPU,
the precision asked for, no accelerator).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from sextant.core.errors import UserError
from sextant.strategy import Strategy

RECORD_VERSION = 1
"""The JSON shape that `to_dict` writes and `from_dict` reads (see the module docstring)."""
RUN_STATUSES = ("ok", "failed", "interrupted", "diverged")
"""What a stored run's `status` may be (sextant.runner writes each)."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_T = TypeVar("_T")


class RecordError(UserError):
    """A stored record holds a value sextant never writes there."""


def _frozen(value: Any) -> Any:
    """A JSON value that cannot be changed through the record (nested mappings read-only,
    lists as tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    """The JSON form of a `_frozen` value."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thawed(v) for v in value]
    return value


def _number(where: str, value: Any) -> float | None:
    """A finite float, or None for a missing or non-finite one (JSON stores NaN as null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{where} is {value!r}, not a number")
    return float(value) if math.isfinite(value) else None


def _integer(where: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{where} is {value!r}, not an integer")
    return value


def _text(where: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordError(f"{where} is {value!r}, not text")
    return value


def _table(where: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise RecordError(f"{where} is not a JSON object")
    frozen: Mapping[str, Any] = _frozen(value)
    return frozen


def _series(where: str, value: Any) -> tuple[float | None, ...]:
    """Per-step figures; a non-finite step (stored as null) stays in place as None."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise RecordError(f"{where} is not a JSON array")
    return tuple(_number(f"{where}[{i}]", v) for i, v in enumerate(value))


_READERS = {float: _number, int: _integer, str: _text}


def _typed_fields(cls: type[_T], where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The values of `cls`'s scalar fields read from `raw` by their annotated kind; the keys
    `cls` does not name are left for the caller."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = f.metadata.get("kind")
        if kind is None or f.name not in raw:
            continue
        if kind is bool:
            out[f.name] = bool(raw[f.name])
        else:
            out[f.name] = _READERS[kind](f"{where}.{f.name}", raw[f.name])
    return out


def _kind(kind: type, default: Any = None) -> Any:
    return field(default=default, metadata={"kind": kind})


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """A run's figures (sextant.runner.aggregate). Every figure may be missing (None): a run
    that failed has its parameter count and its error only, a one-process run no exposed
    communication, a CPU run no MFU."""

    params: int | None = _kind(int)
    step_time_median_s: float | None = _kind(float)
    step_time_p10_s: float | None = _kind(float)
    step_time_p90_s: float | None = _kind(float)
    step_time_mean_s: float | None = _kind(float)
    steps_timed: int | None = _kind(int)
    first_step_s: float | None = _kind(float)
    compile_s: float | None = _kind(float)
    time_to_first_step_s: float | None = _kind(float)
    """The edit-run loop: rank 0's process start to its first finished step."""
    import_s: float | None = _kind(float)
    """Importing the framework (part of time_to_first_step_s)."""
    setup_s: float | None = _kind(float)
    """Building the model, placing it and joining the other ranks, before the first step."""
    samples_per_s: float | None = _kind(float)
    tokens_per_s: float | None = _kind(float)
    tokens_per_step: float | None = _kind(float)
    flops_per_step: float | None = _kind(float)
    achieved_flops_per_s: float | None = _kind(float)
    peak_rss_bytes: float | None = _kind(float)
    """The largest rank's peak resident memory."""
    peak_rss_total_bytes: float | None = _kind(float)
    device_peak_bytes: float | None = _kind(float)
    data_wait_median_s: float | None = _kind(float)
    data_wait_share: float | None = _kind(float)
    final_loss: float | None = _kind(float)
    threads_per_worker: int | None = _kind(int)
    resumed_from_step: int | None = _kind(int)
    checkpoint_save_median_s: float | None = _kind(float)
    exposed_comm_s: float | None = _kind(float)
    """Median of (synchronised - unsynchronised) step, paired; may be slightly negative
    (noise) when communication hides entirely."""
    exposed_comm_share: float | None = _kind(float)
    sync_step_median_s: float | None = _kind(float)
    nosync_step_median_s: float | None = _kind(float)
    comm_pairs: int | None = _kind(int)
    device: str | None = _kind(str)
    accelerator: str | None = _kind(str)
    effective_precision: str | None = _kind(str)
    """The precision the framework reported using (fp32 for tf32 on a device without TF32
    units); None in records from before it was read back."""
    mfu: float | None = _kind(float)
    mfu_note: str | None = _kind(str)
    peak_flops: float | None = _kind(float)
    planner_step_s: float | None = _kind(float)
    planner_error: float | None = _kind(float)
    planner_version: str | None = _kind(str)
    catalogue_hash: str | None = _kind(str)
    """The planner and catalogue that made mfu, peak_flops and planner_step_s
    (sextant.planner.version); None in records from before they were kept."""
    disturbed: bool = _kind(bool, False)
    """Other programs used the machine while it trained (sextant.measure.interference)."""
    trial: int | None = _kind(int)
    trials: int | None = _kind(int)
    error: str | None = _kind(str)
    steps_done: int | None = _kind(int)
    diverged_at_step: int | None = _kind(int)
    diverged_rank: int | None = _kind(int)
    diverged_value: str | None = _kind(str)
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """Figures this version of sextant does not name (a newer writer's), kept as written."""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "metrics") -> Metrics:
        known = _typed_fields(cls, where, raw)
        extra = {k: v for k, v in raw.items() if k not in known and k != "extra"}
        return cls(**known, extra=_frozen(extra))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra"}
        return {**_thawed(self.extra), **out}


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """Summary of one rank's steady-state step times (sextant.measure.stats.summarize)."""

    median: float | None = _kind(float)
    p10: float | None = _kind(float)
    p90: float | None = _kind(float)
    mean: float | None = _kind(float)
    n: int | None = _kind(int)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_RANK_SERIES = ("step_times_s", "sync_step_times_s", "nosync_step_times_s",
                "checkpoint_times_s", "local_losses")
_RANK_TABLES = ("memory_accounting", "comm", "fingerprint", "details")


@dataclass(frozen=True, kw_only=True)
class RankSummary:
    """One rank's part of a run (sextant.runner.rank_summaries)."""

    rank: int = _kind(int, 0)
    step_time: StepTimes = StepTimes()
    step_times_s: tuple[float | None, ...] = ()
    data_wait_median_s: float | None = _kind(float)
    rows_per_step: tuple[Any, ...] = ()
    start_step: int | None = _kind(int)
    sync_step_times_s: tuple[float | None, ...] = ()
    nosync_step_times_s: tuple[float | None, ...] = ()
    checkpoint_times_s: tuple[float | None, ...] = ()
    memory_accounting: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """Bytes of parameters, gradients and optimizer state as this rank holds them."""
    comm: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """The gradient traffic the framework planned (bucket sizes, bytes per step)."""
    final_params_sha256: str | None = _kind(str)
    peak_rss_bytes: float | None = _kind(float)
    rss_start_bytes: float | None = _kind(float)
    local_losses: tuple[float | None, ...] = ()
    fingerprint: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """This rank's environment (host, threads, affinity, precision switches)."""
    details: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """What the backend reported of its layout (collective bytes, pipeline idle share, notes)."""

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> RankSummary:
        if not isinstance(raw, Mapping):
            raise RecordError(f"{where} is not a JSON object")
        values: dict[str, Any] = _typed_fields(cls, where, raw)
        if values.get("rank") is None:
            raise RecordError(f"{where} has no rank")
        values["step_time"] = StepTimes(**_typed_fields(
            StepTimes, f"{where}.step_time", _table(f"{where}.step_time", raw.get("step_time"))))
        for name in _RANK_SERIES:
            values[name] = _series(f"{where}.{name}", raw.get(name))
        for name in _RANK_TABLES:
            values[name] = _table(f"{where}.{name}", raw.get(name))
        rows = raw.get("rows_per_step")
        values["rows_per_step"] = tuple(rows) if isinstance(rows, list | tuple) else ()
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: _thawed(getattr(self, f.name))
                               for f in dataclasses.fields(self)}
        out["step_time"] = self.step_time.to_dict()
        return out


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """Where the run trained: rank 0's environment, the network its ranks talked over, and
    what else ran on the machine meanwhile."""

    framework: str | None = _kind(str)
    framework_version: str | None = _kind(str)
    gpu: str | None = _kind(str)
    """The accelerator's name, None on CPUs."""
    threads: int | None = _kind(int)
    values: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """The whole fingerprint as written (cpu, python, versions, network, interference...)."""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "fingerprint") -> Fingerprint:
        version = raw.get("framework_version")
        typed = _typed_fields(cls, where, {k: v for k, v in raw.items()
                                           if k != "framework_version"})
        for table in ("network", "interference"):  # read through the properties below
            _table(f"{where}.{table}", raw.get(table))
        return cls(**typed, framework_version=None if version is None else str(version),
                   values=_frozen(raw))

    @property
    def network(self) -> Mapping[str, Any]:
        network: Mapping[str, Any] = self.values.get("network") or _EMPTY
        return network

    @property
    def interference(self) -> Mapping[str, Any]:
        """sextant.measure.interference's summary of the run's window (empty when the ranks
        ran elsewhere, under another launcher)."""
        interference: Mapping[str, Any] = self.values.get("interference") or _EMPTY
        return interference

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _thawed(self.values)
        return out


@dataclass(frozen=True, kw_only=True)
class RunIdentity:
    """A run before it has figures: what ran, when, and where its files are. The runner makes
    one when a run starts and its record from it when the run ends (`record`), whether the
    run finished, failed, diverged or was stopped."""

    strategy: Strategy
    workload: Mapping[str, Any]
    """`Workload.to_dict()` of the workload as it runs."""
    workload_hash: str
    workload_file: str | None
    created_at: str
    group_id: str | None
    run_dir: str | None

    def record(self, *, status: str, metrics: Mapping[str, Any],
               losses: Sequence[float | None] = (), grad_norms: Sequence[float | None] = (),
               ranks: Sequence[Mapping[str, Any]] = (),
               fingerprint: Mapping[str, Any] | None = None) -> RunRecord:
        """The run's record from its figures as the runner computed them, each part checked
        as a stored record's is (numbers finite or None, the ranks' summaries typed)."""
        return RunRecord(
            strategy=self.strategy, created_at=self.created_at, group_id=self.group_id,
            status=status, workload=_table("workload", self.workload),
            workload_hash=self.workload_hash, workload_file=self.workload_file,
            metrics=Metrics.from_dict(metrics), losses=_series("losses", losses),
            grad_norms=_series("grad_norms", grad_norms),
            ranks=tuple(RankSummary.from_dict(r, f"ranks[{i}]") for i, r in enumerate(ranks)),
            fingerprint=Fingerprint.from_dict(fingerprint or {}), run_dir=self.run_dir)


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run: its identity, the workload and strategy it ran, its figures, its loss and
    gradient-norm curves, its ranks and its environment."""

    strategy: Strategy
    id: int | None = None
    """The results store's id (None until stored)."""
    created_at: str = ""
    group_id: str | None = None
    """The compare invocation it belongs to (its trials share it)."""
    status: str = "ok"
    workload: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """The workload as it ran (`Workload.to_dict()`), kept as written: a stored run stays
    readable after the workload file format grows."""
    workload_hash: str = ""
    workload_file: str | None = None
    """The path the user gave (reproduce commands name it)."""
    metrics: Metrics = Metrics()
    losses: tuple[float | None, ...] = ()
    """The job's loss at every step (mean over data-parallel ranks); None where not finite."""
    grad_norms: tuple[float | None, ...] = ()
    ranks: tuple[RankSummary, ...] = ()
    fingerprint: Fingerprint = Fingerprint()
    run_dir: str | None = None

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise RecordError(f"run {self.id}: status {self.status!r}; allowed: "
                              f"{', '.join(RUN_STATUSES)}")

    @property
    def label(self) -> str:
        return self.strategy.label

    @property
    def workload_name(self) -> str:
        return str(self.workload.get("name", "?"))

    def workload_dict(self) -> dict[str, Any]:
        """The workload as a JSON object (a copy: the record's own stays unchanged)."""
        out: dict[str, Any] = _thawed(self.workload)
        return out

    @property
    def finite_losses(self) -> list[float]:
        """The losses with a non-finite step as NaN (for curves and differences)."""
        return [math.nan if x is None else x for x in self.losses]

    @property
    def disturbed(self) -> bool:
        return self.metrics.disturbed

    @property
    def timed(self) -> bool:
        """Finished, undisturbed and with a steady-state step: fit for a verdict."""
        return (self.status == "ok" and not self.metrics.disturbed
                and bool(self.metrics.step_time_median_s))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, name: str | None = None) -> RunRecord:
        """The record from its JSON form; RecordError naming the field when a value is not
        what sextant writes there. `name` starts each message (default 'run <id>')."""
        name = name or f"run {raw.get('id', '?')}:"
        version = raw.get("schema", RECORD_VERSION)
        if not isinstance(version, int) or version > RECORD_VERSION:
            raise RecordError(f"{name} written by a newer sextant (record schema "
                              f"{version!r}, this one reads up to {RECORD_VERSION})")
        strategy = raw.get("strategy")
        if not isinstance(strategy, Mapping):
            raise RecordError(f"{name} its strategy is not a JSON object")
        try:
            parsed = Strategy.from_dict(dict(strategy))
        except (UserError, TypeError, ValueError) as exc:
            raise RecordError(f"{name} its strategy is not valid ({str(exc)[:200]})") from None
        ranks = raw.get("ranks") or []
        if not isinstance(ranks, Sequence) or isinstance(ranks, str):
            raise RecordError(f"{name} its ranks are not a JSON array")
        return cls(
            id=_integer(f"{name} id", raw.get("id")),
            created_at=_text(f"{name} created_at", raw.get("created_at")) or "",
            group_id=_text(f"{name} group_id", raw.get("group_id")),
            status=_text(f"{name} status", raw.get("status")) or "ok",
            workload=_table(f"{name} its workload", raw.get("workload")),
            workload_hash=_text(f"{name} workload_hash", raw.get("workload_hash")) or "",
            workload_file=_text(f"{name} workload_file", raw.get("workload_file")),
            strategy=parsed,
            metrics=Metrics.from_dict(_table(f"{name} its metrics", raw.get("metrics")),
                                      f"{name} metrics"),
            losses=_series(f"{name} losses", raw.get("losses")),
            grad_norms=_series(f"{name} grad_norms", raw.get("grad_norms")),
            ranks=tuple(RankSummary.from_dict(r, f"{name} ranks[{i}]")
                        for i, r in enumerate(ranks)),
            fingerprint=Fingerprint.from_dict(
                _table(f"{name} its fingerprint", raw.get("fingerprint")),
                f"{name} fingerprint"),
            run_dir=_text(f"{name} run_dir", raw.get("run_dir")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`from_dict` reads it back to an equal record). The names of the
        store's columns (workload_name, framework, mode, parallel, workers, precision) and
        the label are repeated at the top level for readers of an export; `from_dict` reads
        them from the workload and the strategy."""
        strategy = self.strategy
        return {
            "schema": RECORD_VERSION, "id": self.id, "created_at": self.created_at,
            "group_id": self.group_id, "status": self.status,
            "workload": _thawed(self.workload), "workload_hash": self.workload_hash,
            "workload_name": self.workload_name, "workload_file": self.workload_file,
            "strategy": strategy.to_dict(), "label": self.label,
            "framework": strategy.framework, "mode": strategy.mode,
            "parallel": strategy.parallel, "workers": strategy.workers,
            "precision": strategy.precision, "metrics": self.metrics.to_dict(),
            "losses": list(self.losses), "grad_norms": list(self.grad_norms),
            "ranks": [r.to_dict() for r in self.ranks],
            "fingerprint": self.fingerprint.to_dict(), "run_dir": self.run_dir,
        }

    def replace(self, **changes: Any) -> RunRecord:
        return dataclasses.replace(self, **changes)

    def with_metrics(self, **figures: Any) -> RunRecord:
        """This record with some of its figures changed (a record is immutable)."""
        return self.replace(metrics=dataclasses.replace(self.metrics, **figures))
