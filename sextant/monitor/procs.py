"""Resident memory of this process's worker processes, read from /proc (Linux).

The live view shows memory per rank while a run trains. When the workers' step events carry
`rss_bytes` that figure is used; otherwise the view reads it here: the children of this
process that run `sextant.launch.worker`, their rank from the RANK variable the launcher set,
their VmRSS from /proc/PID/status. Elsewhere (no /proc) it returns {} and nothing is shown.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _ppid(pid: str) -> int | None:
    try:
        stat = (_PROC / pid / "stat").read_text()
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def worker_rss(parent: int | None = None) -> dict[int, int]:
    """{rank: resident bytes} of the sextant workers whose parent is `parent` (default: us)."""
    parent = os.getpid() if parent is None else parent
    out: dict[int, int] = {}
    try:
        pids = [p.name for p in _PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if _ppid(pid) != parent:
            continue
        try:
            if b"sextant.launch.worker" not in (_PROC / pid / "cmdline").read_bytes():
                continue
            env = (_PROC / pid / "environ").read_bytes().split(b"\0")
            rank = next(int(e[5:]) for e in env if e.startswith(b"RANK="))
            for line in (_PROC / pid / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[rank] = int(line.split()[1]) * 1024
        except (OSError, StopIteration, ValueError):
            continue
    return dict(sorted(out.items()))
