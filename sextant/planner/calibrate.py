"""`sextant calibrate`: measure this machine for the planner.

* GEMM FLOP/s (float32, 2 n^3 FLOPs per n x n product) with numpy and, if installed, torch,
  each with 1 thread and with all threads, each in its own child process (thread counts are
  fixed before the library loads; torch is never imported into the planner's process).
* Memory bandwidth: a 256 MiB numpy copy (read + write bytes over time), best of 5.
* All-reduce time between 2 real worker processes (torch.distributed, gloo backend, TCP on
  127.0.0.1, a free port) for messages of 1 KiB to 64 MiB, median of repeated calls, fitted by
  least squares to t = alpha + beta * bytes. Relative residuals are minimised (each point
  weighted by 1/t), so that the microsecond-scale small messages count as much as the large
  ones; alpha is the latency, 1/beta the bandwidth.

The result is JSON (schema 1) at ./sextant-results/calibration.json unless --out says where;
the planner then fills its 'cpu-local' accelerator and 'loopback' link from it. With
`--device gpu` the document also holds a `device` section (device_calibration.py): the kernel
efficiency over the workload's GEMM shapes and the all-reduce bus bandwidth between the
host's GPUs, which `sextant plan` on that accelerator uses.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sextant.core.defaults import MEASUREMENT_TIMEOUT_S
from sextant.core.errors import RunFailed, UserError
from sextant.core.fsutil import atomic_write_text
from sextant.measure.collectives import fit_alpha_beta
from sextant.planner.calibration_doc import (
    Calibration,
    DeviceSection,
    GemmRate,
    Host,
    LoopbackAllReduce,
)
from sextant.planner.catalogue import DEFAULT_CALIBRATION

GEMM_N = 1024
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)

_GEMM_SCRIPT = r"""
import json, sys, time
lib, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if lib == "torch":
    import torch
    torch.set_num_threads(threads)
    a = torch.randn(n, n); b = torch.randn(n, n)
    mm = lambda: torch.mm(a, b)
    version = torch.__version__
else:
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    mm = lambda: a @ b
    version = np.__version__
for _ in range(3):
    mm()
times = []
deadline = time.perf_counter() + 1.0
while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 200):
    t0 = time.perf_counter(); mm(); times.append(time.perf_counter() - t0)
times.sort()
print(json.dumps({"seconds_median": times[len(times) // 2], "seconds_best": times[0],
                  "reps": len(times), "version": version}))
"""


def default_out() -> Path:
    return DEFAULT_CALIBRATION


def host_info() -> Host:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Host(cpu=cpu, cores=cores, memory_bytes=float(memory),
                python=platform.python_version(), platform=platform.platform())


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    return env


@dataclass(frozen=True, slots=True)
class GemmTiming:
    """One library's n x n float32 product timed in a child process."""

    flops: float
    """From the best repetition: interference only ever slows a run."""
    flops_median: float
    version: str


def measure_gemm(lib: str, threads: int, n: int = GEMM_N, timeout: float = 60.0) -> GemmTiming:
    """FLOP/s of an n x n float32 matrix product in a child process with `threads` threads."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _GEMM_SCRIPT, lib, str(n), str(threads)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_child_env(threads),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RunFailed(
            f"GEMM measurement ({lib}, {threads} threads) timed out after {timeout:.0f} s"
        ) from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RunFailed(f"GEMM measurement ({lib}, {threads} threads) failed: {tail[0]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return GemmTiming(flops=2.0 * n**3 / out["seconds_best"],
                      flops_median=2.0 * n**3 / out["seconds_median"],
                      version=str(out["version"]))


def measure_memory_bandwidth(nbytes: int = 256 * 2**20) -> float:
    """Bytes/s of a large copy (counting the read and the write), best of 5."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * src.nbytes / best


def message_sizes(max_bytes: int) -> list[int]:
    sizes, size = [], 1024
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def measure_allreduce(
    max_bytes: int = 64 * 2**20, timeout: float = MEASUREMENT_TIMEOUT_S, world: int = 2
) -> dict[str, Any]:
    """All-reduce medians between `world` gloo worker processes on loopback, and the
    alpha-beta fit (the timer is sextant.launch.collectives, shared with `sextant check`)."""
    from sextant.launch.collectives import measure_collective

    data = measure_collective("allreduce", world=world, max_bytes=max_bytes, timeout=timeout)
    data["fit"] = fit_alpha_beta(data["sizes_bytes"], data["times_s"])
    return data


def calibrate(
    *,
    out: str | Path | None = None,
    max_bytes: int = 64 * 2**20,
    timeout: float = MEASUREMENT_TIMEOUT_S,
    progress=None,
    device: DeviceSection | None = None,
) -> Calibration:
    """Measure this host (GEMM, memory copy, loopback all-reduce) and write the document,
    with `device` (device_calibration.calibrate_device) as its device section."""
    started = time.perf_counter()

    def say(msg: str) -> None:
        if progress is not None:
            progress.write(f"calibrate: {msg}\n")
            progress.flush()

    host = host_info()
    gemm: dict[str, GemmRate] = {}
    libs = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    for lib in libs:
        say(f"GEMM {GEMM_N}x{GEMM_N} float32 with {lib} (1 and {host.cores} threads)")
        one = measure_gemm(lib, 1)
        full = measure_gemm(lib, host.cores) if host.cores > 1 else one
        gemm[lib] = GemmRate(n=GEMM_N, dtype="float32", version=one.version,
                             flops_1_thread=one.flops, flops_all_threads=full.flops,
                             threads=host.cores)
    say("memory copy bandwidth (256 MiB)")
    mem_bw = measure_memory_bandwidth()
    allreduce = None
    notes = []
    if "torch" in libs:
        say(f"all-reduce between 2 gloo processes, 1 KiB to {max_bytes // 2**20} MiB")
        ar = measure_allreduce(max_bytes=max_bytes, timeout=timeout)
        fit = ar["fit"]
        allreduce = LoopbackAllReduce(
            sizes_bytes=tuple(map(float, ar["sizes_bytes"])),
            times_s=tuple(map(float, ar["times_s"])),
            alpha_s=float(fit["alpha_s"]), beta_s_per_byte=float(fit["beta_s_per_byte"]),
            bandwidth_bytes_per_s=float(fit.get("bandwidth_bytes_per_s", 0.0)),
            median_rel_residual=float(fit.get("median_rel_residual", 0.0)),
            max_rel_residual=float(fit.get("max_rel_residual", 0.0)),
            extra={k: v for k, v in {**ar, **fit}.items() if k not in _LOOPBACK_FIELDS},
        )
    else:
        notes.append("PyTorch not installed: all-reduce not measured (pip install sextant[torch])")
    doc = Calibration(
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), host=host, gemm=gemm,
        memory_bw_bytes_per_s=mem_bw, allreduce=allreduce, device=device,
        seconds=time.perf_counter() - started, notes=tuple(notes),
    )
    path = Path(out) if out else default_out()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(doc.to_dict(), indent=2) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write calibration to {path}: {exc}") from None
    return replace(doc, path=str(path))


