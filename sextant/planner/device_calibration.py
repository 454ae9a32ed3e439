"""`sextant calibrate --device gpu`: what this machine's accelerators reach on the workload's
own work, for the planner.

* **GEMM efficiency over the workload's shapes.** Every matrix multiply of one training step
  of the workload (ModelCost.gemms per layer, and the output projection), at its micro-batch
  of tokens: the forward product (T x K by K x M), the input gradient (T x M by M x K) and
  the weight gradient (K x T by T x M). Each is timed alone in a child process (torch, the
  device's 16-bit type on a GPU, float32 on a CPU), warmed up, then the best of repeated runs
  between device synchronisations. The kernel efficiency is their FLOP-weighted rate over
  the catalogue's dense peak: sum(count x 2 M K N) / sum(count x seconds) / peak. It is what
  `--kernel-efficiency` means (efficiency.py): GEMM operand and elementwise traffic are added
  by the planner on top, so the measured rate of the GEMMs alone is the right input.
* **Collective bus bandwidth.** All-reduce between one process per device (NCCL on GPUs,
  gloo on CPUs), 1 MiB to `max_bytes` by x4, the median of repeated calls after a barrier;
  bus bandwidth = 2 (n - 1) / n x bytes / seconds (nccl-tests' busbw). The largest size's
  figure is the plateau the plan uses for the intra-node link. One device: nothing to
  measure, and the document says so.

`sextant plan` on the same accelerator then takes the measured kernel efficiency as its
default (unless --kernel-efficiency or --mfu is given) and the measured plateau as the
intra-node link's collective bandwidth (unless --intra-link is given); the published
references never read a calibration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sextant.core.errors import RunFailed, UserError
from sextant.planner.calibration_doc import (
    Calibration,
    DeviceAllReduce,
    DeviceGemm,
    DeviceSection,
)
from sextant.planner.models import ModelCost

DEVICES = ("gpu", "cpu")
MIN_COLLECTIVE_BYTES = 2**20
DEVICE_NAMES = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100 NVL", "h100-nvl"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100", "a100-80gb"),
    ("B200", "b200"),
    ("MI300X", "mi300x"),
)
"""Catalogue key of a device from the name its driver reports (torch.cuda.get_device_name),
the first substring that matches; any other device needs --accelerator."""

_GEMM_SCRIPT = r"""
import json, sys, time
import torch
device, dtype_name, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("no GPU visible to torch " + torch.__version__ + " (torch.cuda.is_available() "
                 "is False): --device gpu needs one")
    torch.backends.cuda.matmul.allow_tf32 = False
    sync = torch.cuda.synchronize
    name = torch.cuda.get_device_name(0)
    count = torch.cuda.device_count()
else:
    sync = lambda: None
    name, count = "cpu", 1
