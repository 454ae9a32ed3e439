"""The worker's C allocator: keep freed memory for the next step instead of handing it back.

A training step allocates and frees the same activation and gradient buffers every step.
glibc's malloc, left at its defaults, returns the free memory at the top of its heap to the
kernel whenever it exceeds a threshold that it adjusts as the process runs (twice the largest
buffer freed from mmap so far), and serves buffers above another such threshold from fresh
mmaps. Whether a step lands on either depends on the accident of what the process allocated
before; when it does, the next step touches fresh pages and pays a page fault per 4 KiB.
On the small torch eager GPT of the expert-loop benchmark, a sextant worker took about twice
the expert loop's page faults (15,555 against 7,653 a second, measured side by side) and was
~4 % slower for it (docs/benchmarks.md, "The allocator").

PyTorch's CPU tuning guide answers this by swapping in jemalloc or TCMalloc ("reusing memory
as much as possible"), and its `torch.backends.xeon.run_cpu` launcher preloads TCMalloc
by default. sextant keeps the same policy with glibc's own knobs, for every framework's
worker alike, before a framework is imported: buffers below 32 MiB (glibc's largest mmap
threshold) come from the heap, and the heap keeps up to 2 GiB of free memory at its top. The
run's fingerprint records what was set. `SEXTANT_MALLOC=system` leaves the allocator as the
C library set it up (for an A/B comparison); another allocator preloaded with LD_PRELOAD
(jemalloc, TCMalloc, mimalloc) is left alone, and named.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
"""glibc's largest accepted mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""
TRIM_THRESHOLD = 2**31 - 1
"""Free memory the heap keeps at its top (mallopt takes a C int: ~2 GiB)."""
PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
KEPT = "glibc, freed memory kept (mmap threshold 32 MiB, trim threshold 2 GiB)"

_allocator = "system"


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):  # not a name this C library knows: not glibc
        return False


def keep_freed_memory(env: Mapping[str, str] | None = None) -> str:
    """Set glibc's thresholds so that freed buffers stay with the process; returns (and
    remembers, for the fingerprint) what the allocator now is. Does nothing where the C
    library is not glibc, where another allocator is preloaded, or with SEXTANT_MALLOC=system."""
    global _allocator
    environ: Mapping[str, str] = os.environ if env is None else env
    preload = environ.get("LD_PRELOAD", "")
    other = next((name for name in PRELOADED if name in preload), None)
    if other is not None:
        _allocator = f"{other} (LD_PRELOAD)"
    elif not _glibc():
        _allocator = "system"
    elif environ.get("SEXTANT_MALLOC", "") == "system":
        _allocator = "glibc defaults (SEXTANT_MALLOC=system)"
    else:
        libc = ctypes.CDLL(None)  # the process's own symbols: glibc's mallopt, no library search
        ok = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
              and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
        _allocator = KEPT if ok else "glibc defaults (mallopt refused)"
    return _allocator


def current() -> str:
    """What keep_freed_memory left the allocator as ('system' if it was not called)."""
    return _allocator
