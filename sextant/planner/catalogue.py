"""Hardware catalogue: accelerators, links and prices, read from one data file.

`catalogue.toml` next to this module is the single source of truth; a user file given with
`--catalogue FILE` (or SEXTANT_CATALOGUE) is merged over it table by table, so a user can
change one price or add one accelerator without copying the rest. The "this machine" entries
(`cpu-local`, `loopback`) carry no numbers in the file: `sextant calibrate` measures them and
`with_calibration` fills them in.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Mapping
from typing import Any, TypedDict

import numpy as np

from sextant.core.errors import UserError
from sextant.core.paths import DEFAULT_CALIBRATION
from sextant.planner import efficiency
from sextant.planner.calibration_doc import Calibration, GemmRate, LoopbackAllReduce
from sextant.planner.calibration_doc import from_dict as calibration_from_dict
from sextant.planner.topology import Torus
from sextant.core.tomlfile import read_toml

CATALOGUE_PATH = Path(__file__).with_name("catalogue.toml")
Table = Mapping[str, object]
"""A table of the catalogue file as read: every value is checked before it is used."""
PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp8")

_ACC_KEYS = {
    "name",
    "bf16_tflops",
    "fp16_tflops",
    "tf32_tflops",
    "fp32_tflops",
    "fp8_tflops",
    "memory_gib",
    "memory_bw_gbs",
    "devices_per_node",
    "intra_link",
    "inter_link",
    "host_link",
    "source",
    "verified",
    "measured",
    "ici",
    "architecture",
    "gemm_efficiency",
    "gemm_source",
}
_ICI_KEYS = {"torus", "link_gbs", "hop_latency_us", "wrap_unit", "host_chips", "source"}
_LINK_KEYS = {
    "name",
    "bandwidth_gbs",
    "bus_bandwidth_gbs",
    "latency_us",
    "source",
    "measured",
    "latency_assumed",
    "sweep",
    "sweep_layout",
    "sweep_intra_link",
    "sweep_source",
}


@dataclass(kw_only=True, slots=True, frozen=True)
class Accelerator:
    """One kind of device, with its peak figures (dense, per device)."""

    key: str
    """Catalogue name, e.g. 'h100-sxm'."""
    name: str
    """Human-readable name."""
    peak_flops: dict[str, float]
    """Peak dense FLOP/s by compute precision ('bf16', 'fp16', 'fp32'); absent = unpublished."""
    memory_bytes: float | None
    """Device memory in bytes (vendor GB read as GiB); None until measured for cpu-local."""
    memory_bw: float | None
    """Peak memory bandwidth, bytes/s; None where unpublished (the roofline term is skipped)."""
    devices_per_node: int
    """Devices that share the fast intra-node link (8 for a DGX; a whole pod for TPUs)."""
    intra_link: str | None
    """Default intra-node link key (None: one device per node)."""
    inter_link: str
    """Default inter-node link key (overridden by --network)."""
    host_link: str
    """Link to host memory for CPU offload ('unified' = no copy)."""
    source: str
    """Where the figures come from."""
    verified: bool = True
    """False where figures are not vendor-published (derived or disputed)."""
    measured: bool = False
    """True for entries filled by `sextant calibrate`."""
    shared_node: bool = False
    """True when devices on one node share the same cores (cpu-local): the node's peak is
    divided among the devices used."""
    flops_by_threads: tuple[tuple[int, float], ...] = ()
    """cpu-local only: measured GEMM FLOP/s with 1 thread and with all threads."""
    architecture: str | None = None
    """The chip generation whose published attention-kernel rates apply (the catalogue's
    [attention.NAME] tables: 'ampere', 'hopper'); None: no rate is published for it."""
    attention_rates: dict[str, float] = field(default_factory=dict)
    """Fraction of the 16-bit dense peak each attention kernel sustains forward and backward
    on this chip, FLOPs counted as the FlashAttention papers count them (efficiency.py,
    attention_seconds); filled from [attention.<architecture>]. A kernel without a rate here
    runs as a full-matrix kernel would."""
    gemm_efficiency: float | None = None
    """A published measurement of the fraction of the 16-bit peak large GEMMs reach on this
    chip through its own compiler or library (`gemm_source` says where): the plan's kernel
    efficiency on it, as `sextant calibrate --device gpu` measures one for a GPU. None:
    efficiency.KERNEL_EFFICIENCY."""
    torus: Torus | None = None
    """TPUs: the pod's ICI torus (topology.py); a node is then one slice of it, and the
    slices talk over the data-centre network (`inter_link`). None: devices in nodes that a
    switch joins (GPUs)."""

    @property
    def kernel_efficiency(self) -> float:
        """The kernel efficiency a plan on this chip assumes unless one is measured or asked
        for: its published GEMM rate, else the planner's global constant (read at each call:
        benchmarks/planner_constants.py varies it)."""
        return self.gemm_efficiency or efficiency.KERNEL_EFFICIENCY

    def peak(self, precision: str) -> float:
        if precision not in self.peak_flops:
            have = ", ".join(sorted(self.peak_flops)) or "none"
            raise UserError(
                f"accelerator {self.key!r} has no published {precision} peak; "
                f"precisions with a figure: {have}"
            )
        return self.peak_flops[precision]


@dataclass(kw_only=True, slots=True, frozen=True)
class Link:
    """A link between devices: alpha-beta parameters."""

    key: str
    name: str
    bandwidth: float
    """Bytes/s per device and per direction."""
    latency: float
    """Seconds per ring step (the alpha of the alpha-beta model)."""
    source: str
    measured: bool = False
    latency_assumed: bool = False
    call_latency: float = 0.0
    """Seconds each collective call costs before any byte moves (NCCL's baseLat; 0 for a
    measured link, whose fitted alpha already contains it)."""
    bus_bandwidth: float | None = None
    """Bus bandwidth collectives achieve on this link where it is below the nominal rate
    (bytes/s; from NCCL's tuning model or published nccl-tests results); None: nominal."""
    sweep: tuple[tuple[float, float], ...] = ()
    """A published all-reduce sweep on this link: (buffer bytes, bus bandwidth bytes/s)."""
    sweep_layout: tuple[int, int] = (8, 1)
    """Ranks per node and nodes of that sweep."""
    sweep_intra_link: str | None = None
    """For a network link's multi-node sweep: the intra-node link the sweep's nodes had."""
    sweep_source: str = ""
    ramp: tuple | None = None
    """Bandwidth efficiency versus bytes per rank fitted to the sweep: (log2 bytes per rank,
    e) arrays for comms.ramp_efficiency, filled by load_catalogue; None: no published sweep,
    the plateau at every size."""

    @property
    def achievable_published(self) -> bool:
        """Whether a published measurement gives what collectives reach on this link (an
        nccl-tests bus bandwidth or sweep, or this machine's calibration); False: priced at
        the nominal rate, which collectives do not reach."""
        return self.measured or self.bus_bandwidth is not None or bool(self.sweep)

    @property
    def collective_bandwidth(self) -> float:
        """What collectives reach: the achievable bus bandwidth, else the nominal rate."""
        return min(self.bandwidth, self.bus_bandwidth or self.bandwidth)


@dataclass(kw_only=True, slots=True, frozen=True)
class Catalogue:
    accelerators: dict[str, Accelerator]
    links: dict[str, Link]
    prices: dict[str, float]
    price_date: str
    price_basis: str
    collective_base_latency: float
    """Seconds a collective costs before any byte moves (NCCL baseLat)."""
    path: str
    calibration: Calibration | None = field(default=None)

    def accelerator(self, key: str) -> Accelerator:
        if key not in self.accelerators:
            raise UserError(f"unknown accelerator {key!r}; allowed: {', '.join(self.accelerators)}")
        acc = self.accelerators[key]
        if acc.measured and acc.memory_bytes is None:
            raise UserError(
                f"accelerator {key!r} is measured on this machine: run 'sextant calibrate' "
                "first (or pass --calibration FILE)"
            )
        return acc

    def link(self, key: str) -> Link:
        if key not in self.links:
            raise UserError(f"unknown network/link {key!r}; allowed: {', '.join(self.links)}")
        link = self.links[key]
        if link.measured and not link.bandwidth:
            raise UserError(
                f"link {key!r} is measured on this machine: run 'sextant calibrate' first "
                "(or pass --calibration FILE)"
            )
        return link

    def price(self, key: str) -> float | None:
        return self.prices.get(key)

    def with_calibration(self, calib: Calibration, *, library: str | None = None) -> Catalogue:
        """Fill cpu-local and loopback from a calibration document (see calibrate.py).
        `library` picks that GEMM measurement (e.g. 'torch' for torch runs) when present;
        otherwise the fastest library measured is this machine's peak."""
        accs = dict(self.accelerators)
        links = dict(self.links)
        host = calib.host
        gemm = dict(calib.gemm)
        if library and library in gemm and gemm[library].flops_all_threads:
            gemm = {library: gemm[library]}
        best = _best_gemm(gemm)
        if "cpu-local" in accs and best is not None:
            peak_all, peak_one = best
            cores = int(host.cores or 1)
            accs["cpu-local"] = replace(
                accs["cpu-local"],
                peak_flops={"fp32": peak_all, "bf16": peak_all, "fp16": peak_all},
                memory_bytes=float(host.memory_bytes or 0) or None,
                memory_bw=calib.memory_bw_bytes_per_s,
                shared_node=True,
                devices_per_node=max(cores, 1024),
                flops_by_threads=((1, peak_one), (cores, peak_all)),
            )
        fit = calib.allreduce
        if "loopback" in links and fit and fit.beta_s_per_byte:
            # A 2-rank ring all-reduce costs 2(n-1)=2 latency steps and 2(n-1)/n=1 times the
            # bytes over the link: t = 2*latency + bytes/bandwidth (see comms.py).
            links["loopback"] = replace(
                links["loopback"],
                bandwidth=1.0 / fit.beta_s_per_byte,
                latency=max(fit.alpha_s, 0.0) / 2.0,
            )
        return replace(self, accelerators=accs, links=links, calibration=calib)

    def with_loopback_fit(self, alpha_s: float, beta_s_per_byte: float) -> Catalogue:
        """This calibrated catalogue with the loopback all-reduce fit replaced (a link of
        another rate, as the report's what-if lines draw it)."""
        if self.calibration is None:
            raise UserError("the catalogue is not calibrated: run 'sextant calibrate' first")
        fit = LoopbackAllReduce(alpha_s=alpha_s, beta_s_per_byte=beta_s_per_byte)
        return self.with_calibration(replace(self.calibration, allreduce=fit))


def _best_gemm(gemm: Mapping[str, GemmRate]) -> tuple[float, float] | None:
    """(all-thread, one-thread) FLOP/s of the faster measured GEMM library."""
    best: tuple[float, float] | None = None
    for entry in gemm.values():
        if not entry.flops_all_threads:
            continue
        pair = (float(entry.flops_all_threads), float(entry.flops_1_thread or 0))
        if best is None or pair[0] > best[0]:
            best = pair
    if best is not None and best[1] <= 0:
        best = (best[0], best[0])
    return best


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    return read_toml(path, "catalogue")  # sextant.core.tomlfile: one-line errors for any bad file


def load_catalogue(
    override: str | Path | None = None, calibration: str | Path | None = None
) -> Catalogue:
    """The bundled catalogue, merged with a user file, filled with a calibration if present."""
    raw = _read_toml(CATALOGUE_PATH)
    path = str(CATALOGUE_PATH)
    override = override or os.environ.get("SEXTANT_CATALOGUE")
    if override:
        user = _read_toml(Path(override))
        if user.get("schema", raw.get("schema")) != raw.get("schema"):
            raise UserError(f"catalogue {override}: schema must be {raw.get('schema')} (this "
                            f"sextant's). Received: {str(user.get('schema'))[:20]!r}")
        raw = _merge(raw, user)
        path = f"{CATALOGUE_PATH} + {override}"
    rates = _attention_rates(raw.get("attention", {}))
    accs = {
        k: _with_attention(_accelerator(k, v), rates)
        for k, v in raw.get("accelerators", {}).items()
    }
    defaults = raw.get("defaults", {})
    base = float(defaults.get("collective_base_latency_us", 0.0)) * 1e-6
    links = {k: _link(k, v, base) for k, v in raw.get("links", {}).items()}
    links = {k: _with_ramp(link, links) for k, link in links.items()}
    prices_raw = dict(raw.get("prices", {}))
    date = str(prices_raw.pop("date", "unknown"))
    basis = str(prices_raw.pop("basis", ""))
    prices = {}
    for key, value in prices_raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"prices.{key} must be a number >= 0. Received: {value!r}")
        prices[key] = float(value)
    cat = Catalogue(
        accelerators=accs,
        links=links,
        prices=prices,
        price_date=date,
        price_basis=basis,
        collective_base_latency=base,
        path=path,
    )
    calib_path = Path(calibration) if calibration else DEFAULT_CALIBRATION
    if calib_path.is_file():
        cat = cat.with_calibration(read_calibration(calib_path))
    elif calibration:
        raise UserError(f"calibration file not found: {calib_path}; run 'sextant calibrate'")
    return cat


