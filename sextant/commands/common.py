"""Arguments, progress display and tables shared by the sub-commands."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, JustifyMethod
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sextant.core.defaults import COLLECTIVE_TIMEOUT_S, RUN_TIMEOUT_S
from sextant.core.devices import detect, resolve_device
from sextant.core.display import fmt_bytes_mb, fmt_loss, fmt_ms, fmt_rate, fmt_share
from sextant.measure.stats import max_loss_diff
from sextant.core.paths import DEFAULT_DB, default_db, runs_beside
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
from sextant.core.fields import add_flags, values_from
from sextant.strategy import Strategy

DEFAULT_WORKLOAD = "gpt-tiny"
GPU_WORKLOAD = "gpt2-small"
"""What `compare` trains on a GPU host: GPT-2-small's shape (gpt-tiny there measures only
the launch overhead)."""


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0. Received: {text!r}")
    return value


MAX_COLLECTIVE_TIMEOUT_S = 86400.0
"""A day: longer than any collective should wait, short of torch's timedelta overflow."""


def collective_seconds(text: str) -> float:
    """argparse type of --collective-timeout: seconds in (0, MAX_COLLECTIVE_TIMEOUT_S]."""
    value = positive_seconds(text)
    if value > MAX_COLLECTIVE_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_COLLECTIVE_TIMEOUT_S:g} seconds (a day). Received: {text!r}")
    return value


def add_store_args(p: argparse.ArgumentParser, *, purpose: str = "results database",
                   hidden: bool = False) -> None:
    """The one `--db` flag of every command that reads or writes the results store."""
    p.add_argument("--db", type=Path, default=None, metavar="PATH",
                   help=argparse.SUPPRESS if hidden else
                   f"{purpose} (default: $SEXTANT_RESULTS or ./{DEFAULT_DB.as_posix()})")


def db_path(args: argparse.Namespace) -> Path:
    """The results database a command uses: `--db`, else $SEXTANT_RESULTS, else the default."""
    return args.db if args.db is not None else default_db()


def add_optional_verbs(p: argparse.ArgumentParser, description: str) -> Any:
    """The verbs of a command that also works alone (`sextant compare`, `sextant compare
    levers`), under the dest every command's verbs use, `verb` (None: no verb given)."""
    return p.add_subparsers(dest="verb", metavar="VERB", required=False,
                            parser_class=type(p), title="verbs", description=description)


def inherit_parent_flags(verb: argparse.ArgumentParser) -> None:
    """Make the flags a verb repeats from its command take the command's value unless given
    after the verb: argparse writes a verb's defaults over what the command parsed, so
    `sextant compare --frameworks jax levers` would lose --frameworks."""
    for action in verb._actions:
        action.default = argparse.SUPPRESS


def add_run_args(p: argparse.ArgumentParser, *,
                 steps_help: str = "override the workload's steps") -> None:
    """What every command that trains takes: the workload, its steps, the timeouts, where
    the ranks run and the results store."""
    p.add_argument("--workload", default=DEFAULT_WORKLOAD,
                   help="workload TOML file, the name of a bundled one, or a Hugging Face "
                        "config as hf:config.json[,scale=S,layers=L,width=W,seq_len=N] "
                        f"(default: {DEFAULT_WORKLOAD})")
    p.add_argument("--steps", type=int, default=None, help=steps_help)
    p.add_argument("--timeout", type=positive_seconds, default=RUN_TIMEOUT_S,
                   help=f"seconds before a run's workers are killed (default: {RUN_TIMEOUT_S:g})")
    p.add_argument("--collective-timeout", type=collective_seconds, default=COLLECTIVE_TIMEOUT_S,
                   help="seconds a collective may wait for the other ranks "
                        f"(default: {COLLECTIVE_TIMEOUT_S:g})")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="run across the hosts of emulated cluster NAME (`sextant cluster up`): "
                        "ranks spread over its hosts, talking over its shaped links")
    add_store_args(p)


def add_framework_args(p: argparse.ArgumentParser, *,
                       defaults: dict[str, Any] | None = None,
                       helps: dict[str, str] | None = None) -> None:
    """Who trains and over how many processes: --framework, --mode, --parallel, --workers,
    --threads (the Strategy fields every training command shares), as Strategy declares them;
    `defaults` and `helps`: this command's own (sextant.core.fields.add_flags)."""
    add_flags(p, Strategy, ("who",), defaults=defaults, helps=helps)


def add_device_args(p: argparse.ArgumentParser, *, defaults: dict[str, Any] | None = None,
                    helps: dict[str, str] | None = None) -> None:
    """--device and --precision, the two axes that decide what a measurement can be
    compared with."""
    add_flags(p, Strategy, ("device",), defaults=defaults, helps=helps)


