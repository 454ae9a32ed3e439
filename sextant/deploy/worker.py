"""One deployment artifact's two processes: `export` builds it, `serve` measures it.

    python -m sextant.deploy.worker export JOB.json
    python -m sextant.deploy.worker serve JOB.json

Each runs in a fresh process of its own (sextant.deploy.matrix starts them, with a timeout),
so that a crashing or hanging exporter or runtime costs only its own row, and the serving
process holds only its runtime: its start-up, memory and latency are the artifact's.

export  imports the training framework, loads the canonical parameters, computes the
        framework's eager forward on the held-out inputs (the reference: logits, the logits
        at the probe shape, and greedy generation), then calls the backend's exporter
        (`<backend>.export.EXPORTERS[format]`). Writes reference.npz and meta.json.
serve   loads the artifact through its runtime (sextant.deploy.runtimes), and measures: cold
        start (process start to first output), logits parity on the held-out inputs, the
        probe shape (works, refused, or silently wrong), latency at batch 1 and batch N,
        greedy generation, and peak RSS. The references are read only after the RSS is
        taken, so they are not counted in it. Writes result.json.

A failure writes error.json (the exception's one line) and exits 1.

Test hooks (SEXTANT_TEST_FAULT, comma-separated, each `<fault>@<framework>:<format>` for the
row it breaks), deliberate bugs the tests must catch: `deploy-crash` kills the exporter's
process; `deploy-weight` exports with one weight changed; `deploy-pad` serves an input
shorter than the exported length left-padded to it and cut back, as an exporter that fixed
the sequence length silently would.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sextant.core.fsutil import atomic_write_json
from sextant.measure import memory
from sextant.measure.agreement import logits_parity

Forward = Callable[[np.ndarray], np.ndarray]

EXPORT_MODULES = {
    "torch": "sextant.backends.torch_backend.export",
    "tensorflow": "sextant.backends.tf_backend.export",
    "jax": "sextant.backends.jax_backend.export",
    "keras": "sextant.backends.keras_backend.export",
}


def generate(forward: Forward, prompt: np.ndarray, tokens: int) -> list[int]:
    """Greedy decoding over a sliding window of the prompt's length (every call has the shape
    the artifact was exported with, so a static-shape artifact decodes too)."""
    window = prompt.astype(np.int64).copy()
    out: list[int] = []
    for _ in range(tokens):
        nxt = int(np.argmax(forward(window[None, :])[0, -1]))
        out.append(nxt)
        window = np.concatenate([window[1:], [nxt]])
    return out


def faults(job: dict[str, Any]) -> set[str]:
    """The test faults that apply to this job's row."""
    row = f"@{job['framework']}:{job['format']}"
    return {f[: -len(row)] for f in os.environ.get("SEXTANT_TEST_FAULT", "").split(",")
            if f.endswith(row)}


def _padded(forward: Forward, length: int) -> Forward:
    """The deploy-pad fault: shorter inputs left-padded with token 0 to `length`."""

    def wrong(tokens: np.ndarray) -> np.ndarray:
        short = length - tokens.shape[1]
        if short <= 0:
            return forward(tokens)
        padded = np.concatenate([np.zeros((tokens.shape[0], short), tokens.dtype), tokens], 1)
        return forward(padded)[:, short:]

    return wrong


def export(job: dict[str, Any]) -> None:
    from sextant.workloads.spec import workload_from_dict

    spec = workload_from_dict(job["workload"]).model
    module = importlib.import_module(EXPORT_MODULES[job["framework"]])
    with np.load(job["params"]) as npz:
        params = {name: npz[name] for name in npz.files}
    with np.load(job["inputs"]) as npz:
        inputs = {name: npz[name] for name in npz.files}
    out = Path(job["out"])
    reference = module.reference(spec, params)
    np.savez(out / "reference.npz", logits=reference(inputs["tokens"]),
             probe=reference(inputs["probe"]),
             generated=np.asarray(generate(reference, inputs["prompt"], job["generate"])))
    if "deploy-crash" in faults(job):
        os.abort()
    if "deploy-weight" in faults(job):
        name = next(n for n in params if n.endswith(".weight"))  # every token uses it
        params[name] = params[name].copy()
        params[name].flat[0] += 0.5
    start = time.perf_counter()
    meta = module.EXPORTERS[job["format"]](spec, params, inputs["tokens"], out)
    meta["export_s"] = time.perf_counter() - start
    atomic_write_json(out / "meta.json", meta)


def _latency(forward: Forward, tokens: np.ndarray, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        forward(tokens)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward(tokens)
        times.append(time.perf_counter() - start)
    return times


def _cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(x).sum(axis=-1))
    picked = np.take_along_axis(x, targets[..., None], axis=-1)[..., 0]
    return float(np.mean(logz - picked))


def serve(job: dict[str, Any]) -> None:
    from sextant.deploy.runtimes import load

    artifact = Path(job["out"])
    meta = json.loads((artifact / "meta.json").read_text())
    with np.load(job["inputs"]) as npz:
        inputs = {name: npz[name] for name in npz.files}
    memory.reset_peak()
    started = time.perf_counter()
    forward = load(job["runtime"], artifact / meta["file"], meta, job["threads"])
    load_s = time.perf_counter() - started
    if "deploy-pad" in faults(job):
        forward = _padded(forward, inputs["tokens"].shape[1])
    logits = forward(inputs["tokens"])
    first_output = time.time()
    try:
        probe: np.ndarray | None = forward(inputs["probe"])
        refused = None
    except Exception as exc:  # the runtime's refusal of the shape is the measurement
        probe, refused = None, _one_line(exc)
    rows = inputs["tokens"].shape[0]
    latency = {"1": _latency(forward, inputs["tokens"][:1], job["repeats"], job["warmup"]),
               str(rows): _latency(forward, inputs["tokens"], job["repeats"], job["warmup"])}
    generated = generate(forward, inputs["prompt"], job["generate"])
    peak = memory.peak_rss()
    with np.load(artifact / "reference.npz") as npz:
        ref = {name: npz[name] for name in npz.files}
    parity = logits_parity(logits, ref["logits"])
    probe_parity = None if probe is None else logits_parity(probe, ref["probe"])
    atomic_write_json(artifact / "result.json", {
        "load_s": load_s,
        "first_output_time": first_output,
        "parity": {"max_abs": parity.max_abs, "max_rel": parity.max_rel,
                   "argmax_agree": parity.argmax_agree},
        "loss": {"reference": _cross_entropy(ref["logits"], inputs["targets"]),
                 "artifact": _cross_entropy(logits, inputs["targets"])},
        "probe": {"shape": list(inputs["probe"].shape), "refused": refused,
                  "max_rel": None if probe_parity is None else probe_parity.max_rel},
        "latency_s": latency,
        "generated": generated,
        "generation_match": generated == [int(t) for t in ref["generated"]],
        "peak_rss_bytes": peak,
    })


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text}"[:300]


def main(argv: list[str]) -> int:
    step, job_path = argv
    job = json.loads(Path(job_path).read_text())
    try:
        (export if step == "export" else serve)(job)
    except BaseException as exc:  # the row records it; the other rows go on
        atomic_write_json(Path(job["out"]) / f"{step}.error.json",
                          {"error": _one_line(exc), "traceback": traceback.format_exc()})
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv[1:]))