def read_calibration(path: str | Path) -> Calibration:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read calibration {path}: {exc}") from None
    return calibration_from_dict(data, str(path))


def _number(where: str, raw: Table, key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    try:
        number = (float(value) if isinstance(value, (int, float, str))
                  and not isinstance(value, bool) else math.nan)
    except (ValueError, OverflowError):
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= MAX_FIGURE):
        raise UserError(f"{where}.{key} must be a finite number in (0, {MAX_FIGURE:g}]. "
                        f"Received: {str(value)[:40]!r}")
    return number


MAX_FIGURE = 1e9
"""Above any catalogue figure in its unit (TFLOP/s, GiB, GB/s, us)."""
MAX_DEVICES_PER_NODE = 1 << 16
"""A node, or a pod with one interconnect (TPU v5p: 8,960 chips), as the catalogue counts it."""


def _count(where: str, raw: Table, key: str, default: int) -> int:
    value = raw.get(key, default)
    if type(value) is not int or not 1 <= value <= MAX_DEVICES_PER_NODE:
        raise UserError(f"{where}.{key} must be an integer from 1 to {MAX_DEVICES_PER_NODE}. "
                        f"Received: {str(value)[:40]!r}")
    return value


def _accelerator(key: str, raw: Table) -> Accelerator:
    where = f"accelerators.{key}"
    unknown = sorted(set(raw) - _ACC_KEYS)
    if unknown:
        raise UserError(
            f"unknown key {where}.{unknown[0]}; allowed: {', '.join(sorted(_ACC_KEYS))}"
        )
    if not raw.get("source"):
        raise UserError(f"{where} must cite a source")
    peaks = {}
    for prec in PRECISIONS:
        value = _number(where, raw, f"{prec}_tflops")
        if value is not None:
            peaks[prec] = value * 1e12
    mem = _number(where, raw, "memory_gib")
    bw = _number(where, raw, "memory_bw_gbs")
    measured = bool(raw.get("measured", False))
    if not measured and (not peaks or mem is None):
        raise UserError(f"{where} needs at least one *_tflops figure and memory_gib")
    return Accelerator(
        key=key,
        name=str(raw.get("name", key)),
        peak_flops=peaks,
        memory_bytes=None if mem is None else mem * 2**30,
        memory_bw=None if bw is None else bw * 1e9,
        devices_per_node=_count(where, raw, "devices_per_node", 8),
        intra_link=_text(raw, "intra_link"),
        inter_link=str(raw.get("inter_link", "ib-ndr")),
        host_link=str(raw.get("host_link", "pcie4")),
        source=str(raw["source"]),
        verified=bool(raw.get("verified", True)),
        measured=measured,
        torus=_torus(where, raw.get("ici")),
        architecture=_text(raw, "architecture"),
        gemm_efficiency=_gemm_efficiency(where, raw),
    )


