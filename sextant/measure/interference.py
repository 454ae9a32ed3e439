"""What the rest of the machine does while a run trains.

A thread in the launching process samples, every SAMPLE_INTERVAL_S:
- the machine's busy CPU time (/proc/stat: user, nice, system, irq, softirq) and steal;
- the CPU time of the run's own process tree (this process and every descendant: the
  workers, their threads, reaped children through cutime/cstime);
- the 1-minute load average (/proc/loadavg);
- frequency throttling where Linux exposes it (thermal_throttle counters, current / maximum
  cpufreq); on machines that hide both (most VMs) those fields are None.

CPU used *outside* the run's tree = machine busy time - tree time. A run is **disturbed**
when, over its training window (first to last step event), either
- the CPU used outside its tree averages at least DISTURBED_OUTSIDE_CORES cores, or
- at least DISTURBED_BUSY_SHARE of the window had a burst of DISTURBED_BURST_CORES or more
  outside it (a burst covering part of the run), or
- steal reached DISTURBED_STEAL_SHARE of the machine's time (a hypervisor took the CPUs).
Disturbed runs are kept and shown, but left out of every verdict (docs/methodology.md).
Only Linux is sampled; elsewhere the summary says so and no run is marked.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_INTERVAL_S = 0.5
DISTURBED_OUTSIDE_CORES = 0.25
"""Mean CPU (in cores) used outside the run's process tree that marks it disturbed."""
DISTURBED_BURST_CORES = 0.5
DISTURBED_BUSY_SHARE = 0.15
"""Share of the training window with >= DISTURBED_BURST_CORES used outside the run."""
DISTURBED_STEAL_SHARE = 0.05
"""Share of the machine's CPU time stolen by a hypervisor that marks a run disturbed."""
QUIET_CHECK_S = 3.0
"""How long `sextant check`'s quiet-machine check samples an idle machine."""

_PROC = Path("/proc")


def available() -> bool:
    return (_PROC / "stat").is_file()


def machine_jiffies() -> tuple[int, int, int]:
    """(busy, steal, total) CPU time of the whole machine, in clock ticks."""
    with open(_PROC / "stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq, steal, sum(fields)


def tree_jiffies(root: int) -> int:
    """CPU time (clock ticks) of `root` and all its live descendants, each with the time of
    the children it has reaped."""
    parent: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        rest = text[text.rfind(")") + 2:].split()
        pid = int(entry.name)
        parent[pid] = int(rest[1])
        cpu[pid] = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def load1() -> float | None:
    try:
        return float((_PROC / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def throttle_count() -> int | None:
    paths = list(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/thermal_throttle/*_throttle_count"))
    if not paths:
        return None
    total = 0
    for p in paths:
        try:
            total += int(p.read_text())
        except (OSError, ValueError):
            pass
    return total


def freq_ratio() -> float | None:
    """Lowest current / maximum frequency over the CPUs, where cpufreq is visible."""
    ratios = []
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq"):
        try:
            ratios.append(int((cpu / "scaling_cur_freq").read_text())
                          / int((cpu / "cpuinfo_max_freq").read_text()))
        except (OSError, ValueError, ZeroDivisionError):
            continue
    return min(ratios) if ratios else None


class Sampler:
    """Samples the machine in a background thread between start() and stop()."""

    def __init__(self, root: int | None = None, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.active = available()

    def _sample(self) -> None:
        busy, steal, total = machine_jiffies()
        self.samples.append({"t": time.monotonic(), "busy": busy, "steal": steal,
                             "total": total, "tree": tree_jiffies(self.root),
                             "load1": load1(), "throttle": throttle_count(),
                             "freq_ratio": freq_ratio()})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except (OSError, ValueError):  # /proc changed under us: skip this sample
                pass

    def start(self) -> Sampler:
        if self.active:
            self._sample()
            self._thread = threading.Thread(target=self._loop, name="sextant-interference",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """The interference over `window` (monotonic start, end; default: all samples)."""
        return summarize(self.samples, window, os.cpu_count() or 1)


def summarize(samples: list[dict[str, Any]], window: tuple[float, float] | None,
              cores: int) -> dict[str, Any]:
    """Interference figures and the disturbed flag from raw samples (see the module doc)."""
    thresholds = {"outside_cores": DISTURBED_OUTSIDE_CORES,
                  "burst_cores": DISTURBED_BURST_CORES, "busy_share": DISTURBED_BUSY_SHARE,
                  "steal_share": DISTURBED_STEAL_SHARE}
    chosen = samples
    if window is not None:
        # The samples bracketing the window: the one just before it starts onwards.
        t0, t1 = window
        before = [i for i, s in enumerate(samples) if s["t"] <= t0]
        after = [i for i, s in enumerate(samples) if s["t"] >= t1]
        lo = before[-1] if before else 0
        hi = after[0] if after else len(samples) - 1
        if hi - lo >= 1:
            chosen = samples[lo:hi + 1]
    if len(chosen) < 2:
        return {"sampled": False, "reason": "too few samples (run shorter than "
                                            f"{SAMPLE_INTERVAL_S} s, or no /proc)",
                "disturbed": False, "thresholds": thresholds, "cores": cores}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    outside = []
    for a, b in itertools.pairwise(chosen):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        used = ((b["busy"] - a["busy"]) - (b["tree"] - a["tree"])) / tick / dt
        outside.append((dt, max(used, 0.0)))
    span = sum(dt for dt, _ in outside) or 1e-9
    first, last = chosen[0], chosen[-1]
    mean = max(((last["busy"] - first["busy"]) - (last["tree"] - first["tree"])) / tick / span,
               0.0)
    busy_share = sum(dt for dt, c in outside if c >= DISTURBED_BURST_CORES) / span
    total = last["total"] - first["total"]
    steal = (last["steal"] - first["steal"]) / total if total > 0 else 0.0
    loads = [s["load1"] for s in chosen if s["load1"] is not None]
    throttles = [s["throttle"] for s in chosen if s["throttle"] is not None]
    freqs = [s["freq_ratio"] for s in chosen if s["freq_ratio"] is not None]
    reasons = []
    if mean >= DISTURBED_OUTSIDE_CORES:
        reasons.append(f"{mean:.2f} cores used outside the run on average "
                       f"(threshold {DISTURBED_OUTSIDE_CORES})")
    if busy_share >= DISTURBED_BUSY_SHARE:
        reasons.append(f"bursts of >= {DISTURBED_BURST_CORES} cores outside the run for "
                       f"{busy_share:.0%} of it (threshold {DISTURBED_BUSY_SHARE:.0%})")
    if steal >= DISTURBED_STEAL_SHARE:
        reasons.append(f"{steal:.0%} CPU steal (threshold {DISTURBED_STEAL_SHARE:.0%})")
    ordered = sorted(c for _, c in outside)
    return {
        "sampled": True,
        "window_s": span,
        "samples": len(chosen),
        "cores": cores,
        "outside_cores_mean": mean,
        "outside_cores_p90": ordered[int(0.9 * (len(ordered) - 1))] if ordered else None,
        "outside_cores_max": ordered[-1] if ordered else None,
        "outside_busy_share": busy_share,
        "run_cores_mean": (last["tree"] - first["tree"]) / tick / span,
        "steal_share": steal,
        "load1_max": max(loads) if loads else None,
        "throttle_events": (throttles[-1] - throttles[0]) if throttles else None,
        "freq_ratio_min": min(freqs) if freqs else None,
        "disturbed": bool(reasons),
        "reason": "; ".join(reasons),
        "thresholds": thresholds,
    }
