"""The deployment matrix: every format each framework's exporters build, from one set of
canonical parameters, each exported and served in processes of its own, measured, stored.

For each (framework, format) row:
    unavailable  a package it needs is not installed (or no C++ compiler for AOTInductor):
                 the row says what installs it
    export       `python -m sextant.deploy.worker export` (timeout): the framework's eager
                 reference on the held-out inputs, then the framework's exporter
    serve        `python -m sextant.deploy.worker serve` (timeout), threads pinned: cold start,
                 parity, the probe shape, latency, generation, peak RSS
A crash, a hang or an error in either process fails that row only, with its one-line cause.

The held-out inputs are global batches past the training run's last step (the run never saw
them), the same arrays for every framework; so is the probe (another batch and sequence
length) and the generation prompt.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sextant.backends import get_backend
from sextant.backends.base import ExportFormat
from sextant.data import global_batch
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_json
from sextant.measure.agreement import EXPORT_RTOL
from sextant.measure.intervals import median_interval
from sextant.results import deploy as rec
from sextant.results.deploy import DeployRecord, Latency
from sextant.workloads.spec import MLPSpec, Workload

FRAMEWORKS = ("torch", "tensorflow", "jax", "keras")
"""The frameworks whose backends declare export formats, in the matrix's order."""
REFERENCE_BYTES = 1 << 27
"""The held-out logits kept as the reference are bounded (rows x seq x vocab x 4 bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    threads: int = 1
    """Threads (and cores) of each serving process: latency is per pinned core."""
    rows: int = 4
    """Batch N of the held-out inputs and the batch-N latency."""
    repeats: int = 20
    warmup: int = 3
    generate: int = 32
    export_timeout_s: float = 900.0
    serve_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Row:
    framework: str
    format: ExportFormat


def rows(frameworks: Iterable[str] = FRAMEWORKS, formats: Iterable[str] = ()) -> list[Row]:
    """The (framework, format) rows asked for: every format of each framework, or only those
    named as `framework:format` or `format`. An unknown name is refused with the known ones."""
    every = [Row(fw, fmt) for fw in frameworks for fmt in get_backend(fw).capabilities().exports]
    wanted = list(formats)
    if not wanted:
        return every
    known = {f"{r.framework}:{r.format.name}" for r in every}
    names = {r.format.name for r in every}
    for name in wanted:
        if name not in known and name not in names:
            raise UserError(f"unknown deployment format {name!r}; known: "
                            f"{', '.join(sorted(known))}")
    return [r for r in every
            if f"{r.framework}:{r.format.name}" in wanted or r.format.name in wanted]


def unavailable(row: Row) -> str | None:
    """Why the row cannot be built here (what is missing and what installs it), or None."""
    missing = [name for name in row.format.needs if importlib.util.find_spec(name) is None]
    if missing:
        return f"not installed: {', '.join(missing)} ({row.format.install})"
    if row.format.compiler and not any(shutil.which(c) for c in ("g++", "clang++", "c++")):
        return f"no C++ compiler ({row.format.install})"
    return None


def held_out(workload: Workload, rows_: int) -> dict[str, np.ndarray]:
    """The inputs every artifact is measured on: `rows_` sequences of the first batch past the
    training steps (fewer where the reference logits would exceed REFERENCE_BYTES), their
    targets, the probe (3 sequences of half the length, from the next batch) and the
    generation prompt (one sequence of the batch after)."""
    model = workload.model
    if isinstance(model, MLPSpec):
        raise UserError(f"deployment is measured on the decoder models (gpt, llama); workload "
                        f"{workload.name!r} is an MLP")
    per_row = model.seq_len * model.vocab_size * 4
    n = max(1, min(rows_, workload.global_batch, REFERENCE_BYTES // per_row))
    tokens, targets = global_batch(workload, workload.steps)
    probe = global_batch(workload, workload.steps + 1)[0][:3, : max(2, model.seq_len // 2)]
    prompt = global_batch(workload, workload.steps + 2)[0][0]
    return {"tokens": np.ascontiguousarray(tokens[:n]), "targets": targets[:n],
            "probe": np.ascontiguousarray(probe), "prompt": prompt}


def _env(row: Row, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU serving rows; a GPU would be another matrix
    env["JAX_PLATFORMS"] = "cpu"
    if row.framework == "keras":
        env["KERAS_BACKEND"] = "tensorflow"  # where Keras' three export formats exist
    return env


def _cores(threads: int) -> set[int]:
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[-threads:])


def _spawn(step: str, job_path: Path, out: Path, env: dict[str, str], timeout_s: float,
           cores: set[int] | None) -> tuple[float, str | None]:
    """Run one worker step; (wall time it started, None or its one-line failure, which the
    caller prefixes with the step)."""
    log = (out / f"{step}.log").open("wb")
    started = time.time()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sextant.deploy.worker", step, str(job_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return started, f"timed out after {timeout_s:g} s"
    finally:
        log.close()
    if code == 0:
        return started, None
    error = out / f"{step}.error.json"
    if error.exists():
        return started, str(json.loads(error.read_text())["error"])
    tail = [line for line in (out / f"{step}.log").read_text(errors="replace").splitlines()
            if line.strip()]
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return started, how + (f": {tail[-1][:200]}" if tail else "")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _versions(row: Row) -> dict[str, str]:
    out = {}
    for name in row.format.needs:
        dist = {"ai_edge_litert": "ai-edge-litert", "tensorflow": "tensorflow-cpu"}.get(name, name)
        for candidate in (dist, name):
            try:
                out[name] = importlib.metadata.version(candidate)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def _latencies(samples: dict[str, list[float]]) -> tuple[Latency, ...]:
    out = []
    for batch, times in sorted(samples.items(), key=lambda kv: int(kv[0])):
        p50, low, high = median_interval(times)
        out.append(Latency(batch=int(batch), n=len(times), p50_s=p50,
                           p90_s=float(np.quantile(times, 0.9)), low_s=low, high_s=high))
    return tuple(out)


def _measured(row: Row, result: dict[str, Any], meta: dict[str, Any], spawned: float
              ) -> dict[str, Any]:
    """The serving result as record fields, with the verdicts."""
    parity = result["parity"]
    quantized = row.format.quantized
    verdict = (rec.QUANTIZED if quantized else
               rec.MATCH if parity["max_rel"] <= EXPORT_RTOL else rec.MISMATCH)
    probe = result["probe"]
    # A quantized artifact cannot match the fp32 reference at the probe either: it works
    # there when it is no further off than at the shape it was exported at.
    bound = EXPORT_RTOL + (2 * parity["max_rel"] if quantized else 0.0)
    if probe["refused"] is not None:
        outcome, detail = rec.REFUSED, probe["refused"]
    elif probe["max_rel"] is not None and probe["max_rel"] <= bound:
        outcome, detail = rec.WORKS, None
    else:
        outcome, detail = rec.SILENTLY_WRONG, f"max relative error {probe['max_rel']:.2e}"
    return {
        "export_s": meta.get("export_s"), "load_s": result["load_s"],
        "cold_start_s": result["first_output_time"] - spawned,
        "max_abs": parity["max_abs"], "max_rel": parity["max_rel"],
        "argmax_agree": parity["argmax_agree"], "parity": verdict,
        "loss_reference": result["loss"]["reference"],
        "loss_artifact": result["loss"]["artifact"],
        "dynamic": tuple(meta.get("dynamic", ())), "probe_shape": tuple(probe["shape"]),
        "probe": outcome, "probe_detail": detail,
        "latency": _latencies(result["latency_s"]),
        "generation_match": result["generation_match"],
        "peak_rss_bytes": result["peak_rss_bytes"],
    }


def measure_row(row: Row, workload: Workload, params: Path, inputs: Path, out: Path,
                options: Options, base: DeployRecord) -> DeployRecord:
    """Export and serve one row; its record (ok, or failed with the one-line cause)."""
    out.mkdir(parents=True, exist_ok=True)
    job = {"framework": row.framework, "format": row.format.name, "runtime": row.format.runtime,
           "workload": workload.to_dict(), "params": str(params), "inputs": str(inputs),
           "out": str(out), "threads": options.threads, "repeats": options.repeats,
           "warmup": options.warmup, "generate": options.generate}
    job_path = out / "job.json"
    atomic_write_json(job_path, job)
    env = _env(row, options.threads)
    _, error = _spawn("export", job_path, out, env, options.export_timeout_s, None)
    if error is not None:
        return _with(base, status=rec.FAILED, error=f"export: {error}")
    meta = json.loads((out / "meta.json").read_text())
    size = _size(out / meta["file"])
    spawned, error = _spawn("serve", job_path, out, env, options.serve_timeout_s,
                            _cores(options.threads))
    if error is not None:
        return _with(base, status=rec.FAILED, error=f"serve: {error}", size_bytes=size,
                     export_s=meta.get("export_s"))
    result = json.loads((out / "result.json").read_text())
    return _with(base, status=rec.OK, size_bytes=size,
                 **_measured(row, result, meta, spawned))


def _with(record: DeployRecord, **changes: Any) -> DeployRecord:
    return dataclasses.replace(record, **changes)


def run_matrix(workload: Workload, params: Path, *, params_sha256: str, out_root: Path,
               selected: list[Row], options: Options, group_id: str,
               source_run: int | None = None,
               on_row: Callable[[DeployRecord], None] | None = None) -> list[DeployRecord]:
    """Measure every selected row from the parameters at `params` (an .npz of canonical
    arrays); artifacts under out_root/<framework>-<format>/. Returns the records in order."""
    out_root.mkdir(parents=True, exist_ok=True)
    inputs = out_root / "inputs.npz"
    np.savez(inputs, **held_out(workload, options.rows))  # type: ignore[arg-type]
    records = []
    for row in selected:
        base = DeployRecord(
            framework=row.framework, format=row.format.name, runtime=row.format.runtime,
            status=rec.UNAVAILABLE, workload_name=workload.name,
            workload_hash=workload.content_hash(), params_sha256=params_sha256,
            group_id=group_id, source_run=source_run, targets=row.format.targets,
            needs=row.format.needs,
            quantized=row.format.quantized, threads=options.threads,
            versions=_versions(row), created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        why = unavailable(row)
        if why is not None:
            record = _with(base, error=why)
        else:
            record = measure_row(row, workload, params, inputs,
                                 out_root / f"{row.framework}-{row.format.name}", options, base)
        records.append(record)
        if on_row is not None:
            on_row(record)
    return records