def _text(raw: Table, key: str) -> str | None:
    """raw[key] as text, None when absent or empty."""
    value = raw.get(key)
    return str(value) if value else None


def _fraction(where: str, raw: Table, key: str) -> float | None:
    """raw[key] as a fraction of peak in (0, 1], or None when absent."""
    value = _number(where, raw, key)
    if value is not None and not 0.0 < value <= 1.0:
        raise UserError(f"{where}.{key} must be a fraction of peak in (0, 1]. "
                        f"Received: {value!r}")
    return value


def _gemm_efficiency(where: str, raw: Table) -> float | None:
    value = _fraction(where, raw, "gemm_efficiency")
    if value is None:
        return None
    if not raw.get("gemm_source"):
        raise UserError(f"{where}.gemm_efficiency must cite a gemm_source")
    return value


ATTENTION_KERNELS = ("flash2", "flash3", "triton-2023")
"""The attention kernels a catalogue may give rates for (efficiency.py names what each is)."""


def _attention_rates(raw: Table) -> dict[str, dict[str, float]]:
    """The [attention.ARCH] tables: per chip generation, each kernel's fraction of the 16-bit
    peak (0, 1], with the source the rates were read from."""
    tables: dict[str, dict[str, float]] = {}
    for arch, table in raw.items():
        where = f"attention.{arch}"
        if not isinstance(table, dict):
            raise UserError(f"{where} must be a table. Received: {str(table)[:40]!r}")
        if not table.get("source"):
            raise UserError(f"{where} must cite a source")
        unknown = sorted(set(table) - set(ATTENTION_KERNELS) - {"source"})
        if unknown:
            raise UserError(f"unknown key {where}.{unknown[0]}; allowed: "
                            f"{', '.join(ATTENTION_KERNELS)}, source")
        rates = {k: _fraction(where, table, k) for k in ATTENTION_KERNELS}
        tables[arch] = {k: v for k, v in rates.items() if v is not None}
    return tables