_LOOPBACK_FIELDS = ("sizes_bytes", "times_s", "alpha_s", "beta_s_per_byte",
                    "bandwidth_bytes_per_s", "median_rel_residual", "max_rel_residual", "fit")
"""What LoopbackAllReduce names; the measurement's other keys travel in its `extra`."""


def render_calibration(doc: Calibration, console, path) -> None:
    from rich.table import Table

    h = doc.host
    console.print(f"[bold]{h.cpu}[/bold], {h.cores} cores, {h.memory_bytes / 1e9:.1f} GB RAM")
    t = Table(title="GEMM float32", title_justify="left")
    for col in ("library", "1 thread GFLOP/s", f"{h.cores} threads GFLOP/s"):
        t.add_column(col, justify="left" if col == "library" else "right")
    for lib, g in doc.gemm.items():
        t.add_row(f"{lib} {g.version}", f"{g.flops_1_thread / 1e9:.1f}",
                  f"{g.flops_all_threads / 1e9:.1f}")
    console.print(t)
    console.print(f"memory copy bandwidth: {(doc.memory_bw_bytes_per_s or 0.0) / 1e9:.1f} GB/s")
    ar = doc.allreduce
    if ar:
        t = Table(title="all-reduce, 2 gloo processes on 127.0.0.1", title_justify="left")
        for col in ("bytes", "median", "fit", "error"):
            t.add_column(col, justify="right")
        for m, s in zip(ar.sizes_bytes, ar.times_s):
            fit = ar.alpha_s + ar.beta_s_per_byte * m
            t.add_row(f"{m:,.0f}", f"{s * 1e3:.3f} ms", f"{fit * 1e3:.3f} ms",
                      f"{(fit - s) / s:+.0%}")
        console.print(t)
        console.print(
            f"fit: alpha = {ar.alpha_s * 1e6:.1f} us, beta = "
            f"{ar.beta_s_per_byte * 1e9:.4f} ns/byte "
            f"({ar.bandwidth_bytes_per_s / 1e9:.2f} GB/s), "
            f"median |error| {ar.median_rel_residual:.0%}, max {ar.max_rel_residual:.0%}"
        )
    if doc.device:
        _render_device(doc.device, console)
    for note in doc.notes + (doc.device.notes if doc.device else ()):
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print(
        f"saved to {path} in {doc.seconds:.1f} s; plan with "
        + (f"--accelerator {doc.device.accelerator}" if doc.device and doc.device.accelerator
           else "--accelerator cpu-local --network loopback")
    )


def _render_device(dev: DeviceSection, console) -> None:
    from rich.table import Table

    t = Table(title=f"GEMMs of {dev.workload} ({dev.tokens} tokens, tp {dev.tp}) on "
              f"{dev.device_name}, {dev.dtype}", title_justify="left")
    for col in ("M x K x N", "per step", "TFLOP/s", "of peak"):
        t.add_column(col, justify="right")
    for g in dev.gemms:
        t.add_row(f"{g.m} x {g.k} x {g.n}", str(g.count),
                  f"{g.flops / 1e12:.1f}", f"{g.flops / dev.peak_flops:.0%}")
    console.print(t)
    console.print(f"kernel efficiency (FLOP-weighted): {dev.kernel_efficiency:.3f} of "
                  f"{dev.peak_flops / 1e12:g} TFLOP/s")
    ar = dev.allreduce
    if ar:
        t = Table(title=f"all-reduce, {ar.world} processes ({ar.backend})",
                  title_justify="left")
        for col in ("bytes", "median", "bus bandwidth"):
            t.add_column(col, justify="right")
        for m, s, bw in zip(ar.sizes_bytes, ar.times_s, ar.busbw_bytes_per_s):
            t.add_row(f"{m:,.0f}", f"{s * 1e3:.3f} ms", f"{bw / 1e9:.1f} GB/s")
        console.print(t)


