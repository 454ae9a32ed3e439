"""`sextant compare deploy` (the deployment matrix) and `sextant export` (one artifact).

Both export the canonical parameters a training run ended with, through each framework's own
exporters, serve every artifact in a fresh process and store one row per artifact
(sextant.deploy.matrix, sextant.results.deploy).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from sextant.commands.common import (
    DEFAULT_WORKLOAD,
    add_store_args,
    inherit_parent_flags,
    open_store,
    positive_seconds,
    runs_dir,
)
from sextant.core.display import console
from sextant.core.errors import UserError
from sextant.results.deploy import OK, DeployRecord
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
from sextant.workloads.spec import Workload

REFERENCE_FRAMEWORKS = ("torch", "jax", "tensorflow")
"""Who trains the reference run when no --from-run is given: the first one installed."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1. Received: {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1. Received: {text}")
    return value


def _add_serving_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--serve-threads", type=_positive_int, default=1, metavar="N",
                   help="threads of each serving process, pinned to as many cores (default: 1)")
    p.add_argument("--rows", type=_positive_int, default=4, metavar="N",
                   help="batch N: held-out sequences for parity and the batch-N latency "
                        "(default: 4)")
    p.add_argument("--calls", type=_positive_int, default=20, metavar="N",
                   help="timed calls per latency figure, after 3 warm-up calls (default: 20)")
    p.add_argument("--export-timeout", type=positive_seconds, default=900.0, metavar="S",
                   help="seconds an exporter may take before its row fails (default: 900)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export", help="export a stored run's trained model in one deployment format",
        description="Export the final parameters of a stored run through a framework's own "
                    "exporter (FORMAT: framework:format, e.g. torch:onnx, tensorflow:litert, "
                    "jax:jax-export), serve it in a fresh process, check its logits against the "
                    "framework's eager forward and time it. The artifact is left in --out.")
    p.add_argument("--run", type=int, required=True, metavar="ID", help="the stored run's id")
    p.add_argument("--format", required=True, metavar="FORMAT",
                   help="framework:format (`sextant capabilities` lists them)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="directory for the artifact (created; must be empty if it exists)")
    _add_serving_args(p)
    add_store_args(p)
    p.set_defaults(func=cmd_export)


def add_deploy_verb(verbs: Any) -> None:
    """`sextant compare deploy`, registered by `sextant compare`."""
    verb = verbs.add_parser(
        "deploy", help="export the trained model in every framework's serving formats and "
                       "measure each artifact",
        description="Export one set of trained weights through each framework's own exporters "
                    "(torch.export, ONNX, AOTInductor, ExecuTorch; SavedModel, LiteRT; "
                    "jax.export, jax2tf, jax2onnx; Keras export), serve every artifact in a "
                    "fresh process, and show whether its logits match the trainer's, whether "
                    "it takes other shapes, its latency, cold start, size and memory.")
    verb.add_argument("--workload", default=None,
                      help=f"workload (default: {DEFAULT_WORKLOAD}); ignored with --from-run")
    verb.add_argument("--steps", type=int, default=None,
                      help="steps of the reference training run (default: the workload's)")
    verb.add_argument("--frameworks", default=None,
                      help="comma-separated subset of torch, tensorflow, jax, keras "
                           "(default: all four)")
    add_store_args(verb)
    verb.add_argument("--report", type=Path, default=None)
    verb.add_argument("--no-report", action="store_true")
    inherit_parent_flags(verb)  # `sextant compare --frameworks x deploy` keeps x
    verb.add_argument("--from-run", type=int, default=None, metavar="ID",
                      help="export the final parameters of this stored run instead of training "
                           "a reference run")
    verb.add_argument("--formats", default=None,
                      help="comma-separated framework:format or format names (default: every "
                           "format of the chosen frameworks)")
    _add_serving_args(verb)
    verb.set_defaults(func=cmd_compare_deploy)


def _options(args: argparse.Namespace) -> Any:
    from sextant.deploy.matrix import Options

    return Options(threads=args.serve_threads, rows=args.rows, repeats=args.calls,
                   export_timeout_s=args.export_timeout)


def _source(store: ResultsStore, run_id: int) -> tuple[RunRecord, Path, str]:
    """A stored run's record, its final parameters and their digest, checked."""
    from sextant.workloads.init import params_digest
    from sextant.workloads.spec import workload_from_dict

    record = store.get(run_id)
    npz = Path(record.run_dir or "") / "final_params.npz"
    if record.status != "ok" or record.run_dir is None or not npz.is_file():
        raise UserError(f"run {run_id} has no final parameters to export (status "
                        f"{record.status}; {npz} not found); export a run that finished")
    import numpy as np

    with np.load(npz) as loaded:
        digest = params_digest({name: loaded[name] for name in loaded.files})
    expected = record.ranks[0].final_params_sha256 if record.ranks else None
    if expected is not None and digest != expected:
        raise UserError(f"{npz} is not the parameters run {run_id} stored (digest {digest[:12]} "
                        f"!= {expected[:12]}); it was changed after the run")
    workload_from_dict(record.workload_dict())  # the stored workload still loads
    return record, npz, digest


def _train_reference(args: argparse.Namespace, store: ResultsStore, group: str,
                     out: Any) -> RunRecord:
    from sextant.backends import available
    from sextant.commands.run import load_with_steps
    from sextant.runner import execute
    from sextant.strategy import Strategy

    args.workload = args.workload or DEFAULT_WORKLOAD
    workload = load_with_steps(args)
    framework = next((f for f in REFERENCE_FRAMEWORKS if available(f)), None)
    if framework is None:
        raise UserError("no framework to train the reference run; pip install 'sextant[torch]'")
    out.print(f"training the reference run ({framework}, {workload.steps} steps on "
              f"{workload.name}); its final weights are what every framework exports",
              markup=False)
    return execute(workload, Strategy(framework=framework), runs_dir=runs_dir(store),
                   store=store, group_id=group, timeout_s=args.timeout)


def _row_line(r: DeployRecord) -> Text:
    line = Text(f"{r.label}: ", style="bold")
    if r.status != OK:
        return line + Text(f"{r.status}: {r.error}", style="red" if r.status == "failed"
                           else "yellow")
    lat = r.latency_at(1)
    return line + Text(
        f"{r.parity} (max rel {r.max_rel:.1e}), probe {r.probe}, "
        f"b1 {lat.p50_s * 1e3:.2f} ms, " if lat else f"{r.parity}, ") + Text(
        f"cold start {r.cold_start_s:.2f} s, {(r.size_bytes or 0) / 1e6:.2f} MB")


def deploy_table(records: list[DeployRecord], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("artifact", "status", "parity", "max rel", "other shape", "generate",
                "b1 p50 ms [95% CI]", "bN p50 ms", "cold s", "MB", "RSS MB"):
        table.add_column(col, justify="left" if col in ("artifact", "status", "parity",
                                                         "other shape") else "right")
    for r in records:
        if r.status != OK:
            table.add_row(r.label, Text(r.status, style="red" if r.status == "failed"
                                        else "yellow"), Text(r.error or "", style="dim"),
                          *[""] * 8)
            continue
        b1 = r.latency_at(1)
        bn = max(r.latency, key=lambda lat: lat.batch, default=None)
        ci = (f" [{b1.low_s * 1e3:.2f}-{b1.high_s * 1e3:.2f}]"
              if b1 and b1.low_s is not None and b1.high_s is not None else "")
        table.add_row(
            r.label, r.status,
            Text(r.parity or "", style="green" if r.parity == "match" else "red"
                 if r.parity == "mismatch" else "yellow"),
            f"{r.max_rel:.1e}" if r.max_rel is not None else "-",
            r.probe or "-", {True: "same", False: "differs", None: "-"}[r.generation_match],
            f"{b1.p50_s * 1e3:.2f}{ci}" if b1 else "-",
            f"{bn.p50_s * 1e3:.2f} (b{bn.batch})" if bn else "-",
            f"{r.cold_start_s:.2f}" if r.cold_start_s is not None else "-",
            f"{(r.size_bytes or 0) / 1e6:.2f}",
            f"{(r.peak_rss_bytes or 0) / 2**20:.0f}")
    return table


def _served(workload: Workload, npz: Path, digest: str, out_root: Path, out: Any
            ) -> tuple[Workload, Path, str]:
    """What the artifacts are exported from: a LoRA run's adapters folded into its frozen
    base (W + A B x alpha / rank), served as the plain model it is; the parameters as they
    are otherwise. The workload loses its pretrained-weights folder either way: the
    parameters come from the run, never again from the folder."""
    import dataclasses

    import numpy as np

    from sextant.workloads.init import params_digest
    from sextant.pretrained.weights import is_adapter, merge_adapters
    from sextant.workloads.spec import FinetuneSpec

    workload = dataclasses.replace(workload, weights="")
    with np.load(npz) as loaded:
        if not any(is_adapter(name) for name in loaded.files):
            return workload, npz, digest
        params = {name: loaded[name] for name in loaded.files}
    merged = merge_adapters(params, workload.finetune.scale)
    out_root.mkdir(parents=True, exist_ok=True)
    path = out_root / "merged_params.npz"
    np.savez(path, **merged)  # type: ignore[arg-type]
    out.print(f"the run's LoRA adapters are merged into its base weights (scale "
              f"{workload.finetune.scale:g}); the artifacts serve the merged model", markup=False)
    return dataclasses.replace(workload, finetune=FinetuneSpec()), path, params_digest(merged)


def _run(workload: Workload, npz: Path, digest: str, selected: list[Any], args: argparse.Namespace,
         store: ResultsStore, group: str, out_root: Path, source: int | None,
         out: Any) -> list[DeployRecord]:
    from sextant.deploy.matrix import run_matrix

    workload, npz, digest = _served(workload, npz, digest, out_root, out)

    def stored(record: DeployRecord) -> None:
        record_id = store.add_deployment(record)  # each row kept as soon as it is measured
        out.print(_row_line(record) + Text(f"  (#{record_id})", style="dim"))

    return run_matrix(workload, npz, params_sha256=digest, out_root=out_root,
                      selected=selected, options=_options(args), group_id=group,
                      source_run=source, on_row=stored)


def cmd_compare_deploy(args: argparse.Namespace) -> int:
    from sextant.commands.compare import _frameworks
    from sextant.deploy.matrix import FRAMEWORKS, rows
    from sextant.workloads.spec import workload_from_dict

    frameworks = _frameworks(args.frameworks or ",".join(FRAMEWORKS))
    no_export = [f for f in frameworks if f not in FRAMEWORKS]
    if no_export:
        raise UserError(f"sextant has no deployment formats for {', '.join(no_export)} yet; "
                        f"deploy compares {', '.join(FRAMEWORKS)}")
    selected = rows(frameworks, [n.strip() for n in (args.formats or "").split(",")
                                 if n.strip()])
    out = console()
    group = uuid.uuid4().hex[:12]
    with open_store(args) as store:
        if args.from_run is not None:
            record, npz, digest = _source(store, args.from_run)
        else:
            record = _train_reference(args, store, group, out)
            record, npz, digest = _source(store, record.id or 0)
        workload = workload_from_dict(record.workload_dict())
        out.print(f"[bold]{workload.name}[/bold]: {len(selected)} artifacts from run "
                  f"{record.id} ({record.label}), each exported and served in its own process")
        out_root = runs_dir(store) / f"deploy-{group}"
        records = _run(workload, npz, digest, selected, args, store, group, out_root,
                       record.id, out)
        out.print(deploy_table(records, f"{workload.name} - deployment artifacts of run "
                                        f"{record.id} (serving: {args.serve_threads} thread)"))
        out.print(f"stored {len(records)} deployment rows (group {group}) in {store.path}; "
                  f"artifacts in {out_root}", markup=False)
        if not args.no_report:
            from sextant.report import write_report

            path = args.report or store.path.parent / "report.html"
            write_report(store, path, group_id=record.group_id, deploy_group=group)
            out.print(f"report: {path.resolve()}", markup=False)
    return 1 if any(r.status == "failed" or r.parity == "mismatch" for r in records) else 0


def cmd_export(args: argparse.Namespace) -> int:
    from sextant.deploy.matrix import FRAMEWORKS, rows
    from sextant.workloads.spec import workload_from_dict

    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise UserError(f"--out {args.out} exists and is not an empty directory; nothing "
                        f"is written over")
    out = console()
    with open_store(args, create=False) as store:
        record, npz, digest = _source(store, args.run)
        framework, _, name = args.format.rpartition(":")
        framework = framework or record.strategy.framework
        if framework not in FRAMEWORKS:
            raise UserError(f"no deployment formats for framework {framework!r}; --format is "
                            f"framework:format with a framework of {', '.join(FRAMEWORKS)}")
        selected = rows([framework], [f"{framework}:{name}"])
        workload = workload_from_dict(record.workload_dict())
        records = _run(workload, npz, digest, selected, args, store, uuid.uuid4().hex[:12],
                       args.out, record.id, out)
    return 0 if records[0].status == OK and records[0].parity != "mismatch" else 1