def _with_attention(acc: Accelerator, tables: dict[str, dict[str, float]]) -> Accelerator:
    if acc.architecture is None:
        return acc
    if acc.architecture not in tables:
        raise UserError(f"accelerators.{acc.key}.architecture {acc.architecture!r} has no "
                        f"[attention.{acc.architecture}] table; tables: {', '.join(tables)}")
    return replace(acc, attention_rates=dict(tables[acc.architecture]))


def _torus(where: str, raw: Any) -> Torus | None:
    """The `ici` table of a TPU: its pod's torus shape, the one-way bandwidth of one link,
    the latency of one hop, the axis length that has a wraparound link and the chips per
    host."""
    if raw is None:
        return None
    where = f"{where}.ici"
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a table. Received: {str(raw)[:40]!r}")
    unknown = sorted(set(raw) - _ICI_KEYS)
    if unknown:
        raise UserError(f"unknown key {where}.{unknown[0]}; allowed: {', '.join(sorted(_ICI_KEYS))}")
    if not raw.get("source"):
        raise UserError(f"{where} must cite a source")
    shape = raw.get("torus")
    if not (
        isinstance(shape, list)
        and len(shape) in (2, 3)
        and all(type(v) is int and 1 <= v <= 1024 for v in shape)
    ):
        raise UserError(f"{where}.torus must be 2 or 3 integers from 1 to 1024 (the pod's "
                        f"shape). Received: {str(shape)[:40]!r}")
    bw = _number(where, raw, "link_gbs")
    lat = _number(where, raw, "hop_latency_us")
    if bw is None or lat is None:
        raise UserError(f"{where} needs link_gbs and hop_latency_us")
    return Torus(
        pod=tuple(shape),
        link_bandwidth=bw * 1e9,
        hop_latency=lat * 1e-6,
        wrap_unit=_count(where, raw, "wrap_unit", 4),
        host_chips=_count(where, raw, "host_chips", 4),
        source=str(raw["source"]),
    )


