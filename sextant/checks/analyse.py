"""The checks' judgements: pure functions over run records and measurements.

Each takes what sextant already records (a run record from `sextant.runner.execute`, the
per-step events merged by `sextant.monitor`, collective timings) and returns a CheckResult.
No process is started here, so every threshold and message is testable in microseconds;
`sextant.checks.suite` produces the inputs with real runs. docs/checks.md explains each
measurement and threshold.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from sextant.checks.result import FAIL, PASS, SKIP, WARN, CheckResult
from sextant.results.record import RunRecord

# Fingerprint fields that legitimately differ between the ranks of one healthy job.
PER_RANK_FIELDS = frozenset({"cpu_affinity", "hostname", "pid", "local_rank"})


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


# --- MVP ---------------------------------------------------------------------------------

def check_mvp(record: RunRecord | None, error: str | None = None,
              label: str = "single-device run") -> CheckResult:
    """The single-device run completes and its loss decreases (mean of the last half of the
    steps below the first step's loss)."""
    hint_run = ("run it alone with `sextant run` and read rank0.stderr.log in the run "
                "directory")
    if record is None:
        return CheckResult(check="mvp", status=FAIL, summary=f"{label} failed: {error}",
                           hint=hint_run)
    losses = record.finite_losses
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if bad is not None:
        return CheckResult(
            check="mvp", status=FAIL, summary=f"loss is {losses[bad]} at step {bad + 1}",
            hint="lower the learning rate, check the inputs for NaN/inf and the loss for "
                 "log(0) or division by zero",
            details={"losses": losses})
    if len(losses) < 2:
        return CheckResult(check="mvp", status=FAIL,
                           summary=f"only {len(losses)} loss recorded: cannot tell a trend",
                           hint="run more steps (--steps)")
    first = losses[0]
    tail = float(np.mean(losses[len(losses) // 2:]))
    decrease = (first - tail) / abs(first) if first else first - tail
    figures = (f"{len(losses)} steps, loss {first:.4f} -> {losses[-1]:.4f} "
               f"(last-half mean {tail:.4f}, {decrease * 100:+.1f}%), "
               f"{_ms(record.metrics.step_time_median_s)}/step")
    details = {"losses": losses, "steps": len(losses), "run_dir": record.run_dir}
    if tail < first:
        return CheckResult(check="mvp", status=PASS, summary=f"{label} trains: {figures}",
                           measured=decrease, threshold=0.0, unit="relative loss decrease",
                           details=details)
    return CheckResult(
        check="mvp", status=FAIL, summary=f"loss does not decrease: {figures}",
        measured=decrease, threshold=0.0, unit="relative loss decrease",
        hint="check the learning rate (too high diverges, too low stalls), that targets "
             "match inputs, and that the optimizer gets the model's parameters",
        details=details)


# --- version consistency -----------------------------------------------------------------

def _normalise_fingerprint(fp: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in fp.items() if k not in PER_RANK_FIELDS}
    device = out.get("device")
    if isinstance(device, str) and ":" in device:  # cuda:0 on rank 0, cuda:1 on rank 1
        out["device"] = device.split(":", 1)[0]
    return out


def check_versions(record: RunRecord | None, error: str | None = None) -> CheckResult:
    """Every rank's environment fingerprint equals the majority's (per-rank fields aside)."""
    if record is None:
        return CheckResult(check="versions", status=FAIL,
                           summary=f"not measured: the multi-worker run failed: {error}",
                           hint="fix the run first (see the mvp check and the rank logs)")
    # The JSON form: a value shown in the summary or the details reads as the rank wrote it.
    prints = {r.rank: _normalise_fingerprint(r.to_dict()["fingerprint"]) for r in record.ranks}
    fields = sorted({k for fp in prints.values() for k in fp})
    diffs: list[dict[str, Any]] = []
    for name in fields:
        values = {rank: fp.get(name) for rank, fp in prints.items()}
        counts = Counter(repr(v) for v in values.values())
        if len(counts) == 1:
            continue
        majority_repr = counts.most_common(1)[0][0]
        majority = next(v for v in values.values() if repr(v) == majority_repr)
        odd = sorted(rank for rank, v in values.items() if repr(v) != majority_repr)
        diffs.append({"field": name, "ranks": odd,
                      "values": {str(r): values[r] for r in odd}, "expected": majority})
    n = len(prints)
    if not diffs:
        return CheckResult(
            check="versions", status=PASS, measured=0, threshold=0, unit="differing fields",
            summary=f"{n} worker(s) report the same environment ({len(fields)} fields)",
            details={"fields": fields, "ignored": sorted(PER_RANK_FIELDS)})
    parts = []
    for d in diffs:
        ranks = ", ".join(map(str, d["ranks"]))
        shown = "; ".join(f"{d['values'][str(r)]!r}" for r in d["ranks"][:1])
        parts.append(f"{d['field']} {shown} on rank {ranks} (others {d['expected']!r})")
    bad_ranks = sorted({r for d in diffs for r in d["ranks"]})
    return CheckResult(
        check="versions", status=FAIL, measured=len(diffs), threshold=0,
        unit="differing fields",
        summary=f"rank {', '.join(map(str, bad_ranks))} differ: " + "; ".join(parts),
        hint="install identical versions on every node (one container image or a pinned "
             "lock file) and rerun",
        details={"differences": diffs, "ignored": sorted(PER_RANK_FIELDS)})


# --- data loader ---------------------------------------------------------------------------

def check_loader(record: RunRecord | None, threshold: float = 0.10,
                 error: str | None = None, pipeline: dict[str, Any] | None = None
                 ) -> CheckResult:
    """Share of the step spent waiting for the next batch (each rank's median data wait over
    the job's median step time); warn above `threshold`. With `pipeline` (the reader timed
    alone, sextant.data.probe), also warn when it delivers fewer tokens per second than the
    step needs: a loader that cannot keep up whatever it prefetches."""
    if record is None:
        return CheckResult(check="loader", status=FAIL,
                           summary=f"not measured: the run failed: {error}",
                           hint="fix the run first (see the mvp check and the rank logs)")
    step = record.metrics.step_time_median_s
    if not step:
        return CheckResult(check="loader", status=SKIP,
                           summary="not measured: the run has no steady-state step time",
                           hint="run more steps than the warm-up (--steps)")
    waits = {r.rank: r.data_wait_median_s or 0.0 for r in record.ranks}
    shares = {r: w / step for r, w in waits.items()}
    rank = max(shares, key=shares.__getitem__)
    share, wait = shares[rank], waits[rank]
    figures = (f"waiting for data {_pct(share)} of each step (rank {rank}: {_ms(wait)} of "
               f"{_ms(step)}), threshold {_pct(threshold)}")
    details: dict[str, Any] = {"share_by_rank": {str(k): v for k, v in shares.items()},
                               "step_time_median_s": step}
    slow_pipeline = False
    if pipeline is not None:
        from sextant.data.probe import needed_throughput

        need = needed_throughput(step, record.metrics.data_wait_median_s,
                                 pipeline["tokens_per_batch"])
        have = pipeline["tokens_per_s"]
        details["pipeline"] = {**pipeline, "needed_tokens_per_s": need}
        if need is not None:
            slow_pipeline = have < need
            figures += (f"; the reader alone delivers {have:,.0f} tokens/s per rank, the step "
                        f"needs {need:,.0f} ({pipeline['tokens_per_batch']:,} tokens in "
                        f"{_ms(pipeline['tokens_per_batch'] / need)} of compute)")
    if share <= threshold and not slow_pipeline:
        return CheckResult(check="loader", status=PASS, summary=figures, measured=share,
                           threshold=threshold, unit="share of step", details=details)
    return CheckResult(
        check="loader", status=WARN, summary=f"data loader bottleneck: {figures}",
        measured=share, threshold=threshold, unit="share of step",
        hint="prepare batches ahead of the step: torch DataLoader(num_workers>0, "
             "pin_memory=True), tf.data .prefetch(AUTOTUNE), a background thread for jax; "
             "or preprocess and cache the data offline"
             + ("; the reader itself is too slow: faster storage, fewer larger reads, or "
                "tokens cached on local disk" if slow_pipeline else ""),
        details=details)


# --- data skew and stragglers ------------------------------------------------------------

def _median_others(values: dict[int, float], rank: int) -> float:
    others = [v for r, v in values.items() if r != rank]
    return float(np.median(others)) if others else values[rank]


def balance_figures(record: RunRecord,
                    steps: dict[int, list[dict[str, Any]]]) -> dict[int, dict[str, float]]:
    """Per rank: rows per step, median step / data wait / compute time, and the median lag
    (how long after the first rank this rank finishes each step, from the step events)."""
    warm = int(record.workload["measure"]["warmup_steps"])
    figures: dict[int, dict[str, float]] = {}
    # Steps every rank reported, past warm-up (at least 3 if the run is that short).
    common = set.intersection(*(set(e["step"] for e in ev) for ev in steps.values())) \
        if steps else set()
    chosen = sorted(s for s in common if s > warm)
    if len(chosen) < 3:
        chosen = sorted(s for s in common if s > 1) or sorted(common)
    ends = {rank: {e["step"]: e["time"] for e in ev} for rank, ev in steps.items()}
    first_end = {s: min(ends[r][s] for r in ends) for s in chosen}
    for r in record.ranks:
        rank = r.rank
        times = r.step_times_s[warm:] or r.step_times_s
        rows = [x for x in r.rows_per_step if x is not None]
        step = float(np.median(np.asarray(times, dtype=float)))
        data = float(r.data_wait_median_s or 0.0)
        lag = (float(np.median([ends[rank][s] - first_end[s] for s in chosen]))
               if rank in ends and chosen else 0.0)
        figures[rank] = {"rows": float(np.median(rows)) if rows else float("nan"),
                         "step_s": step, "data_s": data, "compute_s": max(0.0, step - data),
                         "lag_s": lag}
    return figures


def check_balance(record: RunRecord | None, steps: dict[int, list[dict[str, Any]]],
                  threshold: float = 0.10, error: str | None = None) -> CheckResult:
    """Data skew (a rank gets more rows per step than the median of the others) and slow
    ranks (same rows, but finishing its steps later, or waiting longer for its batches, than
    the others by more than `threshold` of the job's step time)."""
    if record is None:
        return CheckResult(check="balance", status=FAIL,
                           summary=f"not measured: the multi-worker run failed: {error}",
                           hint="fix the run first (see the mvp check and the rank logs)")
    if len(record.ranks) < 2:
        return CheckResult(check="balance", status=SKIP,
                           summary="not run: needs at least 2 workers (--workers)")
    fig = balance_figures(record, steps)
    job = record.metrics.step_time_median_s or math.nan
    rows = {r: f["rows"] for r, f in fig.items()}
    skewed, slow = [], []
    worst_excess = 0.0
    for rank, f in fig.items():
        ref_rows = _median_others(rows, rank)
        row_excess = (f["rows"] / ref_rows - 1.0) if ref_rows and not math.isnan(f["rows"]) \
            else 0.0
        lag_excess = (f["lag_s"] - _median_others({r: g["lag_s"] for r, g in fig.items()},
                                                  rank)) / job
        data_excess = (f["data_s"] - _median_others({r: g["data_s"] for r, g in fig.items()},
                                                    rank)) / job
        worst_excess = max(worst_excess, row_excess, lag_excess, data_excess)
        if row_excess > threshold:
            skewed.append(f"rank {rank} gets {f['rows']:.0f} rows per step, the others "
                          f"{ref_rows:.0f} (+{_pct(row_excess)})")
        elif lag_excess > threshold:
            slow.append(f"rank {rank} is slow: same rows ({f['rows']:.0f}), finishes its steps "
                        f"{_ms(f['lag_s'])} after the first rank (+{_pct(lag_excess)} of the "
                        f"{_ms(job)} step)")
        elif data_excess > threshold:
            slow.append(f"rank {rank} is slow: same rows ({f['rows']:.0f}), waits "
                        f"{_ms(f['data_s'])} for its batches (+{_pct(data_excess)} of the step)")
    details = {"per_rank": {str(r): f for r, f in fig.items()}, "job_step_s": job,
               "skewed": skewed, "slow": slow}
    if skewed:
        return CheckResult(
            check="balance", status=FAIL, measured=worst_excess, threshold=threshold,
            unit="excess over the other ranks", summary="data skew: " + "; ".join(skewed + slow),
            hint="give every rank the same number of rows per step (shard with a "
                 "DistributedSampler / drop_last, split the global batch evenly); uneven shards "
                 "also weight the gradient average unevenly",
            details=details)
    if slow:
        return CheckResult(
            check="balance", status=WARN, measured=worst_excess, threshold=threshold,
            unit="excess over the other ranks", summary="straggler: " + "; ".join(slow),
            hint="every rank waits for the slowest at each all-reduce: find what else runs on "
                 "that rank's cores/device (nvidia-smi, top), its thermal state, or its loader",
            details=details)
    spread = max(f["lag_s"] for f in fig.values())
    return CheckResult(
        check="balance", status=PASS, measured=worst_excess, threshold=threshold,
        unit="excess over the other ranks",
        summary=(f"{len(fig)} ranks balanced: rows per step "
                 f"{', '.join(format(f['rows'], '.0f') for f in fig.values())}, largest finish lag "
                 f"{_ms(spread)} of a {_ms(job)} step (threshold {_pct(threshold)})"),
        details=details)


# --- scaling -------------------------------------------------------------------------------

def check_scaling(points: list[tuple[int, RunRecord | None, str | None]],
                  tolerance: float = 0.10) -> CheckResult:
    """Throughput (samples/s) at each worker count; warn where adding workers lowers it by
    more than `tolerance` (measurement noise). Efficiency = X(n) / (n X(1))."""
    failed = [(n, err) for n, rec, err in points if rec is None]
    ok = sorted((n, rec.metrics.samples_per_s or 0.0) for n, rec, _ in points
                if rec is not None)
    if failed:
        n, err = failed[0]
        return CheckResult(check="scaling", status=FAIL,
                           summary=f"the {n}-worker run failed: {err}",
                           hint="fix the run first (see the mvp check and the rank logs)")
    if len(ok) < 2:
        return CheckResult(check="scaling", status=SKIP,
                           summary="not run: needs at least 2 worker counts (--workers 2 or more)")
    base_n, base = ok[0]
    eff = {n: x / (n / base_n * base) for n, x in ok}
    table = ", ".join(f"{n}: {x:,.1f}" for n, x in ok)
    drops = [(a, xa, b, xb) for (a, xa), (b, xb) in zip(ok, ok[1:]) if xb < xa * (1 - tolerance)]
    n_max = ok[-1][0]
    details = {"samples_per_s": {str(n): x for n, x in ok},
               "efficiency": {str(n): e for n, e in eff.items()}}
    if drops:
        text = "; ".join(f"{a} -> {b} workers: {xa:,.1f} -> {xb:,.1f} samples/s "
                         f"({(xb / xa - 1) * 100:+.0f}%)" for a, xa, b, xb in drops)
        return CheckResult(
            check="scaling", status=WARN, measured=eff[n_max], threshold=tolerance,
            unit="efficiency at the largest count",
            summary=f"adding workers lowers throughput: {text} (efficiency at {n_max}: "
                    f"{_pct(eff[n_max])})",
            hint="stay at the best worker count, or make the per-worker work larger (bigger "
                 "batch, gradient accumulation) so communication and stragglers weigh less; "
                 "on CPUs keep workers x threads <= cores",
            details=details)
    note = ""
    if eff[n_max] > 1.25:
        note = (" (super-linear: the 1-worker baseline is slow for its share of the machine; "
                "on CPUs its threads may contend, try --threads 1)")
    return CheckResult(
        check="scaling", status=PASS, measured=eff[n_max], threshold=tolerance,
        unit="efficiency at the largest count",
        summary=f"throughput grows with workers ({table} samples/s); efficiency at {n_max}: "
                f"{_pct(eff[n_max])}{note}",
        details=details)


# --- interconnect --------------------------------------------------------------------------

def bandwidths(collective: str, sizes: list[int], times: list[float], world: int
               ) -> list[dict[str, float]]:
    """nccl-tests definitions: algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce,
    algbw * (n-1)/n for all-gather (bytes = the gathered total)."""
    from sextant.measure.collective_table import bus_factor

    factor = float(bus_factor({"allreduce": "all_reduce", "allgather": "all_gather"}[collective],
                              world))
    return [{"bytes": s, "time_s": t, "algbw_bytes_per_s": s / t,
             "busbw_bytes_per_s": s / t * factor} for s, t in zip(sizes, times)]


def check_interconnect(measured: dict[str, Any] | None, threshold_gbps: float = 10.0,
                       error: str | None = None) -> CheckResult:
    """Bus bandwidth at the largest message size, for all-reduce and all-gather; warn when
    the lower of the two is below `threshold_gbps` (gigabits per second)."""
    if measured is None:
        return CheckResult(
            check="interconnect", status=FAIL, summary=f"collectives failed: {error}",
            hint="check that the workers can reach each other (MASTER_ADDR/PORT, firewall, "
                 "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on multi-NIC hosts)")
    world = measured["world"]
    table = {name: bandwidths(name, m["sizes_bytes"], m["times_s"], world)
             for name, m in measured["collectives"].items()}
    peak = {name: rows[-1] for name, rows in table.items()}
    name = min(peak, key=lambda k: peak[k]["busbw_bytes_per_s"])
    gbps = peak[name]["busbw_bytes_per_s"] * 8 / 1e9
    text = ", ".join(
        f"{k} {p['bytes'] / 2**20:g} MiB in {_ms(p['time_s'])}: busbw "
        f"{p['busbw_bytes_per_s'] * 8 / 1e9:.2f} Gb/s "
        f"(algbw {p['algbw_bytes_per_s'] * 8 / 1e9:.2f})"
        for k, p in peak.items())
    details = {"world": world, "backend": measured.get("backend", "gloo"), "sizes": table}
    where = (f"{world} {measured.get('backend', 'gloo')} processes on "
             f"{measured.get('address', '127.0.0.1')}")
    if gbps >= threshold_gbps:
        return CheckResult(check="interconnect", status=PASS, measured=gbps,
                           threshold=threshold_gbps, unit="Gb/s bus bandwidth",
                           summary=f"{where}: {text}", details=details)
    return CheckResult(
        check="interconnect", status=WARN, measured=gbps, threshold=threshold_gbps,
        unit="Gb/s bus bandwidth",
        summary=f"{name} bus bandwidth {gbps:.2f} Gb/s < {threshold_gbps:g} Gb/s ({where}: {text})",
        hint="slow links make gradient all-reduce dominate the step: use the fast network "
             "(set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, enable InfiniBand/RoCE), keep ranks "
             "on one node, or compress gradients",
        details=details)


# --- checkpoint / resume -------------------------------------------------------------------

def check_checkpoint(reference: RunRecord | None, saved: RunRecord | None,
                     resumed: RunRecord | None, saved_step: int, *,
                     problem: str | None = None, error: str | None = None,
                     rtol: float = 1e-5) -> CheckResult:
    """Save at `saved_step`, restore, continue: the resumed run starts at `saved_step` and its
    losses equal the uninterrupted run's (the saving run's, itself equal to `reference`)."""
    fail_hint = ("a checkpoint that does not restore exactly loses the job's progress on the "
                 "first failure: save model and optimizer state (and the step/LR schedule "
                 "position), write atomically, verify checksums on load")
    if error is not None or saved is None or resumed is None:
        extra = f" ({problem})" if problem else ""
        return CheckResult(check="checkpoint", status=FAIL,
                           summary=f"save/resume failed: {error}{extra}", hint=fail_hint)
    steps = int(saved.workload["steps"])
    start = steps - len(resumed.losses)
    notes = [n for r in resumed.ranks for n in r.details.get("notes", ())]
    refusals = [n for n in notes if "refused" in n]
    details: dict[str, Any] = {"saved_step": saved_step, "resumed_step": start,
                               "notes": notes, "problem": problem}

    def rel(a: Sequence[float | None], b: Sequence[float | None]) -> float:
        a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        return float(np.max(np.abs(a_ - b_) / np.maximum(np.abs(b_), 1e-12))) if len(a_) else 0.0

    if start != saved_step:
        why = "; ".join(refusals) or problem or "no note from the backend"
        return CheckResult(
            check="checkpoint", status=FAIL, measured=float(start), threshold=float(saved_step),
            unit="resumed step",
            summary=f"resume started at step {start}, not at the saved step {saved_step}: {why}",
            hint=fail_hint, details=details)
    if problem:
        return CheckResult(check="checkpoint", status=FAIL,
                           summary=f"the saved checkpoint is damaged: {problem}",
                           hint=fail_hint, details=details)
    continued = rel(resumed.losses, saved.losses[saved_step:])
    details["max_rel_diff_resumed"] = continued
    perturbed = rel(saved.losses, reference.losses) if reference is not None else 0.0
    details["max_rel_diff_saving_vs_reference"] = perturbed
    if continued > rtol:
        return CheckResult(
            check="checkpoint", status=FAIL, measured=continued, threshold=rtol,
            unit="max relative loss difference",
            summary=f"resumed at step {saved_step} but the losses of steps {saved_step + 1}-"
                    f"{steps} differ from the uninterrupted run by up to {continued:.1e} "
                    f"(tolerance {rtol:g})",
            hint=fail_hint, details=details)
    if perturbed > rtol:
        return CheckResult(
            check="checkpoint", status=FAIL, measured=perturbed, threshold=rtol,
            unit="max relative loss difference",
            summary=f"saving checkpoints changes training: losses differ from the run without "
                    f"checkpoints by up to {perturbed:.1e}", hint=fail_hint, details=details)
    return CheckResult(
        check="checkpoint", status=PASS, measured=continued, threshold=rtol,
        unit="max relative loss difference",
        summary=f"saved at step {saved_step}, resumed, steps {saved_step + 1}-{steps} match the "
                f"uninterrupted run (max relative difference {continued:.1e}, tolerance {rtol:g})",
        details=details)


def check_quiet(summary: dict[str, Any]) -> CheckResult:
    """The machine is quiet enough for timings: while sextant itself idles, the CPU used by
    other programs, CPU steal and throttling stay under the thresholds that mark a run
    disturbed (sextant.measure.interference)."""
    if not summary.get("sampled"):
        return CheckResult(check="quiet", status=SKIP,
                           summary=f"not run: {summary.get('reason', 'no /proc on this system')}")
    figures = (f"{summary['outside_cores_mean']:.2f} of {summary['cores']} cores busy with "
               f"other programs (bursts >= {summary['thresholds']['burst_cores']} cores "
               f"{summary['outside_busy_share']:.0%} of the time), steal "
               f"{summary['steal_share']:.0%}, load average {summary['load1_max']}")
    details = {k: v for k, v in summary.items() if k != "thresholds"}
    if summary["disturbed"]:
        return CheckResult(
            check="quiet", status=WARN, measured=summary["outside_cores_mean"],
            threshold=summary["thresholds"]["outside_cores"], unit="cores",
            summary=f"machine busy: {figures}; runs now would be marked disturbed",
            hint="wait for the other programs to finish (top shows them) or use a machine "
                 "of your own; timings taken now are left out of verdicts",
            details=details)
    return CheckResult(check="quiet", status=PASS, measured=summary["outside_cores_mean"],
                       threshold=summary["thresholds"]["outside_cores"], unit="cores",
                       summary=f"quiet: {figures}", details=details)