def lever_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The device, precision and lever fields of the Strategy the flags ask for."""
    # Under Slurm, Kubernetes or Ray the ranks run on the cluster's nodes, not here: --device
    # gpu is taken as asked (the nodes check it); auto still looks at this host.
    remote = getattr(args, "launcher", "local") in ("slurm", "kubernetes", "ray") and (
        args.device == "gpu")
    values = values_from(args, Strategy, ("device", "lever"))
    values["device"] = "gpu" if remote else resolve_device(args.device, detect())
    return values


def open_store(args: argparse.Namespace, *, create: bool = True) -> ResultsStore:
    return ResultsStore(db_path(args), create=create)


def runs_dir(store: ResultsStore) -> Path:
    return runs_beside(store.path)


class RunProgress:
    """Live view of runs (rich), fed with every rank's events (sextant.monitor.live).

    On a terminal: one animated row per run with step, loss (mean of the ranks), ms/step,
    tokens/s, exposed-communication share (once measured), resident memory per rank and GPU
    utilisation (NVML, where there is a GPU). Elsewhere (CI, a pipe) it prints one line per
    finished run, so logs stay readable. When a run finishes its ranks' events are merged
    into `<run_dir>/metrics.jsonl`, and with `tensorboard=DIR` written as TensorBoard scalars
    under DIR/<run>.
    """

    def __init__(self, out: Console, tensorboard: Path | str | None = None) -> None:
        self.console = out
        self.live = out.is_terminal
        self.tensorboard = Path(tensorboard) if tensorboard is not None else None
        if self.tensorboard is not None:
            from sextant.monitor.tensorboard import check_logdir

            check_logdir(self.tensorboard)
        self.progress = Progress(
            TextColumn("{task.description:<24}"),
            BarColumn(bar_width=16),
            TextColumn("{task.completed:>4.0f}/{task.total:<4.0f}"),
            TextColumn("{task.fields[stats]}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=out,
            transient=False,
            disable=not self.live,
        )
        self.task: Any = None
        self.stats: Any = None
        self._gpu: Any = None
        if self.live:
            from sextant.monitor.gpu import GpuSampler

            sampler = GpuSampler()
            self._gpu = sampler if sampler.available else None

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def start(self, label: str, steps: int, workload: Any = None) -> None:
        """`workload` (optional) turns samples/s into tokens/s."""
        from sextant.monitor.live import LiveStats

        tokens = workload.global_batch * workload.tokens_per_sample if workload else None
        self.stats = LiveStats(tokens, sample_processes=self.live, gpu=self._gpu)
        self.task = self.progress.add_task(label, total=steps, status="starting workers",
                                           stats="")

    def on_event(self, event: dict[str, Any]) -> None:
        if self.task is None or self.stats is None:
            return
        self.stats.update(event)
        kind = event["event"]
        fields: dict[str, Any] = {"completed": self.stats.step, "stats": self.stats.text()}
        if kind == "start" and event.get("rank") == 0:
            fields["status"] = "training"
        elif kind == "phase":
            fields["status"] = f"measuring {event['name']}"
        elif kind == "resumed" and event.get("rank") == 0:
            fields["status"] = f"resumed at step {event['step']}"
        self.progress.update(self.task, **fields)

    def finish(self, label: str, record: RunRecord | None, error: str | None = None) -> None:
        stats = self.stats
        if record is not None:
            self._write_metrics(label, record)
            if stats is not None:
                stats.exposed_comm = record.metrics.exposed_comm_share
        if self.task is not None:
            status = "[red]failed[/red]" if error else "[green]done[/green]"
            update: dict[str, Any] = {"status": status}
            if stats is not None:
                update["stats"] = stats.text()
            self.progress.update(self.task, **update)
        if not self.live:
            if error:
                self.console.print(f"{label}: failed: {error}", markup=False)
            elif record is not None:
                m = record.metrics
                rss = "|".join(fmt_bytes_mb(r.peak_rss_bytes) for r in record.ranks)
                comm = m.exposed_comm_share
                self.console.print(
                    f"{label}: done, {fmt_ms(m.step_time_median_s)} ms/step median, "
                    f"{fmt_rate(m.tokens_per_s)} tokens/s, "
                    f"final loss {fmt_loss(m.final_loss)}"
                    + (f", exposed comm {fmt_share(comm)}" if comm is not None else "")
                    + (f", peak RSS {rss} MB" if rss else ""), markup=False)
        self.task = None
        self.stats = None

    def _write_metrics(self, label: str, record: RunRecord) -> None:
        run_dir = record.run_dir
        if not run_dir:
            return
        from sextant.monitor.metrics import merged_records, write_metrics

        write_metrics(run_dir)
        if self.tensorboard is not None:
            from sextant.monitor.tensorboard import write_tensorboard

            name = f"{record.id or ''}-{label}".strip("-").replace(" ", "-")
            write_tensorboard(merged_records(run_dir), self.tensorboard, name=name)


def comparison_table(records: Sequence[RunRecord], title: str) -> Table:
    """Medians and spreads side by side; speed-up and loss difference against the first row."""
    table = Table(title=title, title_justify="left", header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("run", "left"), ("procs x thr", "right"), ("step ms", "right"), ("p10-p90", "right"),
        ("tokens/s", "right"), ("speed-up", "right"), ("1st step s", "right"),
        ("RSS MB/proc", "right"), ("exposed comm", "right"), ("final loss", "right"),
        ("max |Δloss|", "right"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    if not records:
        return table
    ref = records[0]
    for rec in records:
        m = rec.metrics
        ref_median = ref.metrics.step_time_median_s
        median = m.step_time_median_s
        diff = max_loss_diff(rec.finite_losses, ref.finite_losses)
        table.add_row(
            rec.label,
            f"{rec.strategy.workers} x {m.threads_per_worker or '?'}",
            fmt_ms(m.step_time_median_s),
            f"{fmt_ms(m.step_time_p10_s)}-{fmt_ms(m.step_time_p90_s)}",
            fmt_rate(m.tokens_per_s),
            f"{ref_median / median:.2f}x" if ref_median and median else "-",
            "-" if m.first_step_s is None else f"{m.first_step_s:.2f}",
            fmt_bytes_mb(m.peak_rss_bytes),
            fmt_share(m.exposed_comm_share),
            fmt_loss(m.final_loss),
            "ref" if rec is ref else (f"{diff:.1e}" if diff is not None else "-"),
        )
    return table
