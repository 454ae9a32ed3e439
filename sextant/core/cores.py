"""The CPU cores this process may use, and the threads each worker gets by default.

Read by the launcher (how many threads, which cores) and by backends that size a service
process's thread pool; imports nothing of sextant.
"""

from __future__ import annotations

import os


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def default_threads(workers: int) -> int:
    """Intra-op threads per worker when the strategy does not say: the cores, shared evenly."""
    return max(1, len(usable_cores()) // workers)
