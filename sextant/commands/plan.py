"""`sextant plan`: the analytical planner, and its verbs `validate`, `references`, `list`.

Only argparse and the planner's own numpy modules are imported at registration; the planner
never imports an ML framework. The planner package holds the logic; this module holds the
command line: arguments, dispatch and the `list` tables.

    sextant plan --model M --gpus N [...]     plan a run (memory, time, cost, scaling)
    sextant plan validate [--db PATH]         predicted vs measured step time of local runs
    sextant plan references [--only ID]       the planner against published figures
    sextant plan list                         presets, accelerators, networks
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from sextant.commands.common import add_store_args, db_path
from sextant.core.display import console
from sextant.core.errors import UserError
from sextant.core.fields import add_flags
from sextant.core.paths import DEFAULT_CALIBRATION
from sextant.commands.plan_flags import GROUPS, PlanFlags

if TYPE_CHECKING:
    from sextant.planner.plan_doc import Plan

EPILOG = """examples:
  sextant plan --model llama-70b --gpus 1024 --accelerator h100-sxm --network ib-ndr --tokens 2e12
  sextant plan --model gpt3-175b --gpus 4096 --accelerator a100-80gb --search
  sextant plan --workload gpt-small.toml --gpus 2 --accelerator cpu-local --network loopback
  sextant plan validate
  sextant plan references --only zero-fig1-stage1
  sextant plan list
"""


def _console() -> Any:
    # The planner's tables print at rich's own width off a terminal (as they always have).
    return console(None, highlight=True)


def _add_catalogue_args(p: Any) -> None:
    p.add_argument("--catalogue", metavar="FILE", help="TOML merged over the bundled catalogue")
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help=f"calibration JSON (default ./{DEFAULT_CALIBRATION.as_posix()})",
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="plan a training run on a cluster you do not have yet: memory, time, cost, scaling",
        description="Analytical planner: will the model fit, how fast will it train, where does "
        "adding devices stop paying, what must the network be. Formulas and their sources: "
        "docs/planner.md.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    groups = {key: p.add_argument_group(title) for key, title in GROUPS}
    for key, group in groups.items():
        add_flags(group, PlanFlags, (key,))
        if key == "hardware":
            _add_catalogue_args(group)
    p.set_defaults(func=run_plan)

    verbs = p.add_subparsers(dest="verb", metavar="VERB", title="verbs",
                             description="optional; without one, plan the run the options "
                             "describe")
    v = verbs.add_parser(
        "validate",
        help="predicted vs measured step time of the runs in the results store",
        description="Predict each run in the results store on the planner's 'cpu-local' "
        "accelerator and compare with what was measured.",
    )
    add_store_args(v, purpose="results database with the measured runs")
    _add_catalogue_args(v)
    v.add_argument("--json", action="store_true", help="print JSON instead of a table")
    v.set_defaults(func=run_validate)
    r = verbs.add_parser(
        "references",
        help="the planner against published figures (docs/validation.md)",
        description="Run the planner on every published figure of docs/validation.md and "
        "print predicted against published.",
    )
    r.add_argument("--only", metavar="ID", help="one reference")
    r.add_argument("--split", choices=("tuning", "held-out"),
                   help="only the references of one split (docs/validation.md)")
    fmt = r.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true",
                     help="the markdown table of docs/validation.md")
    fmt.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r.set_defaults(func=run_references_cmd)
    ls = verbs.add_parser("list", help="list presets, accelerators, networks",
                          description="List the model presets, accelerators, links and prices "
                          "of the catalogue.")
    _add_catalogue_args(ls)
    ls.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ls.set_defaults(func=run_list)


def run_plan(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2, default=float))
    else:
        from sextant.planner.render import render_plan

        render_plan(plan, _console())
    return 0


def run_list(args: argparse.Namespace) -> int:
    from sextant.planner.catalogue import load_catalogue

    return _list(load_catalogue(args.catalogue, args.calibration), args.json)


def run_references_cmd(args: argparse.Namespace) -> int:
    from sextant.planner.references import (
        references_markdown,
        render_references,
        run_references,
    )

    rows = run_references(only=args.only, split=args.split)
    if args.markdown:
        print(references_markdown(rows))
    elif args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        render_references(rows, _console())
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from sextant.planner.validate import render_validation, validate

    rows = validate(db=db_path(args), calibration=args.calibration, catalogue=args.catalogue)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        render_validation(rows, _console())
    return 0


MAX_PLAN_DEVICES = 1 << 24
"""Devices, and devices per node: past it numpy overflows or the search hangs."""
MAX_PLAN_TOKENS = 1e17
"""Tokens to train: a thousand times today's largest runs (1e308 printed a 300-digit time)."""