def _link(key: str, raw: Table, base_latency: float) -> Link:
    where = f"links.{key}"
    unknown = sorted(set(raw) - _LINK_KEYS)
    if unknown:
        raise UserError(
            f"unknown key {where}.{unknown[0]}; allowed: {', '.join(sorted(_LINK_KEYS))}"
        )
    if not raw.get("source"):
        raise UserError(f"{where} must cite a source")
    measured = bool(raw.get("measured", False))
    bw = _number(where, raw, "bandwidth_gbs")
    bus = _number(where, raw, "bus_bandwidth_gbs")
    lat = raw.get("latency_us", 0.0)
    if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not 0 <= lat <= MAX_FIGURE:
        raise UserError(f"{where}.latency_us must be a number in [0, {MAX_FIGURE:g}]. "
                        f"Received: {str(lat)[:40]!r}")
    if not measured and bw is None:
        raise UserError(f"{where} needs bandwidth_gbs")
    return Link(
        key=key,
        name=str(raw.get("name", key)),
        bandwidth=0.0 if bw is None else bw * 1e9,
        latency=float(lat) * 1e-6,
        source=str(raw["source"]),
        measured=measured,
        latency_assumed=bool(raw.get("latency_assumed", False)),
        call_latency=0.0 if measured else base_latency,
        bus_bandwidth=None if bus is None else bus * 1e9,
        **_sweep(where, raw),
    )


