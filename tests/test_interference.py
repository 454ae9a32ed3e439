"""Interference detection: the thresholds on synthetic samples, the process-tree accounting
on a real busy child, and one real run disturbed by a busy process outside its tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sextant.measure import interference
from sextant.measure.interference import (
    DISTURBED_OUTSIDE_CORES,
    Sampler,
    summarize,
    tree_jiffies,
)
from tests.helpers import needs_torch

TICK = os.sysconf("SC_CLK_TCK")
linux = pytest.mark.skipif(not interference.available(), reason="needs /proc")


def _samples(outside_cores: list[float], *, run_cores: float = 1.0, steal: float = 0.0,
             dt: float = 0.5) -> list[dict]:
    """Samples 0.5 s apart with chosen CPU use outside and inside the run, in cores."""
    out, busy, tree, stolen, total, t = [], 0, 0, 0, 0, 100.0
    for used in [0.0, *outside_cores]:
        t += dt
        tree += round(run_cores * dt * TICK) if out else 0
        busy += round((run_cores + used) * dt * TICK) if out else 0
        stolen += round(steal * 2 * dt * TICK) if out else 0
        total += round(2 * dt * TICK) if out else 0
        out.append({"t": t, "busy": busy, "tree": tree, "steal": stolen, "total": total,
                    "load1": 1.0, "throttle": None, "freq_ratio": None})
    return out


def test_quiet_machine_is_not_disturbed() -> None:
    s = summarize(_samples([0.02] * 20), None, cores=2)
    assert s["sampled"] and not s["disturbed"] and s["reason"] == ""
    assert s["outside_cores_mean"] == pytest.approx(0.02, abs=0.02)
    assert s["run_cores_mean"] == pytest.approx(1.0, abs=0.02)


def test_steady_load_over_threshold_is_disturbed() -> None:
    s = summarize(_samples([0.4] * 20), None, cores=2)
    assert s["disturbed"] and f"threshold {DISTURBED_OUTSIDE_CORES}" in s["reason"]


def test_burst_over_part_of_the_run_is_disturbed() -> None:
    # One core busy for 4 of 20 samples: a mean of 0.2 cores, under the mean threshold,
    # but bursts for 20% of the run.
    s = summarize(_samples([0.0] * 16 + [1.0] * 4), None, cores=2)
    assert s["outside_cores_mean"] < DISTURBED_OUTSIDE_CORES
    assert s["disturbed"] and "bursts" in s["reason"]
    # The same burst outside the training window does not count.
    samples = _samples([1.0] * 4 + [0.0] * 16)
    s = summarize(samples, (samples[6]["t"], samples[-1]["t"]), cores=2)
    assert not s["disturbed"]


def test_steal_is_disturbed() -> None:
    s = summarize(_samples([0.0] * 10, steal=0.1), None, cores=2)
    assert s["disturbed"] and "steal" in s["reason"]


def test_too_few_samples_marks_nothing() -> None:
    s = summarize(_samples([]), None, cores=2)
    assert not s["sampled"] and not s["disturbed"]


_BUSY = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


@linux
def test_tree_accounting_counts_a_busy_child() -> None:
    before = tree_jiffies(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", _BUSY.format(s=1.0)])
    child.wait()
    # The reaped child's CPU time is in this process's cutime: still part of the tree.
    assert (tree_jiffies(os.getpid()) - before) / TICK > 0.3
    # A process's own tree never includes its parent.
    assert tree_jiffies(child.pid) == 0


def _busy_outside_tree(seconds: float) -> int:
    """Start a CPU-bound process that is not a descendant of this one (its parent shell
    exits at once, so it is re-parented); returns its pid."""
    out = subprocess.run(
        ["sh", "-c", f'setsid {sys.executable} -c "$0" >/dev/null 2>&1 & echo $!',
         _BUSY.format(s=seconds)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@linux
@needs_torch
def test_a_run_next_to_a_busy_process_is_marked_disturbed(tmp_path: Path) -> None:
    from sextant.runner import execute
    from sextant.strategy import Strategy
    from tests.helpers import short

    pid = _busy_outside_tree(120)
    try:
        time.sleep(0.5)
        assert pid not in _descendants(os.getpid())
        record = execute(short("gpt-tiny", 12), Strategy(framework="torch"),
                         runs_dir=tmp_path)
    finally:
        os.kill(pid, signal.SIGKILL)
    info = record.fingerprint.values["interference"]
    assert record.metrics.disturbed is True, info
    # The busy process is counted outside the run, the run's own workers inside it.
    assert info["outside_cores_mean"] >= 0.5, info
    assert info["run_cores_mean"] >= 0.3, info


def _descendants(root: int) -> set[int]:
    parent = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                text = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(text[text.rfind(")") + 2:].split()[1])
    found, todo = set(), [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.update(kids)
        todo.extend(kids)
    return found


def test_sampler_without_proc_is_inactive(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setattr(interference, "_PROC", tmp_path)
    sampler = Sampler().start()
    sampler.stop()
    assert not sampler.active and not sampler.summary()["disturbed"]
