"""Repeated, interleaved trials (`--repeats N` on compare and run): the table of their
configurations with confidence intervals, and the disturbed runs to re-run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from sextant.claims import unequal
from sextant.core.display import fmt_bytes_mb, fmt_loss, fmt_ms, fmt_rate, fmt_share
from sextant.measure.intervals import CONFIDENCE, speedup_interval
from sextant.measure.stats import max_loss_diff
from sextant.report.model import accelerator_cells
from sextant.results.record import RunRecord

DEFAULT_REPEATS = 2
"""Trials per configuration of `compare` (docs/methodology.md, "Repeated trials"): the
smallest count that gives the bootstrap a between-trial level, and the largest that keeps
the default compare (9 configurations, each pass dominated by process start and compile)
near its 5-minute bound on the 2-core reference machine."""


MAX_REPEATS = 1000


def repeats(text: str) -> int:
    """argparse type of --repeats: an integer in 1..MAX_REPEATS."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 1 to {MAX_REPEATS}. Received: {text[:40]!r}")
    return value


def add_repeats_arg(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument("--repeats", type=repeats, default=default, metavar="N",
                   help=f"run each configuration N times, each in fresh processes, "
                        f"interleaved (A B C, A B C, ...) so drift and bursts of other "
                        f"programs hit every configuration alike; speed-ups get a "
                        f"{CONFIDENCE * 100:.0f}%% interval over the trials (default: "
                        f"{default})")


def by_config(records: Sequence[RunRecord]) -> list[list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for rec in records:
        groups.setdefault(rec.label, []).append(rec)
    return list(groups.values())


def _median_s(trials: Sequence[RunRecord], figure: str) -> str:
    values = sorted(v for t in trials if (v := getattr(t.metrics, figure)) is not None)
    return f"{values[len(values) // 2]:.2f}" if values else "-"


def iteration_table(records: Sequence[RunRecord]) -> Table:
    """The iteration leg, one row per configuration (medians over its trials): the edit-run
    loop a developer waits after each change, from the process start to the first finished
    step, and its parts (the framework's import, the set-up, the first step with its
    tracing and compilation)."""
    table = Table(title="edit-run loop: process start to the first finished step (s)",
                  title_justify="left", header_style="bold")
    for name in ("run", "to 1st step", "import", "set-up", "1st step"):
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for trials in by_config(records):
        table.add_row(trials[-1].label, *(_median_s(trials, f) for f in (
            "time_to_first_step_s", "import_s", "setup_s", "first_step_s")))
    return table


def trials_table(records: Sequence[RunRecord], title: str) -> Table:
    """One row per configuration: its trials, the mean of their median steps, the range of
    those medians, and the speed-up against the first configuration with its interval.
    Disturbed trials are counted and shown, never used."""
    table = Table(title=title, title_justify="left", header_style="bold")
    # Accelerator columns only where a run used one: a CPU comparison prints as it always did.
    gpu = any(r.metrics.device == "gpu" for r in records)
    names = ["run", "trials", "step ms", "trial medians", "tokens/s",
             f"speed-up [{CONFIDENCE:.0%} CI]", "RSS MB/proc", "exposed comm",
             "final loss", "max |Δloss|"]
    if gpu:
        names[7:7] = ["MFU", "device MB", "planner"]
    for name in names:
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    groups = by_config(records)
    ref = [t for t in groups[0] if t.timed] if groups else []
    for i, trials in enumerate(groups):
        usable = [t for t in trials if t.timed]
        n_bad = len(trials) - len(usable)
        counted = f"{len(usable)}" + (f" (+{n_bad} disturbed)" if n_bad else "")
        shown = usable[-1] if usable else trials[-1]
        m = shown.metrics
        # With no quiet trial the disturbed ones' figures are still shown, marked as such.
        pool = usable or [t for t in trials if t.metrics.step_time_median_s]
        medians = [t.metrics.step_time_median_s or 0.0 for t in pool]
        mean = sum(medians) / len(medians) if medians else None
        apart = unequal(shown, groups[0][-1]) if i else None
        if i == 0:
            speed = "ref" if usable else "no quiet trial"
        elif apart:
            speed = "not ranked: " + apart.split(";")[0]
        elif usable and ref:
            interval = speedup_interval(ref, usable)
            if interval is None:
                speed = "-"
            else:
                value, low, high = interval
                speed = f"{value:.2f}x" + (f" [{low:.2f}-{high:.2f}]" if low is not None
                                           else " [no interval]")
        else:
            speed = "no quiet trial" if not usable else "-"
        tokens = m.tokens_per_step / mean if mean and m.tokens_per_step else None
        diff = max_loss_diff(shown.finite_losses, groups[0][-1].finite_losses)
        cells = [
            shown.label, counted,
            fmt_ms(mean) + (" (disturbed)" if pool and not usable else ""),
            f"{fmt_ms(min(medians))}-{fmt_ms(max(medians))}" if len(medians) > 1 else "-",
            fmt_rate(tokens if tokens is not None else m.tokens_per_s), speed,
            fmt_bytes_mb(m.peak_rss_bytes), fmt_share(m.exposed_comm_share),
            fmt_loss(m.final_loss),
            "ref" if i == 0 else (f"{diff:.1e}" if diff is not None else "-"),
        ]
        if gpu:
            cells[7:7] = accelerator_cells(m.mfu, m.device_peak_bytes, m.planner_step_s,
                                           m.planner_error)
        table.add_row(*cells)
    return table


def disturbed_lines(records: Sequence[RunRecord]) -> list[str]:
    """One line per disturbed run: which, why, and that it should be re-run."""
    out = []
    for rec in records:
        if not rec.disturbed:
            continue
        info = rec.fingerprint.interference
        m = rec.metrics
        trial = f" trial {m.trial}/{m.trials}" if m.trial else ""
        out.append(f"disturbed: run {rec.id or '?'} ({rec.label}{trial}): "
                   f"{info.get('reason') or 'over the interference thresholds'}; left out of "
                   "the verdicts")
    if out:
        out.append("re-run the disturbed configurations on a quiet machine ('sextant check "
                   "--only quiet' says whether it is quiet now)")
    return out


def run_trials(args: argparse.Namespace, workload: Any, strategy: Any, *,
               launcher: Any = None) -> int:
    """`sextant run --repeats N`: N trials of one configuration, each in fresh processes,
    stored as one group (trial index in each record's metrics)."""
    import uuid

    from rich.markup import escape
    from rich.text import Text

    from sextant.commands.common import RunProgress, open_store, runs_dir
    from sextant.core.display import console
    from sextant.runner import execute
    from sextant.sources import workload_source

    out = console()
    group = uuid.uuid4().hex[:12]
    records = []
    n = args.repeats
    with open_store(args) as store:
        with RunProgress(out, tensorboard=args.tensorboard) as progress:
            for trial in range(1, n + 1):
                shown = f"{strategy.label} #{trial}"
                progress.start(shown, workload.steps, workload=workload)
                try:
                    record = execute(workload, strategy, runs_dir=runs_dir(store), store=store,
                                     group_id=group, on_event=progress.on_event,
                                     timeout_s=args.timeout,
                                     collective_timeout_s=args.collective_timeout,
                                     cluster=args.cluster, launcher=launcher,
                                     workload_file=workload_source(args.workload),
                                     trial=(trial, n))
                except Exception as exc:
                    progress.finish(shown, None, error=str(exc))
                    raise
                progress.finish(shown, record)
                records.append(record)
        out.print(trials_table(records, f"{escape(workload.name)}: {n} trials"))
        for line in disturbed_lines(records):
            out.print(Text(line, style="yellow"))
        out.print(f"stored as runs {records[0].id}-{records[-1].id} (group {group}) in "
                  f"{store.path}", markup=False)
    return 0
