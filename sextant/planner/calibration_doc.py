"""The calibration document (`sextant calibrate`, calibration.json) as typed records.

The JSON file is read into a Calibration once, at its boundary (`from_dict`), and written
from one (`to_dict`); everything between reads named fields. Keys a measurement records
beyond the fields the planner reads (the all-reduce's process placement, a GEMM's median)
travel in each record's `extra`, so that a file read and written again keeps them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from sextant.core.errors import UserError

SCHEMA = 1

T = TypeVar("T")


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    # A whole number stays one, so a calibration file reads back and writes out unchanged.
    return value if isinstance(value, int) else float(value)


def _numbers(value: object) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list of numbers, got {value!r}")
    return tuple(_number(v) for v in value)


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return tuple(str(v) for v in value)


def _build(cls: type[T], raw: object, convert: Mapping[str, Callable[[object], object]],
           where: str) -> T:
    """`cls` from a JSON object: each known key through its converter (a plain value
    otherwise), the other keys into `extra` when `cls` keeps them."""
    if not isinstance(raw, Mapping):
        raise UserError(f"{where} must be an object. Received: {str(raw)[:60]!r}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, object] = {}
    extra: dict[str, object] = {}
    for key, value in raw.items():
        if key in names and key != "extra":
            try:
                values[key] = convert[key](value) if key in convert else value
            except (TypeError, ValueError) as exc:
                raise UserError(f"{where}.{key}: {exc}") from None
        else:
            extra[key] = value
    if "extra" in names:
        values["extra"] = extra
    return cls(**values)


def _plain(obj: object) -> object:
    """A record as JSON values: its fields, then its `extra` keys."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, object] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "extra":
                out.update(value)
            elif f.name != "path":
                out[f.name] = _plain(value)
        return out
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [_plain(v) for v in obj]
    return obj


@dataclass(kw_only=True, slots=True, frozen=True)
class Host:
    """The host calibrate ran on."""

    cpu: str = ""
    cores: int = 1
    memory_bytes: float = 0.0
    python: str = ""
    platform: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True, frozen=True)
class GemmRate:
    """One library's n x n float32 product, on one thread and on all of them."""

    n: int = 0
    dtype: str = "float32"
    version: str = ""
    flops_1_thread: float = 0.0
    flops_all_threads: float = 0.0
    threads: int = 1
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True, frozen=True)
class LoopbackAllReduce:
    """All-reduce medians between gloo processes on loopback and their alpha-beta fit."""

    sizes_bytes: tuple[float, ...] = ()
    times_s: tuple[float, ...] = ()
    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0
    bandwidth_bytes_per_s: float = 0.0
    median_rel_residual: float = 0.0
    max_rel_residual: float = 0.0
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True, frozen=True)
class DeviceGemm:
    """One GEMM shape of a workload's step timed on the device (M x K by K x N)."""

    m: int
    k: int
    n: int
    count: int = 1
    """Times it runs per step."""
    seconds_best: float = 0.0
    flops: float = 0.0
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True, frozen=True)
class DeviceAllReduce:
    """All-reduce medians and bus bandwidths between the devices of this host."""

    world: int = 2
    backend: str = ""
    sizes_bytes: tuple[float, ...] = ()
    times_s: tuple[float, ...] = ()
    busbw_bytes_per_s: tuple[float, ...] = ()
    plateau_busbw_bytes_per_s: float = 0.0
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True, frozen=True)
class DeviceSection:
    """`sextant calibrate --device gpu`: a workload's GEMMs timed on this host's
    accelerator, their kernel efficiency, and the bus bandwidth between its devices."""

    device: str = "gpu"
    accelerator: str | None = None
    """The catalogue key it was measured on (None: not in the catalogue)."""
    device_name: str = ""
    device_count: int = 1
    torch: str = ""
    dtype: str = ""
    workload: str = ""
    tokens: int = 0
    tp: int = 1
    peak_flops: float = 0.0
    gemms: tuple[DeviceGemm, ...] = ()
    kernel_efficiency: float = 0.0
    allreduce: DeviceAllReduce | None = None
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True, frozen=True)
class Calibration:
    """This machine, measured (`sextant calibrate`)."""

    schema: int = SCHEMA
    created: str = ""
    host: Host = field(default_factory=Host)
    gemm: Mapping[str, GemmRate] = field(default_factory=dict)
    """Per library ('numpy', 'torch')."""
    memory_bw_bytes_per_s: float | None = None
    allreduce: LoopbackAllReduce | None = None
    device: DeviceSection | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    path: str = ""
    """Where it was read from or written to (not part of the file)."""
    extra: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The JSON document (`path` left out)."""
        out = _plain(self)
        assert isinstance(out, dict)
        return out


def _gemms(value: object) -> tuple[DeviceGemm, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list of GEMMs, got {str(value)[:60]!r}")
    return tuple(_build(DeviceGemm, g, {"flops": _number, "seconds_best": _number},
                        "calibration.device.gemms[]") for g in value)


def _device_allreduce(value: object) -> DeviceAllReduce | None:
    if value is None:
        return None
    return _build(DeviceAllReduce, value, {
        "sizes_bytes": _numbers, "times_s": _numbers, "busbw_bytes_per_s": _numbers,
        "plateau_busbw_bytes_per_s": _number}, "calibration.device.allreduce")


def device_from_dict(raw: object) -> DeviceSection:
    return _build(DeviceSection, raw, {
        "accelerator": _optional_str, "gemms": _gemms, "allreduce": _device_allreduce,
        "notes": _strings, "kernel_efficiency": _number, "peak_flops": _number,
    }, "calibration.device")


def _loopback(value: object) -> LoopbackAllReduce | None:
    if value is None:
        return None
    return _build(LoopbackAllReduce, value, {"sizes_bytes": _numbers, "times_s": _numbers,
                                             "alpha_s": _number, "beta_s_per_byte": _number},
                  "calibration.allreduce")


def _gemm_rates(value: object) -> dict[str, GemmRate]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object of libraries, got {str(value)[:60]!r}")
    return {str(lib): _build(GemmRate, entry, {"flops_1_thread": _number,
                                               "flops_all_threads": _number},
                             f"calibration.gemm.{lib}")
            for lib, entry in value.items() if entry}


def from_dict(raw: object, path: str = "") -> Calibration:
    """A calibration document read from JSON; one-line errors for a malformed one."""
    if not isinstance(raw, Mapping) or raw.get("schema") != SCHEMA:
        raise UserError(f"{path or 'calibration'} is not a sextant calibration file "
                        f"(schema {SCHEMA})")
    doc = _build(Calibration, raw, {
        "host": lambda v: _build(Host, v or {}, {"memory_bytes": _number},
                                 "calibration.host"),
        "gemm": _gemm_rates,
        "memory_bw_bytes_per_s": lambda v: None if v is None else _number(v),
        "allreduce": _loopback,
        "device": lambda v: None if v is None else device_from_dict(v),
        "notes": _strings,
    }, "calibration")
    return dataclasses.replace(doc, path=path)