def plan_from_args(args: argparse.Namespace) -> Plan:
    from sextant.planner.catalogue import load_catalogue
    from sextant.planner.estimate import resolve_hardware
    from sextant.planner.models import preset
    from sextant.planner.workload_shapes import load_workload_shape
    from sextant.planner.plan import PlanRequest, make_plan

    _check_args(args)
    # Only the shape is read, at the planner's bounds (models.PLAN_BOUNDS): a plan builds no
    # model and reads no data, so the training bounds and [data] are run's to check.
    shape = preset(args.model) if args.model else load_workload_shape(args.workload)
    cat = load_catalogue(args.catalogue, args.calibration)
    measured = _measured(args, cat)
    options = replace(
        _options(args, cat.accelerator(args.accelerator), shape.global_batch, measured),
        finetune=_finetune(args))
    hw = resolve_hardware(
        cat, args.accelerator, args.network, intra_link=args.intra_link, options=options
    )
    if measured and measured.allreduce and args.intra_link is None:
        # The all-reduce bus bandwidth measured between this host's devices replaces the
        # catalogue's plateau of the intra-node link (its ramp over message sizes stays).
        plateau = measured.allreduce.plateau_busbw_bytes_per_s
        hw = replace(hw, intra=replace(hw.intra, bus_bandwidth=plateau))
    req = PlanRequest(
        shape=shape,
        devices=args.gpus,
        accelerator=args.accelerator,
        network=args.network,
        intra_link=args.intra_link,
        options=options,
        pinned=_pinned(args),
        tokens=args.tokens,
        price_per_hour=args.price_per_hour,
        goodput=args.goodput,
        threshold=args.threshold,
        top=args.top if args.search else 0,
        curve=not args.no_curve,
        calibrated=measured,
        batch_given=args.global_batch is not None,
    )
    return make_plan(req, cat, hw)


def _finetune(args: argparse.Namespace) -> Any:
    """The fine-tuning flags over the workload's [finetune] table (when --workload names a
    sextant workload that has one); None: every parameter trains."""
    from sextant.planner.finetune import FineTune
    from sextant.planner.workload_shapes import load_workload_finetune

    given = load_workload_finetune(args.workload) if args.workload else None
    flags: dict[str, Any] = {
        key: value for key, value in (
            ("method", args.finetune), ("rank", args.lora_rank),
            ("targets", None if args.lora_targets is None else tuple(
                t.strip() for t in args.lora_targets.split(",") if t.strip())),
            ("base_dtype", args.base_dtype),
        ) if value is not None
    }
    if not flags and given is None:
        return None
    method = flags.get("method", given.method if given else "full")
    if method != "lora" and set(flags) - {"method"}:
        raise UserError("--lora-rank, --lora-targets and --base-dtype need --finetune lora. "
                        f"Received: --finetune {method}")
    base: dict[str, Any] = {} if given is None else {
        "method": given.method, "rank": given.rank, "targets": given.targets}
    return FineTune(**{**base, **flags})


def _measured(args: argparse.Namespace, cat: Any) -> Any:
    """The calibration's device section when it was measured on the planned accelerator
    (`sextant calibrate --device gpu`)."""
    from sextant.planner.device_calibration import measured_for

    return measured_for(cat.calibration, args.accelerator)


