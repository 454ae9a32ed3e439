"""Peak resident memory of this process, the one probe that works for every framework on CPU.

Writing "5" to /proc/self/clear_refs resets the kernel's high-water mark (VmHWM) to the
current resident set; reading VmHWM later gives the peak since then. Where /proc is not
available (macOS), getrusage's ru_maxrss (peak since process start) is the fallback and the
result says so.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")


def reset_peak() -> bool:
    """Reset the peak-RSS mark; False when the platform cannot (the peak then spans the
    whole process)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_field(name: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def current_rss() -> int | None:
    return _status_field("VmRSS")


def peak_rss() -> int:
    """Peak resident bytes since the last reset_peak() (or process start)."""
    hwm = _status_field("VmHWM")
    if hwm is not None:
        return hwm
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024