class _Sweep(TypedDict, total=False):
    """A link's published sweep, as Link's fields."""

    sweep: tuple[tuple[float, float], ...]
    sweep_layout: tuple[int, int]
    sweep_intra_link: str | None
    sweep_source: str


def _sweep(where: str, raw: Table) -> _Sweep:
    points = raw.get("sweep")
    if points is None:
        return {}
    ok = (
        isinstance(points, list)
        and len(points) >= 2
        and all(
            isinstance(pt, list)
            and len(pt) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in pt)
            for pt in points
        )
        and all(a[0] < b[0] for a, b in zip(points, points[1:]))
    )
    if not ok or not isinstance(points, list):
        raise UserError(
            f"{where}.sweep must be a list of [bytes, bus GB/s] pairs > 0, sizes increasing"
        )
    if not raw.get("sweep_source"):
        raise UserError(f"{where}.sweep must cite a source (sweep_source)")
    layout = raw.get("sweep_layout", [8, 1])
    if not (
        isinstance(layout, list)
        and len(layout) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in layout)
        and layout[0] * layout[1] >= 2
    ) or not isinstance(layout, list):
        raise UserError(f"{where}.sweep_layout must be [ranks per node, nodes], 2+ ranks")
    if layout[1] > 1 and not raw.get("sweep_intra_link"):
        raise UserError(f"{where}.sweep over several nodes needs sweep_intra_link")
    return {
        "sweep": tuple((float(m), float(bw) * 1e9) for m, bw in points),
        "sweep_layout": (int(layout[0]), int(layout[1])),
        "sweep_intra_link": _text(raw, "sweep_intra_link"),
        "sweep_source": str(raw["sweep_source"]),
    }


def _with_ramp(link: Link, links: dict[str, Link]) -> Link:
    """The link with its ramp fitted to its published sweep (fit_ramp), if it has one."""
    if not link.sweep:
        return link
    intra = link
    if link.sweep_layout[1] > 1:
        key = link.sweep_intra_link
        if key not in links:
            raise UserError(f"links.{link.key}.sweep_intra_link: unknown link {key!r}")
        intra = links[key]
    return replace(link, ramp=fit_ramp(link, intra))


def fit_ramp(link: Link, intra: Link) -> tuple:
    """Bandwidth efficiency per sweep point: the e in (0, 1] at which the planner's own
    all-reduce (comms.hier_all_reduce: NCCL's ring and tree latencies, the call latency, the
    plateau bus bandwidth x e) takes the measured time, 2 (n-1)/n x size / busbw, at the
    sweep's layout. A point measured faster than the model at the plateau gets e = 1 (the
    ramp never lifts a link above its catalogue plateau). Solved by bisection on log e,
    vectorised over the points. Returns (log2 bytes per rank, e) for np.interp."""
    from sextant.planner import comms  # comms has no catalogue dependency

    g, nodes = link.sweep_layout
    n = g * nodes
    size = np.array([m for m, _ in link.sweep])
    busbw = np.array([bw for _, bw in link.sweep])
    measured = comms.bus_factor("all_reduce", n) * size / busbw
    in_bw, in_lat, in_call = intra.collective_bandwidth, intra.latency, intra.call_latency
    out_bw = link.collective_bandwidth

    def model(e):
        return comms.hier_all_reduce(
            size, g, nodes, (in_bw * e, in_lat, in_call), (out_bw * e, link.latency, link.call_latency)
        )

    lo, hi = np.full(size.shape, np.log(1e-6)), np.zeros(size.shape)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        slow = model(np.exp(mid)) > measured  # too slow at e: the answer is above
        lo, hi = np.where(slow, mid, lo), np.where(slow, hi, mid)
    eff = np.exp(hi)
    return (np.log2(size / n), eff)