out = []
for m, k, n in shapes:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b)
    sync()
    times = []
    deadline = time.perf_counter() + 0.25
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 50):
        sync(); t0 = time.perf_counter(); torch.mm(a, b); sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    out.append({"m": m, "k": k, "n": n, "seconds_best": times[0],
                "seconds_median": times[len(times) // 2], "reps": len(times)})
    del a, b
print(json.dumps({"device_name": name, "device_count": count, "torch": torch.__version__,
                  "gemms": out}))
"""


def accelerator_of(device_name: str) -> str | None:
    """The catalogue key of a device name (DEVICE_NAMES), or None."""
    return next((key for part, key in DEVICE_NAMES if part in device_name), None)


def gemm_shapes(cost: ModelCost, tokens: int, tp: int = 1) -> list[tuple[int, int, int, int]]:
    """(M, K, N, count) of every matrix product of one step's layers and output projection
    over `tokens` tokens, tensor parallelism splitting each weight as the planner does
    (efficiency._split): per weight of K x M, the forward T x K by K x M, the input gradient
    T x M by M x K and the weight gradient K x T by T x M; counts over the layers."""
    if tokens < 1 or tp < 1:
        raise UserError(f"tokens and tp must be >= 1. Received: tokens={tokens}, tp={tp}")
    found: Counter[tuple[int, int, int]] = Counter()
    weights = [((k if column else k / tp), (m / tp if column else m), cost.n_layers)
               for k, m, column in cost.gemms]
    vocab = cost.logits_bytes_per_token / 4.0
    if cost.family == "transformer" and vocab:
        weights.append((float(cost.hidden), vocab / tp, 1))
    for k, m, count in weights:
        kk, mm = max(int(round(k)), 1), max(int(round(m)), 1)
        for shape in ((tokens, kk, mm), (tokens, mm, kk), (kk, tokens, mm)):
            found[shape] += count
    return [(m_, k_, n_, c) for (m_, k_, n_), c in found.items()]


@dataclass(frozen=True, slots=True)
class MeasuredGemms:
    """The products of one child process, with the device it ran on."""

    device_name: str
    device_count: int
    torch: str
    gemms: tuple[DeviceGemm, ...]


def measure_gemms(shapes: list[tuple[int, int, int, int]], *, device: str, dtype: str,
                  timeout: float) -> MeasuredGemms:
    """Time each product in one child process on `device` ('cuda' or 'cpu')."""
    unique = [[m, k, n] for m, k, n, _ in shapes]
    try:
        proc = subprocess.run([sys.executable, "-c", _GEMM_SCRIPT, device, dtype,
                               json.dumps(unique)], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"GEMM shape measurement on {device} timed out after "
                        f"{timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RunFailed(f"GEMM shape measurement on {device} failed: {tail[0]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    gemms = []
    for row, (_, _, _, count) in zip(out["gemms"], shapes):
        m, k, n, best = int(row["m"]), int(row["k"]), int(row["n"]), float(row["seconds_best"])
        gemms.append(DeviceGemm(
            m=m, k=k, n=n, count=count, seconds_best=best, flops=2.0 * m * k * n / best,
            extra={key: v for key, v in row.items() if key not in ("m", "k", "n",
                                                                   "seconds_best")}))
    return MeasuredGemms(device_name=str(out["device_name"]),
                         device_count=int(out["device_count"]), torch=str(out["torch"]),
                         gemms=tuple(gemms))


def kernel_efficiency(gemms: Sequence[DeviceGemm], peak: float) -> float:
    """The FLOP-weighted rate of the measured products over `peak`: the step's GEMM FLOPs
    over the time they took, as a fraction of the dense peak."""
    flops = sum(g.count * 2.0 * g.m * g.k * g.n for g in gemms)
    seconds = sum(g.count * g.seconds_best for g in gemms)
    if seconds <= 0 or peak <= 0:
        raise UserError("no GEMM time measured: nothing to compute an efficiency from")
    return flops / seconds / peak


def collective_sizes(max_bytes: int) -> list[int]:
    if max_bytes < MIN_COLLECTIVE_BYTES:
        raise UserError(f"--max-bytes must be >= {MIN_COLLECTIVE_BYTES} for a device "
                        f"calibration. Received: {max_bytes}")
    sizes, size = [], MIN_COLLECTIVE_BYTES
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def measure_bus_bandwidth(*, world: int, device: str, max_bytes: int,
                          timeout: float) -> DeviceAllReduce:
    """All-reduce medians and bus bandwidths between `world` processes, one per device
    (NCCL on 'cuda', gloo on 'cpu'), on this host."""
    from sextant.launch.hosts import private_loopback
    from sextant.launch.local import free_port
    from sextant.launch.ranks import run_rank_processes

    if world < 2:
        raise UserError(f"a collective needs 2 or more processes. Received: {world}")
    sizes = collective_sizes(max_bytes)
    with tempfile.TemporaryDirectory(prefix="sextant-busbw-") as tmp, \
            private_loopback(world) as where:
        out = Path(tmp) / "busbw.json"
        port = free_port()
        run_rank_processes(
            lambda rank: ["sextant.planner.device_calibration", "--rank", str(rank),
                          "--world", str(world), "--device", device, "--addr",
                          where.master_addr, "--port", str(port), "--sizes",
                          ",".join(map(str, sizes)), "--out", str(out), "--timeout",
                          str(int(timeout))],
            world, timeout=timeout, what="all-reduce worker", placement=where)
        data = json.loads(out.read_text())
    factor = 2.0 * (world - 1) / world
    sizes_b, times = tuple(map(float, data["sizes_bytes"])), tuple(map(float, data["times_s"]))
    busbw = tuple(factor * s / t for s, t in zip(sizes_b, times))
    return DeviceAllReduce(world=int(data["world"]), backend=str(data["backend"]),
                           sizes_bytes=sizes_b, times_s=times, busbw_bytes_per_s=busbw,
                           plateau_busbw_bytes_per_s=busbw[-1])


def calibrate_device(*, cost: ModelCost, tokens: int, tp: int = 1, device: str = "gpu",
                     accelerator: Any = None, peak: float | None = None,
                     world: int | None = None, max_bytes: int = 1 << 30,
                     timeout: float = 600.0, say=None) -> DeviceSection:
    """The device section of a calibration document: the GEMMs of `cost` at `tokens` tokens
    per micro-batch (tp-way split), their kernel efficiency against `peak` (the catalogue
    accelerator's 16-bit peak on a GPU, given explicitly on a CPU) and, with two or more
    devices, the all-reduce bus bandwidth between them."""
    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}; allowed: {', '.join(DEVICES)}")
    say = say or (lambda _msg: None)
    torch_device, dtype = ("cuda", "bf16") if device == "gpu" else ("cpu", "fp32")
    shapes = gemm_shapes(cost, tokens, tp)
    say(f"{len(shapes)} GEMM shapes of {cost.name} at {tokens} tokens (tp {tp}) on {device}")
    started = time.perf_counter()
    measured = measure_gemms(shapes, device=torch_device, dtype=dtype, timeout=timeout)
    if device == "gpu" and accelerator is None:
        accelerator = _catalogued(measured.device_name)
    if peak is None:
        if accelerator is None:
            raise UserError("the peak to compare with is unknown: give an accelerator")
        peak = accelerator.peak(dtype)
    key = accelerator.key if accelerator is not None else None
    n = world if world is not None else measured.device_count
    allreduce: DeviceAllReduce | None = None
    notes: tuple[str, ...] = ()
    if n >= 2:
        say(f"all-reduce between {n} {'GPUs (NCCL)' if device == 'gpu' else 'gloo processes'}")
        allreduce = measure_bus_bandwidth(world=n, device=torch_device, max_bytes=max_bytes,
                                          timeout=timeout)
    else:
        notes = ("one device: no collective to measure (the catalogue's bus bandwidth "
                 "stays)",)
    return DeviceSection(
        device=device, accelerator=key, device_name=measured.device_name,
        device_count=measured.device_count, torch=measured.torch, dtype=dtype,
        workload=cost.name, tokens=tokens, tp=tp, peak_flops=peak, gemms=measured.gemms,
        kernel_efficiency=kernel_efficiency(measured.gemms, peak), allreduce=allreduce,
        notes=notes, seconds=time.perf_counter() - started,
    )


def _catalogued(device_name: str) -> Any:
    from sextant.planner.catalogue import load_catalogue

    key = accelerator_of(device_name)
    if key is None:
        raise UserError(f"no catalogue accelerator for {device_name!r}: give --accelerator "
                        "KEY (see 'sextant plan list')")
    return load_catalogue(calibration=None).accelerator(key)


def measured_for(calibration: Calibration | None, accelerator: str) -> DeviceSection | None:
    """The device section of a calibration document when it was measured on `accelerator`."""
    section = None if calibration is None else calibration.device
    if section is None or section.accelerator != accelerator:
        return None
    return section


# --- the all-reduce worker (python -m sextant.planner.device_calibration) ------------------


def _worker(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(args.rank)
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"tcp://{args.addr}:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=args.timeout))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sizes, medians = [], []
    for size in (int(x) for x in args.sizes.split(",")):
        x = torch.ones(max(size // 4, 1), dtype=torch.float32, device=args.device)
        for _ in range(3):
            dist.all_reduce(x)
        sync()
        times = []
        for _ in range(10):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            times.append(time.perf_counter() - t0)
        times.sort()
        sizes.append(x.numel() * 4)
        medians.append(times[len(times) // 2])
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"world": args.world, "backend":
                                              "nccl" if cuda else "gloo",
                                              "sizes_bytes": sizes, "times_s": medians}))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sextant.planner.device_calibration")
    for flag, kind in (("--rank", int), ("--world", int), ("--port", int),
                       ("--timeout", int)):
        p.add_argument(flag, type=kind, required=True)
    for flag in ("--device", "--addr", "--sizes", "--out"):
        p.add_argument(flag, required=True)
    return _worker(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
