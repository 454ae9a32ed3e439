"""The accelerators of this host, read without importing any framework, and each rank's one.

`detect()` reads NVIDIA's management library (NVML, shipped with the driver) through ctypes,
or `nvidia-smi` where the library cannot be loaded, and keeps the devices that
`CUDA_VISIBLE_DEVICES` leaves visible, in its order (indices or UUID prefixes; CUDA stops at
the first entry it cannot match, and so does this). A host with neither has no accelerators:
sextant then runs on its CPU cores.

Placement is one rank per device: the worker of local rank r sees only the r-th visible
device (`pin_rank` narrows CUDA_VISIBLE_DEVICES before any framework is imported), so every
framework's "device 0" is the rank's own GPU, on every launcher (local, emulated hosts, Slurm,
torchrun-style joins). A run on CPU ranks hides the GPUs instead.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from sextant.core.errors import UserError


@dataclass(frozen=True, slots=True)
class Accelerator:
    index: int
    """NVML's index of the device on this host (what nvidia-smi shows)."""
    name: str
    """The device's name as the driver reports it, e.g. 'NVIDIA H200'."""
    memory_bytes: int
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Inventory:
    """What one host has: its visible accelerators, in CUDA_VISIBLE_DEVICES order."""

    accelerators: tuple[Accelerator, ...] = ()
    driver: str | None = None
    cuda: str | None = None
    """The CUDA version the driver supports, e.g. '13.0'."""
    source: str = "none"
    """How it was read: 'nvml', 'nvidia-smi', or 'none'."""

    @property
    def kind(self) -> str:
        """'gpu' where the host has visible accelerators, else 'cpu'."""
        return "gpu" if self.accelerators else "cpu"

    @property
    def count(self) -> int:
        return len(self.accelerators)

    def describe(self) -> str:
        """One line, e.g. '1 GPU (NVIDIA H200, 141 GB; driver 580.1, CUDA 13.0)'."""
        if not self.accelerators:
            return "no GPU (CPU cores only)"
        names = sorted({a.name for a in self.accelerators})
        gb = max(a.memory_bytes for a in self.accelerators) / 1e9
        extra = ", ".join(x for x in (f"driver {self.driver}" if self.driver else "",
                                      f"CUDA {self.cuda}" if self.cuda else "") if x)
        plural = "s" if self.count > 1 else ""
        return (f"{self.count} GPU{plural} ({' + '.join(names)}, {gb:.0f} GB"
                + (f"; {extra})" if extra else ")"))

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "count": self.count, "driver": self.driver,
                "cuda": self.cuda, "source": self.source,
                "accelerators": [asdict(a) for a in self.accelerators]}


_INDEX = re.compile(r"-?[0-9]+")


def visible(accelerators: tuple[Accelerator, ...], cuda_visible: str | None
            ) -> tuple[Accelerator, ...]:
    """The devices CUDA_VISIBLE_DEVICES leaves, in its order. Unset: all of them; empty or
    '-1': none. Entries are indices or UUID prefixes ('GPU-8f3a...'); as CUDA does, the list
    ends at the first entry that matches no device (or repeats one)."""
    if cuda_visible is None:
        return accelerators
    out: list[Accelerator] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if not entry:
            break
        if _INDEX.fullmatch(entry):  # ASCII digits only: '²' and '--1' are no index
            match = [a for a in accelerators if a.index == int(entry)]
        else:
            match = [a for a in accelerators if a.uuid and a.uuid.startswith(entry)]
        if len(match) != 1 or match[0] in out:
            break
        out.append(match[0])
    return tuple(out)


def parse_nvidia_smi(text: str) -> tuple[tuple[Accelerator, ...], str | None]:
    """(devices, driver version) from `nvidia-smi --query-gpu=index,name,memory.total,uuid,
    driver_version --format=csv,noheader,nounits` (memory in MiB)."""
    devices: list[Accelerator] = []
    driver = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        try:
            memory = int(float(cells[2]) * 2**20)
        except ValueError:
            memory = 0
        devices.append(Accelerator(index=int(cells[0]), name=cells[1], memory_bytes=memory,
                                   uuid=cells[3]))
        driver = cells[4] or driver
    return tuple(sorted(devices, key=lambda a: a.index)), driver


