"""GPU utilisation and memory through NVML, where there is a GPU; nothing otherwise.

pynvml is used when installed; otherwise the NVML library that ships with the NVIDIA driver
(libnvidia-ml.so.1) is called directly through ctypes, so no package is needed. Without a
driver (CPU machines, macOS) `GpuSampler().sample()` returns [] and nothing is shown.
"""

from __future__ import annotations

import ctypes
from typing import Any

from sextant.core.devices import NvmlMemory, open_nvml


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class GpuSampler:
    """`sample()` -> [{index, util_percent, mem_used_bytes, mem_total_bytes, power_watts}]
    per GPU."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._lib: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
            return
        except Exception:  # noqa: BLE001 - no pynvml, no driver: try the C library, or none
            self._nvml = None
        opened = open_nvml()
        if opened is not None:
            self._lib, handles = opened
            self._handles = list(handles)

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def _power(self, handle: Any) -> float | None:
        """Board power in watts (NVML reports milliwatts); None where unsupported."""
        try:
            if self._nvml is not None:
                return float(self._nvml.nvmlDeviceGetPowerUsage(handle)) / 1e3
            milliwatts = ctypes.c_uint()
            if self._lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(milliwatts)):
                return None
            return milliwatts.value / 1e3
        except Exception:  # noqa: BLE001 - power is optional (some boards do not report it)
            return None

    def sample(self) -> list[dict[str, Any]]:
        out = []
        for index, handle in enumerate(self._handles):
            try:
                if self._nvml is not None:
                    util = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                    used, total = mem.used, mem.total
                else:
                    u, m = _Utilization(), NvmlMemory()
                    if (self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(u))
                            or self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(m))):
                        continue
                    util, used, total = u.gpu, m.used, m.total
            except Exception:  # noqa: BLE001 - a GPU that stops answering is not shown
                continue
            out.append({"index": index, "util_percent": int(util),
                        "mem_used_bytes": int(used), "mem_total_bytes": int(total),
                        "power_watts": self._power(handle)})
        return out