def _check_args(args: argparse.Namespace) -> None:
    """The flags' own ranges and the combinations the plan needs, each one clear error."""
    from sextant.planner.models import MAX_PLAN_GLOBAL_BATCH

    if bool(args.model) == bool(args.workload):
        raise UserError(
            "give exactly one of --model PRESET or --workload FILE (see 'sextant plan list')"
        )
    if args.gpus is None:
        raise UserError("--gpus N is required (the number of accelerators to plan for)")
    if args.mfu is not None and args.kernel_efficiency is not None:
        raise UserError(
            "give --mfu (end-to-end, the kernel efficiency is solved) or --kernel-efficiency, "
            f"not both. Received: --mfu {args.mfu}, --kernel-efficiency {args.kernel_efficiency}"
        )
    if args.oversubscription != 1.0 and args.nodes_per_leaf is None:
        raise UserError(
            "--oversubscription needs --nodes-per-leaf (how many nodes share a leaf switch). "
            f"Received: --oversubscription {args.oversubscription}"
        )
    for ok, message in (
        (args.price_per_hour is None
         or (math.isfinite(args.price_per_hour) and args.price_per_hour >= 0),
         f"--price-per-hour must be a finite number >= 0. Received: {args.price_per_hour}"),
        (args.tokens is None or (math.isfinite(args.tokens)
                                 and 0 < args.tokens <= MAX_PLAN_TOKENS),
         f"--tokens must be a number in (0, {MAX_PLAN_TOKENS:g}]. Received: "
         f"{args.tokens if args.tokens is None else format(args.tokens, 'g')}"),
        (math.isfinite(args.goodput) and 0 < args.goodput <= 1,
         f"--goodput must be in (0, 1]. Received: {args.goodput}"),
        (args.global_batch is None or 1 <= args.global_batch <= MAX_PLAN_GLOBAL_BATCH,
         f"--global-batch must be from 1 to {MAX_PLAN_GLOBAL_BATCH}. Received: "
         f"{args.global_batch}"),
        (args.top >= 0, f"--top must be >= 0. Received: {args.top}"),
        *((value is None or value <= MAX_PLAN_DEVICES,  # past it: an overflow or a hang
           f"{flag} must be an integer from 1 to {MAX_PLAN_DEVICES}. Received: {value}")
          for flag, value in (("--gpus", args.gpus), ("--gpus-per-node", args.gpus_per_node),
                              ("--nics-per-node", args.nics_per_node),
                              ("--nodes-per-leaf", args.nodes_per_leaf))),
        (0 < args.threshold <= 1, f"--threshold must be in (0, 1]. Received: {args.threshold}"),
    ):
        if not ok:
            raise UserError(message)


def _options(args: argparse.Namespace, acc: Any, model_batch: int,
             measured: Any = None) -> Any:
    """PlanOptions from the flags: the user's knobs over the chosen stack's profile; the
    kernel efficiency measured on this accelerator (`measured`) unless one is asked for, else
    its published GEMM rate (Accelerator.kernel_efficiency)."""
    from sextant.planner.estimate import PlanOptions
    from sextant.planner.profiles import default_stack, profile

    precision = args.precision or next(
        (p for p in ("bf16", "fp16", "fp32") if p in acc.peak_flops), "fp32"
    )
    if acc.measured and args.precision is None:
        precision = "fp32"
    overhead = args.overhead_gb
    if overhead is None:
        overhead = 0.3 if acc.measured else 1.0
    efficiency = {"compute_efficiency": acc.kernel_efficiency if args.kernel_efficiency is None
                  else args.kernel_efficiency}
    if measured and args.kernel_efficiency is None and args.mfu is None:
        efficiency = {"compute_efficiency": min(measured.kernel_efficiency, 1.0)}
    return PlanOptions(
        precision=precision,
        optimizer=args.optimizer,
        global_batch=model_batch if args.global_batch is None else args.global_batch,
        **efficiency,
        target_mfu=args.mfu,
        stack=profile(args.stack or default_stack(acc)).with_overrides(
            memory_model=args.memory_model,
            balanced_stages=None if args.stages is None else args.stages == "balanced",
            cp_method=args.cp_method,
            zero3_gather=args.zero3_gather,
            fused_elementwise=None if args.elementwise is None else args.elementwise == "fused",
        ),
        fp8=args.fp8,
        oversubscription=args.oversubscription,
        nodes_per_leaf=args.nodes_per_leaf,
        host_memory_gb=args.host_memory_gb,
        overlap=args.overlap,
        tp_overlap=args.tp_overlap,
        link_efficiency=args.link_efficiency,
        fragmentation=args.fragmentation,
        fixed_overhead_gb=overhead,
        flash_attention=not args.no_flash_attention,
        devices_per_node=args.gpus_per_node,
        nics_per_node=args.nics_per_node,
    )