class NvmlMemory(ctypes.Structure):
    """nvmlMemory_t: what nvmlDeviceGetMemoryInfo fills."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def open_nvml() -> tuple[Any, list[ctypes.c_void_p]] | None:
    """(the initialised NVML library, a handle per device in NVML's order) through ctypes, or
    None without a driver. The caller shuts the library down when done with it."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
    except (OSError, AttributeError):
        return None
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        lib.nvmlShutdown()
        return None
    handles = []
    for i in range(count.value):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0:
            handles.append(handle)
    return lib, handles


def _nvml() -> Inventory | None:
    opened = open_nvml()
    if opened is None:
        return None
    lib, handles = opened
    try:
        buf = ctypes.create_string_buffer(96)
        driver = (buf.value.decode() if lib.nvmlSystemGetDriverVersion(buf, 96) == 0
                  else None)
        version = ctypes.c_int()
        cuda = (f"{version.value // 1000}.{version.value % 1000 // 10}"
                if lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(version)) == 0 else None)
        devices = []
        for i, handle in enumerate(handles):
            name = ctypes.create_string_buffer(96)
            uuid = ctypes.create_string_buffer(96)
            memory = NvmlMemory()
            lib.nvmlDeviceGetName(handle, name, 96)
            lib.nvmlDeviceGetUUID(handle, uuid, 96)
            lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            devices.append(Accelerator(index=i, name=name.value.decode(errors="replace"),
                                       memory_bytes=int(memory.total),
                                       uuid=uuid.value.decode(errors="replace")))
        return Inventory(accelerators=tuple(devices), driver=driver, cuda=cuda, source="nvml")
    finally:
        lib.nvmlShutdown()


def _nvidia_smi() -> Inventory | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total,uuid,driver_version",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    devices, driver = parse_nvidia_smi(out)
    return Inventory(accelerators=devices, driver=driver, source="nvidia-smi")


@cache
def _host_inventory() -> Inventory:
    return _nvml() or _nvidia_smi() or Inventory()


def detect(environ: Mapping[str, str] | None = None) -> Inventory:
    """This host's accelerators, as CUDA_VISIBLE_DEVICES (in `environ`, default the
    process's) leaves them."""
    env = os.environ if environ is None else environ
    host = _host_inventory()
    return Inventory(accelerators=visible(host.accelerators, env.get("CUDA_VISIBLE_DEVICES")),
                     driver=host.driver, cuda=host.cuda, source=host.source)


def resolve_device(requested: str, inventory: Inventory) -> str:
    """'cpu' or 'gpu' for --device auto|cpu|gpu on a host with `inventory`."""
    if requested == "auto":
        return inventory.kind
    if requested == "gpu" and inventory.kind != "gpu":
        raise UserError("--device gpu: this host has no visible GPU (NVML and nvidia-smi "
                        "found none, or CUDA_VISIBLE_DEVICES hides them); allowed here: "
                        "--device cpu or auto")
    if requested not in ("cpu", "gpu"):
        raise UserError(f"unknown device {requested!r}; allowed: auto, cpu, gpu")
    return requested


def check_ranks_fit(device: str, ranks_per_host: int, inventory: Inventory) -> None:
    """One rank per GPU: refuse more ranks on a host than it has visible GPUs."""
    if device != "gpu" or ranks_per_host <= inventory.count:
        return
    raise UserError(
        f"{ranks_per_host} ranks per host need {ranks_per_host} GPUs (one each); this host has "
        f"{inventory.describe()}. Use --workers {inventory.count} or fewer, or --device cpu "
        "for CPU ranks")


def pin_rank(device: str, local_rank: int, environ: MutableMapping[str, str]) -> str | None:
    """Before any framework is imported: leave this rank only its own GPU (the local_rank-th
    visible one) or, on CPU ranks, none. Returns the device's CUDA_VISIBLE_DEVICES entry
    (None on CPU)."""
    if device != "gpu":
        environ["CUDA_VISIBLE_DEVICES"] = ""  # no framework may grab a GPU behind our back
        environ.setdefault("JAX_PLATFORMS", "cpu")
        return None
    inventory = detect(environ)
    if local_rank >= inventory.count:
        raise UserError(f"local rank {local_rank} has no GPU of its own: this host has "
                        f"{inventory.describe()} (one rank per GPU)")
    mine = inventory.accelerators[local_rank]
    entry = mine.uuid or str(mine.index)
    environ["CUDA_VISIBLE_DEVICES"] = entry
    return entry
