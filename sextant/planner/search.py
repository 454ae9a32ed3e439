"""Enumerate every valid layout for N devices, evaluate them all at once, rank by throughput.

A layout is (dp, tp, pp, interleave, ZeRO stage, micro-batch, recomputation, sequence
parallelism, offload) with dp * tp * pp = N. The enumeration is a cartesian product built
with numpy and filtered by validity masks, then `estimate.evaluate` computes every figure for
the whole table in one pass: no Python loop runs per layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sextant.core.errors import UserError
from sextant.planner.estimate import (
    KNOBS,
    OFFLOAD,
    RECOMPUTE,
    Hardware,
    Layout,
    PlanOptions,
    evaluate,
    head_flops_per_token,
    kernel_seconds,
    per_device_peak,
    rank,
)
from sextant.planner.evaluation import Evaluation, Ranking
from sextant.planner.layout import ZERO_STAGES
from sextant.planner.models import ModelCost
from sextant.planner.profiles import StackProfile

MAX_MICRO_BATCH = 64
INTERLEAVE = (1, 2, 4)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_layouts(
    cost: ModelCost,
    devices: int,
    global_batch: int,
    *,
    max_micro_batch: int = MAX_MICRO_BATCH,
    fixed: dict[str, int] | None = None,
    offload: bool = True,
    devices_per_node: int = 8,
    torus: bool = False,
    stack: StackProfile | None = None,
) -> dict[str, np.ndarray]:
    """Every valid layout for `devices` devices as a table (one int array per knob).

    `fixed` pins knobs (e.g. {"tp": 8}) to one value; `offload` False leaves CPU offload out
    (devices whose memory is the host's, such as cpu-local or Apple silicon). `torus`: the
    devices are TPU slices of `devices_per_node` chips joined by the data-centre network;
    tensor, context and expert parallelism then stay inside a slice, only data parallelism
    crosses slices, and no pipeline is searched (MaxText's ici_* and dcn_* mesh axes).
    `stack`: only the ZeRO stages, offloads and recomputations the stack offers (a pinned
    one it does not offer is refused); None: every one.
    """
    if devices < 1:
        raise UserError(f"device count must be >= 1. Received: {devices}")
    fixed = fixed or {}
    if stack is not None:
        check_pins(stack, fixed)
    rows = _degrees(cost, devices, global_batch, fixed, max_micro_batch)
    if not rows:
        return {k: np.zeros(0, dtype=np.int64) for k in KNOBS}
    base = np.array(rows, dtype=np.int64)
    opt = _options_grid(fixed)
    nb, no = len(base), len(opt)
    b = np.repeat(base, no, axis=0)
    o = np.tile(opt, (nb, 1))
    lay = {
        "dp": b[:, 0],
        "tp": b[:, 1],
        "pp": b[:, 2],
        "mbs": b[:, 3],
        "cp": b[:, 4],
        "ep": b[:, 5],
        "zero": o[:, 0],
        "rc": o[:, 1],
        "sp": o[:, 2],
        "off": o[:, 3],
        "v": o[:, 4],
    }
    ok = _valid(cost, lay, global_batch, fixed, offload)
    if stack is not None:
        ok &= _stack_runs(stack, lay)
    if torus:
        ok &= _inside_slice(lay, fixed, devices_per_node)
    return _with_hybrid({k: v[ok] for k, v in lay.items()}, fixed, devices_per_node)


def _capabilities(stack: StackProfile) -> tuple[tuple[str, str, tuple[int, ...], tuple], ...]:
    """(knob, name, codes the stack runs, names of every code) per capability."""
    return (
        ("zero", "ZeRO stage", tuple(stack.zero_stages), ZERO_STAGES),
        ("off", "offload", tuple(OFFLOAD.index(o) for o in stack.offloads), OFFLOAD),
        ("rc", "recomputation", tuple(RECOMPUTE.index(r) for r in stack.recomputes), RECOMPUTE),
    )


def check_pins(stack: StackProfile, fixed: dict[str, int]) -> None:
    """Refuse, in one line, a pinned ZeRO stage, offload or recomputation the stack lacks."""
    for knob, name, codes, names in _capabilities(stack):
        if knob in fixed and int(fixed[knob]) not in codes:
            runs = ", ".join(str(names[c]) for c in codes)
            raise UserError(f"stack {stack.name} has no {name} {names[int(fixed[knob])]}: it "
                            f"runs {runs} (its profile's runs_source says where); choose "
                            f"another --stack or {name}")


def _stack_runs(stack: StackProfile, lay: dict[str, np.ndarray]) -> np.ndarray:
    """Which rows use only ZeRO stages, offloads and recomputations the stack offers."""
    ok = np.ones(len(lay["dp"]), dtype=bool)
    for knob, _, codes, _ in _capabilities(stack):
        ok &= np.isin(lay[knob], codes)
    return ok


def _degrees(
    cost: ModelCost, devices: int, global_batch: int, fixed: dict[str, int],
    max_micro_batch: int,
) -> list[tuple[int, ...]]:
    """(dp, tp, pp, mbs, cp, ep) of every product of degrees that covers the devices and
    divides the global batch."""
    mp = cost.supports_model_parallel
    tps = [t for t in divisors(devices) if cost.n_heads % t == 0] if mp else [1]
    if "tp" in fixed:
        tps = [t for t in tps if t == fixed["tp"]]
    s = cost.tokens_per_sample
    rows: list[tuple[int, ...]] = []
    for tp in tps:
        # Context parallelism is searched for long sequences (>= 16K tokens) or when pinned.
        cps = [1]
        if mp and ("cp" in fixed or s >= 16384):
            cps = [c for c in divisors(devices // tp) if s % (2 * c) == 0 and c <= 32]
        for cp in cps:
            pps = [p for p in divisors(devices // (tp * cp)) if p <= cost.n_layers] if mp else [1]
            for pp in pps:
                rows.extend(_data_rows(cost, devices // (tp * pp * cp), tp, pp, cp,
                                       global_batch, max_micro_batch))
    return rows


def _data_rows(
    cost: ModelCost, dp: int, tp: int, pp: int, cp: int, global_batch: int,
    max_micro_batch: int,
) -> list[tuple[int, ...]]:
    """The micro-batch and expert-parallel choices of one (dp, tp, pp, cp)."""
    if dp > global_batch or global_batch % dp:
        return []
    eps = [e for e in divisors(dp * cp) if cost.n_experts % e == 0] if cost.n_experts else [1]
    mbss = [m for m in divisors(global_batch // dp) if m <= max_micro_batch]
    return [(dp, tp, pp, mbs, cp, e) for mbs in mbss for e in eps]


def _options_grid(fixed: dict[str, int]) -> np.ndarray:
    """zero x recompute x sp x offload x interleave, one row per combination. The search
    tries every recomputation mode: none, selective, full, and the two between none and
    full that real stacks offer (operator-level, torchtitan's default "selective op"; every
    second layer, torchtitan's "selective layer" and Megatron-Core's block method). With only
    none and full, a layout whose activations almost fit paid a third more compute. It tries
    v in INTERLEAVE; a pinned v is tried whatever it is (Megatron-Core recipes pin e.g. 5
    virtual stages)."""
    rcs = [int(fixed["rc"])] if "rc" in fixed else [0, 1, 2, 3, 4]
    vs = [int(fixed["v"])] if "v" in fixed else list(INTERLEAVE)
    grid = np.meshgrid(list(ZERO_STAGES), rcs, [0, 1], [0, 1, 2], vs, indexing="ij")
    return np.array(grid).reshape(5, -1).T


def _valid(
    cost: ModelCost, lay: dict[str, np.ndarray], global_batch: int, fixed: dict[str, int],
    offload: bool,
) -> np.ndarray:
    """Which rows of the product are layouts a stack can run (and differ from another)."""
    m = global_batch // (lay["dp"] * lay["mbs"])
    ok = (lay["dp"] * lay["cp"] > 1) | (lay["zero"] == 0)  # ZeRO over one rank: no change
    ok &= (lay["tp"] > 1) | (lay["sp"] == 0)
    ok &= (lay["off"] < 2) | (lay["zero"] == 3)
    if not offload:
        ok &= lay["off"] == 0
    ok &= (lay["v"] == 1) | (
        (lay["pp"] > 1) & (m % lay["pp"] == 0) & (lay["pp"] * lay["v"] <= cost.n_layers)
    )
    if cost.act_scores == 0 and "rc" not in fixed:
        # With FlashAttention selective recomputation saves nothing: searched, it only ties.
        ok &= lay["rc"] != 1
    for key, value in fixed.items():
        if key != "hs":
            ok &= lay[key] == value
    return ok


def _inside_slice(lay: dict[str, np.ndarray], fixed: dict[str, int], chips: int) -> np.ndarray:
    """TPU slices: the model-parallel groups (tp x cp, and the expert group beside them) fit
    in one slice, so that only data parallelism crosses the data-centre network; no
    pipeline unless one is pinned."""
    model = lay["tp"] * lay["cp"]
    ok = (chips % model == 0) & (model * lay["ep"] <= chips)
    if "pp" not in fixed:
        ok &= lay["pp"] == 1
    return ok


def _with_hybrid(
    lay: dict[str, np.ndarray], fixed: dict[str, int], g: int
) -> dict[str, np.ndarray]:
    """Hybrid sharding, added only where it differs from full sharding: a ZeRO stage and a
    data-parallel group with ranks both inside the node and across nodes."""
    dpc = lay["dp"] * lay["cp"]
    dp_in = np.where(lay["tp"] < g, np.minimum(np.maximum(g // lay["tp"], 1), dpc), 1)
    hybrid = (lay["zero"] >= 1) & (dp_in > 1) & (dpc > dp_in)
    pin = fixed.get("hs")
    none = {k: v[:0] for k, v in lay.items()}
    plain = lay if pin != 1 else none
    extra = {k: v[hybrid] for k, v in lay.items()} if pin != 0 else none
    out = {k: np.concatenate([plain[k], extra[k]]) for k in lay}
    out["hs"] = np.concatenate(
        [np.zeros(len(plain["dp"]), dtype=np.int64), np.ones(len(extra["dp"]), dtype=np.int64)]
    )
    return out


def _node(hw: Hardware, devices: int) -> int:
    """Devices per node for a job of `devices` devices (a TPU's slice: Hardware.node_size)."""
    return int(hw.node_size(devices))


@dataclass(kw_only=True, slots=True)
class SearchResult:
    devices: int
    layouts: dict[str, np.ndarray]
    figures: Ranking
    """The ranking figures of every layout; `row` has all figures of one."""
    order: np.ndarray
    """Indices of the fitting layouts, fastest first."""
    cost: ModelCost
    hw: Hardware
    opts: PlanOptions

    @property
    def count(self) -> int:
        return len(self.layouts["dp"])

    @property
    def fitting(self) -> int:
        return int(self.figures.fits.sum()) if self.count else 0

    def best(self) -> int | None:
        return int(self.order[0]) if len(self.order) else None

    def layout(self, i: int) -> Layout:
        return Layout.from_row(self.layouts, i)

    def row(self, i: int) -> Evaluation:
        """Every figure of layout i."""
        return evaluate(
            self.cost, self.hw, self.opts, {k: v[i : i + 1] for k, v in self.layouts.items()}
        ).row(0)


def search(
    cost: ModelCost,
    hw: Hardware,
    opts: PlanOptions,
    devices: int,
    *,
    fixed: dict[str, int] | None = None,
    max_micro_batch: int = MAX_MICRO_BATCH,
) -> SearchResult:
    lay = enumerate_layouts(
        cost,
        devices,
        opts.global_batch,
        fixed=fixed,
        max_micro_batch=max_micro_batch,
        offload=hw.host is not None,
        devices_per_node=_node(hw, devices),
        torus=hw.torus is not None,
        stack=opts.stack,
    )
    if len(lay["dp"]) == 0:
        empty = Ranking(fits=np.zeros(0, bool), memory=np.zeros(0), tokens_per_s=np.zeros(0))
        return SearchResult(
            devices=devices,
            layouts=lay,
            figures=empty,
            order=np.zeros(0, dtype=np.int64),
            cost=cost,
            hw=hw,
            opts=opts,
        )
    res = rank(cost, hw, opts, lay)
    idx = np.flatnonzero(res.fits)
    # Fastest first; among equals, the one using less memory.
    order = idx[np.lexsort((res.memory[idx], -res.tokens_per_s[idx]))]
    return SearchResult(
        devices=devices, layouts=lay, figures=res, order=order, cost=cost, hw=hw, opts=opts
    )


@dataclass(kw_only=True, slots=True)
class ScalePoint:
    devices: int
    layout: Layout | None
    tokens_per_s: float
    mfu: float
    speedup: float
    """Throughput relative to the smallest device count that fits."""
    efficiency: float
    """Share of the ideal: tokens/s over what n devices would reach doing nothing but the
    model's FLOPs at the assumed compute efficiency (= MFU / compute efficiency; with FP8
    the layers' GEMMs at the fp8 peak, the attention core and the output projection at the
    16-bit one, as the step prices them): what communication, bubbles, memory traffic,
    recomputation and offload cost."""
    cause: str
    cause_share: float
    shortfall: str = ""
    """What costs most of the efficiency this point lacks: the largest overhead (`cause`),
    the compute's own memory-bound kernels, or recomputation."""


def scaling_curve(
    cost: ModelCost,
    hw: Hardware,
    opts: PlanOptions,
    max_devices: int,
    *,
    fixed: dict[str, int] | None = None,
    known: SearchResult | None = None,
) -> list[ScalePoint]:
    """Best layout at 1, 2, 4, ... devices up to max_devices (strong scaling: the global batch
    stays fixed). Speed-up and efficiency are relative to the smallest count that fits.
    `known`: a search already done at max_devices with the same pins (reused)."""
    counts = []
    n = 1
    while n < max_devices:
        counts.append(n)
        n *= 2
    counts.append(max_devices)
    pinned = {k: v for k, v in (fixed or {}).items() if k not in ("dp", "pp", "tp", "cp")}
    # Every device count's layouts go into one table and one `evaluate` call (each row's
    # figures depend on its own knobs only, devices = dp x tp x pp x cp included): one pass
    # instead of one per count, the same figures. Each count's best is then chosen as
    # `search` chooses it (fastest fitting, then least memory, then first).
    tables = [
        None
        if known is not None and n == known.devices
        else enumerate_layouts(
            cost, n, opts.global_batch, fixed=pinned, offload=hw.host is not None,
            devices_per_node=_node(hw, n), torus=hw.torus is not None, stack=opts.stack,
        )
        for n in counts
    ]
    fresh = [t for t in tables if t is not None and len(t["dp"])]
    joint = {k: np.concatenate([t[k] for t in fresh]) for k in KNOBS} if fresh else None
    ranks = rank(cost, hw, opts, joint) if joint is not None else None
    best_rows: list[tuple[dict[str, np.ndarray], int] | None] = []
    offset = 0
    for table in tables:
        if table is None:
            assert known is not None
            i = known.best()
            best_rows.append(None if i is None else (known.layouts, i))
            continue
        size = len(table["dp"])
        if size == 0 or ranks is None:
            best_rows.append(None)
            continue
        fits = ranks.fits[offset : offset + size]
        memory = ranks.memory[offset : offset + size]
        tps = ranks.tokens_per_s[offset : offset + size]
        offset += size
        idx = np.flatnonzero(fits)
        if not len(idx):
            best_rows.append(None)
            continue
        order = idx[np.lexsort((memory[idx], -tps[idx]))]
        best_rows.append((table, int(order[0])))
    found = [b for b in best_rows if b is not None]
    rows = (
        evaluate(
            cost, hw, opts, {k: np.array([t[k][i] for t, i in found]) for k in KNOBS}
        )
        if found
        else None
    )
    points: list[ScalePoint] = []
    ref: tuple[int, float] | None = None
    j = 0
    head = head_flops_per_token(cost)
    for n, chosen in zip(counts, best_rows, strict=True):
        if chosen is None:
            points.append(
                ScalePoint(
                    devices=n,
                    layout=None,
                    tokens_per_s=0.0,
                    mfu=0.0,
                    speedup=0.0,
                    efficiency=0.0,
                    cause="does not fit",
                    cause_share=0.0,
                )
            )
            continue
        table, i = chosen
        assert rows is not None
        row = rows.row(j)
        tps = float(row.tokens_per_s)
        if ref is None:
            ref = (n, tps)
        speedup = tps / ref[1]
        cause, share = row.overhead(hw)
        peak = float(per_device_peak(hw.accelerator, opts.precision, min(n, hw.devices_per_node)))
        attention = cost.attention_flops_per_token
        per_token = float(sum(kernel_seconds(cost.model_flops_per_token - head - attention,
                                             head, attention, peak, hw.accelerator, opts)))
        ideal = n / per_token
        points.append(
            ScalePoint(
                devices=n,
                layout=Layout.from_row(table, i),
                tokens_per_s=tps,
                mfu=float(row.mfu),
                speedup=speedup,
                efficiency=tps / ideal,
                cause=cause,
                cause_share=share,
                shortfall=_shortfall(row, cause, share),
            )
        )
        j += 1
    return points


def _shortfall(row: Evaluation, cause: str, share: float) -> str:
    """The largest part of a layout's step that is not the model's FLOPs: `cause` (the largest
    overhead, `share` of the step), the memory-bound kernels or the recomputed FLOPs."""
    step = float(row.step)
    flops, hfu = float(row.compute.flops_bound), float(row.hfu)
    recomputed = flops * (1.0 - float(row.mfu) / hfu) if hfu else 0.0
    parts = {
        cause: share,
        "memory-bound kernels (norms, activations, GEMM operands, FP8 casts)":
            float(row.compute.memory_ops) / step,
        "recomputation": recomputed / step,
    }
    what = max(parts, key=lambda k: parts[k])
    return f"{what} ({parts[what]:.0%} of the step)"


def knee(points: list[ScalePoint], threshold: float) -> ScalePoint | None:
    """The device count at which scaling efficiency drops below `threshold` after having been
    at or above it (a curve that starts below it, because the smallest count that fits needs
    recomputation or offload, is reported by `starts_below`)."""
    seen_above = False
    for p in points:
        if p.layout is None:
            continue
        if p.efficiency >= threshold:
            seen_above = True
        elif seen_above:
            return p
    return None


def starts_below(points: list[ScalePoint], threshold: float) -> ScalePoint | None:
    fitting = [p for p in points if p.layout is not None]
    if fitting and fitting[0].efficiency < threshold:
        return fitting[0]
    return None