def _pinned(args: argparse.Namespace) -> dict[str, Any]:
    """The layout knobs given on the command line (the search varies the rest)."""
    pinned: dict[str, Any] = {
        key: getattr(args, key)
        for key in ("dp", "tp", "pp", "zero", "mbs", "recompute", "offload", "interleave",
                    "cp", "ep")
        if getattr(args, key) is not None
    }
    for key, flag in (("sp", args.sp), ("hsdp", args.hsdp)):
        if flag is not None:
            pinned[key] = flag == "on"
    for key in ("dp", "tp", "pp", "mbs", "interleave", "cp", "ep"):
        if key in pinned and pinned[key] < 1:
            raise UserError(f"--{key} must be >= 1. Received: {pinned[key]}")
    return pinned


def _list(cat: Any, as_json: bool) -> int:
    from sextant.planner.presets import ALIASES, PRESETS

    doc: dict[str, Any] = {
        "presets": {
            k: {"params": v.total_params(), "shape": v.describe(), "source": v.source}
            for k, v in PRESETS.items()
        },
        "aliases": ALIASES,
        "accelerators": {
            k: {
                "name": a.name,
                "peak_tflops": {p: f / 1e12 for p, f in a.peak_flops.items()},
                "memory_gb": None if a.memory_bytes is None else a.memory_bytes / 1e9,
                "price_per_hour": cat.price(k),
                "source": a.source,
            }
            for k, a in cat.accelerators.items()
        },
        "links": {
            k: {
                "name": link.name,
                "bandwidth_gbs": link.bandwidth / 1e9,
                "latency_us": link.latency * 1e6,
                "source": link.source,
            }
            for k, link in cat.links.items()
        },
        "prices": {"date": cat.price_date, "basis": cat.price_basis},
    }
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    from rich.table import Table

    console = _console()
    t = Table(title="Model presets", title_justify="left")
    for col in ("name", "parameters", "shape"):
        t.add_column(col)
    for k, v in doc["presets"].items():
        t.add_row(k, f"{v['params'] / 1e9:.2f}B", v["shape"])
    console.print(t)
    console.print("aliases: " + ", ".join(f"{a} -> {b}" for a, b in ALIASES.items()))
    t = Table(title="Accelerators (dense peak)", title_justify="left")
    for col in ("name", "bf16 TFLOP/s", "fp32 TFLOP/s", "memory GB", "$/hour"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for k, a in doc["accelerators"].items():
        pk = a["peak_tflops"]
        t.add_row(
            k,
            f"{pk['bf16']:g}" if "bf16" in pk else "-",
            f"{pk['fp32']:g}" if "fp32" in pk else "-",
            "measured" if a["memory_gb"] is None else f"{a['memory_gb']:.1f}",
            "-" if a["price_per_hour"] is None else f"{a['price_per_hour']:.2f}",
        )
    console.print(t)
    t = Table(title="Links", title_justify="left")
    for col in ("name", "GB/s per device", "latency us"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for k, link in doc["links"].items():
        t.add_row(
            k,
            f"{link['bandwidth_gbs']:g}" if link["bandwidth_gbs"] else "measured",
            f"{link['latency_us']:.3g}",
        )
    console.print(t)
    console.print(f"prices: {cat.price_basis} ({cat.price_date}); catalogue: {cat.path}")
    return 0
