"""Tables for a Plan (rich). Numbers are formatted here only; the Plan holds the exact values
(printed as-is by --json)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sextant.planner.plan_doc import Memory, Plan, Scaling, Search, Training

GB = 1e9


def _t(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def render_plan(plan: Plan, console: Console) -> None:
    """The plan as a header, tables and notes, in reading order."""
    _render_header(plan, console)
    _render_memory(plan.memory, console)
    _render_time(plan, console)
    if plan.search.top:
        _render_top(plan.search, console)
    if plan.scaling is not None:
        _render_scaling(plan.scaling, plan.hardware.devices, console)
    for w in plan.warnings:
        console.print(f"[yellow]note:[/yellow] {w}")


def _render_header(plan: Plan, console: Console) -> None:
    m, hw, lay, a = plan.model, plan.hardware, plan.layout, plan.assumptions
    console.print(
        f"[bold]{m.name}[/bold] ({_count(m.params)} parameters; {m.shape}) on "
        f"[bold]{hw.devices} x {hw.accelerator}[/bold] ({hw.nodes} node(s) of "
        f"{hw.devices_per_node}; intra {hw.intra_link}, network {hw.network}), "
        f"{hw.precision}{' with FP8 GEMMs' if a.fp8 else ''}, "
        f"stack {a.stack} (memory model {a.memory_model}), "
        f"global batch {a.global_batch} "
        f"({a.tokens_per_step:,} tokens/step)"
    )
    ft = plan.finetune
    if ft is not None and ft.method == "lora":
        console.print(
            f"fine-tuning: LoRA r={ft.rank} on {','.join(ft.targets)}: "
            f"{_count(ft.trainable_params)} trainable parameters "
            f"({ft.trainable_share:.3%}), frozen {ft.base_dtype} base "
            f"{ft.frozen_weights_bytes / GB:.3g} GB, adapter checkpoint "
            f"{ft.adapter_checkpoint_bytes / 1e6:.3g} MB; model FLOPs 4N + 6N(adapters) "
            "+ attention (no weight gradients of the frozen matrices)"
        )
    elif ft is not None:
        console.print("fine-tuning: full (every parameter trains, as in pre-training)")
    att = a.attention_kernel
    console.print(
        f"kernels: GEMMs at {a.kernel_efficiency:.0%} of peak; attention "
        + (f"{att.name} at {att.rate:.0%} (its causal half)" if att
           else "every score at the GEMM rate (no flash kernel with a published rate)")
        + "; elementwise "
        + ("fused" if a.fused_elementwise else "eager (one kernel per operator)")
    )
    sl = hw.slices
    if sl:
        console.print(
            f"TPU slices: {sl.count} x {sl.chips} chips; {sl.ici}"
            + (f"; dp{sl.dcn_dp} across slices over {hw.network}" if sl.count > 1 else "")
        )
    how = "best of the search" if plan.layout_searched else "as given"
    console.print(
        f"layout: [bold]{lay.label}[/bold] ({how}; "
        f"{plan.search.layouts_evaluated:,} layouts evaluated, "
        f"{plan.search.layouts_fitting:,} fit, "
        f"{plan.search.seconds * 1e3:.0f} ms)"
    )


def _render_memory(mem: Memory, console: Console) -> None:
    t = Table(title="Memory per device", title_justify="left")
    t.add_column("component")
    t.add_column("GB", justify="right")
    t.add_column("share", justify="right")
    for part in mem.parts:
        if part.value:
            t.add_row(part.label, f"{part.value / GB:,.2f}", _share(part.value, mem.total))
    t.add_row("[bold]total[/bold]", f"[bold]{mem.total / GB:,.2f}[/bold]", "")
    verdict = "[green]fits[/green]" if mem.fits else "[red]does NOT fit[/red]"
    t.add_row(f"capacity ({verdict})", f"{mem.capacity / GB:,.2f}", "")
    if mem.host_offload:
        t.add_row("offloaded to host memory", f"{mem.host_offload / GB:,.2f}", "")
        if mem.host_per_node:
            t.add_row("  host memory per node", f"{mem.host_per_node / GB:,.1f}", "")
    if mem.host_load_per_node:
        t.add_row("host memory per node at load (fp32 model per rank)",
                  f"{mem.host_load_per_node / GB:,.1f}", "")
    console.print(t)


def _render_time(plan: Plan, console: Console) -> None:
    tm = plan.time
    t = Table(title="Step time", title_justify="left")
    t.add_column("part")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    t.add_column("link")
    for part in tm.parts:
        if part.value or part.name == "compute":
            t.add_row(part.label, _t(part.value), _share(part.value, tm.step), part.link or "")
    t.add_row("[bold]step[/bold]", f"[bold]{_t(tm.step)}[/bold]", "", "")
    if tm.step_no_overlap > tm.step * 1.0005:
        t.add_row("step with no comm/compute overlap", _t(tm.step_no_overlap), "", "")
    console.print(t)

    th = plan.throughput
    console.print(
        f"throughput: [bold]{th.tokens_per_s:,.0f} tokens/s[/bold] "
        f"({th.samples_per_s:,.1f} samples/s), MFU {th.mfu:.1%} with attention FLOPs "
        f"({th.mfu_6n:.1%} as 6N; hardware FLOPs incl. recomputation {th.hfu:.1%}), "
        f"{th.model_tflops_per_device:.1f} model TFLOP/s per device; "
        f"largest overhead: {tm.main_overhead} ({tm.main_overhead_share:.1%})"
    )
    if plan.training is not None:
        _render_training(plan.training, console)


def _render_training(tr: Training, console: Console) -> None:
    cost = (
        "cost unknown (no price for this accelerator: --price-per-hour)"
        if tr.cost_usd is None or tr.price_per_device_hour is None
        else f"${tr.cost_usd:,.0f} at ${tr.price_per_device_hour:.2f}/device-hour "
        f"({tr.price_basis})"
    )
    console.print(
        f"train {tr.tokens:.3g} tokens: [bold]{tr.days:,.1f} days[/bold] "
        f"({tr.days_no_overlap:,.1f} with no overlap), "
        f"{tr.device_hours:,.0f} device-hours, {cost}"
    )


def _render_top(search: Search, console: Console) -> None:
    t = Table(title="Best layouts", title_justify="left")
    for col in ("#", "layout", "tokens/s", "MFU", "step", "GB/dev", "comm+bubble"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for i, r in enumerate(search.top, 1):
        over = r.dp_exposed + r.bubble + r.tp_comm
        t.add_row(
            str(i),
            r.layout,
            f"{r.tokens_per_s:,.0f}",
            f"{r.mfu:.1%}",
            _t(r.step),
            f"{r.memory / GB:.1f}",
            _share(over, r.step),
        )
    console.print(t)
    if search.why is not None:
        console.print("why: " + search.why.text, markup=False)


def _render_scaling(sc: Scaling, devices: int, console: Console) -> None:
    t = Table(
        title="Scaling (fixed global batch, best layout per size; efficiency = share "
        "of the ideal compute-only throughput)",
        title_justify="left",
    )
    for col in ("devices", "layout", "tokens/s", "speed-up", "eff.", "largest overhead"):
        t.add_column(col, justify="left" if col in ("layout", "largest overhead") else "right")
    for p in sc.points:
        if p.layout is None:
            t.add_row(str(p.devices), "does not fit", "-", "-", "-", "-")
            continue
        cause = p.main_overhead.split(" (")[0]
        t.add_row(
            str(p.devices),
            p.layout,
            f"{p.tokens_per_s:,.0f}",
            f"{p.speedup:.2f}x",
            f"{p.efficiency:.0%}",
            f"{cause} {p.overhead_share:.0%}",
        )
    console.print(t)
    low, k, thr = sc.starts_below, sc.knee, sc.threshold
    if low:
        console.print(
            f"at {low.devices} devices, the fewest that fit, efficiency is "
            f"already {low.efficiency:.0%} (< {thr:.0%}); most of the rest: "
            f"{low.shortfall}"
        )
    if k:
        console.print(
            f"efficiency falls below {thr:.0%} at [bold]{k.devices} "
            f"devices[/bold] ({k.efficiency:.0%}); cause: {k.cause}"
        )
    elif any(p.efficiency >= thr for p in sc.points if p.layout):
        console.print(
            f"{'after that, ' if low else ''}efficiency stays at or above "
            f"{thr:.0%} up to {devices} devices"
        )
