"""The environment fingerprint stored with every run (and compared across ranks)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from functools import cache
from importlib import metadata

from sextant import __version__
from sextant.core import allocator


@cache
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fingerprint(**extra: object) -> dict[str, object]:
    """Python, OS, CPU, core count, numpy and sextant versions, plus backend-specific fields
    (framework version, threads, CUDA/driver) passed as keyword arguments."""
    out: dict[str, object] = {
        "sextant": __version__,
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numpy": package_version("numpy"),
        "allocator": allocator.current(),
    }
    out.update(extra)
    return out
