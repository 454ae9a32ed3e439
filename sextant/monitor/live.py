"""The state behind the live view of a run, fed with every rank's events.

`LiveStats.update(event)` takes the events the launcher relays (all ranks); the figures:
    step            the last step every rank has finished
    loss            mean of the ranks' local losses at the last step all of them logged
                    (the run record's definition)
    throughput      tokens/s (samples/s without a workload) of the job: tokens per step over
                    the slowest rank's time for that step, median of the last 5 steps
    rss_by_rank     resident memory per rank: the step events' rss_bytes when the workers
                    send it, else read from /proc about once a second (sextant.monitor.procs)
    gpus            NVML utilisation per GPU, about once a second, where there is a GPU
    exposed_comm    the exposed-communication share, once the run's record is known
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict, deque
from typing import Any

SAMPLE_EVERY_S = 1.0


def _rate(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


class LiveStats:
    def __init__(self, tokens_per_step: int | None = None, *, sample_processes: bool = True,
                 gpu: Any = None) -> None:
        self.tokens_per_step = tokens_per_step
        self.ranks: set[int] = set()
        self.step = 0
        self.loss: float | None = None
        self.phase: str | None = None
        self.rss_by_rank: dict[int, int] = {}
        self.gpus: list[dict[str, Any]] = []
        self.exposed_comm: float | None = None
        self._sample_processes = sample_processes
        self._gpu = gpu
        self._times: dict[int, dict[int, float]] = defaultdict(dict)
        self._rows: dict[int, dict[int, int | None]] = defaultdict(dict)
        self._losses: dict[int, dict[int, float]] = defaultdict(dict)
        self._job_times: deque[float] = deque(maxlen=5)
        self._job_rows: deque[int] = deque(maxlen=5)
        self._rss_from_events = False
        self._last_sample = 0.0

    def update(self, event: dict[str, Any]) -> None:
        kind, rank = event.get("event"), event.get("rank", 0)
        if kind == "start":
            self.ranks.add(rank)
        elif kind == "step":
            self.ranks.add(rank)
            s = event["step"]
            self._times[s][rank] = event["step_time_s"]
            self._rows[s][rank] = event.get("rows")
            if event.get("loss") is not None:
                self._losses[s][rank] = event["loss"]
            if event.get("rss_bytes"):
                self._rss_from_events = True
                self.rss_by_rank[rank] = int(event["rss_bytes"])
            if len(self._times[s]) >= len(self.ranks):
                self._complete(s)
        elif kind == "phase":
            self.phase = event.get("name")
        self.sample()

    def _complete(self, s: int) -> None:
        self.step = max(self.step, s)
        self._job_times.append(max(self._times[s].values()))
        rows = self._rows.pop(s, {})
        if rows and all(r is not None for r in rows.values()):
            self._job_rows.append(sum(rows.values()))  # type: ignore[arg-type]
        losses = self._losses.pop(s, {})
        if losses and len(losses) >= len(self.ranks):
            self.loss = sum(losses.values()) / len(losses)
        del self._times[s]

    def sample(self, now: float | None = None) -> None:
        """Refresh memory (when the events do not carry it) and GPU figures, at most about
        once a second."""
        now = time.monotonic() if now is None else now
        if now - self._last_sample < SAMPLE_EVERY_S:
            return
        self._last_sample = now
        if self._sample_processes and not self._rss_from_events:
            from sextant.monitor.procs import worker_rss

            rss = worker_rss()
            if rss:
                self.rss_by_rank = rss
        if self._gpu is not None:
            self.gpus = self._gpu.sample()

    @property
    def step_time_s(self) -> float | None:
        return statistics.median(self._job_times) if self._job_times else None

    @property
    def throughput(self) -> tuple[float, str] | None:
        t = self.step_time_s
        if not t:
            return None
        if self.tokens_per_step:
            return self.tokens_per_step / t, "tok/s"
        if self._job_rows:
            return statistics.median(self._job_rows) / t, "samples/s"
        return None

    def text(self) -> str:
        parts = []
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.step_time_s:
            parts.append(f"{self.step_time_s * 1e3:.1f} ms/step")
        tp = self.throughput
        if tp is not None:
            parts.append(f"{_rate(tp[0])} {tp[1]}")
        if self.exposed_comm is not None:
            parts.append(f"comm {self.exposed_comm * 100:.0f}%")
        if self.rss_by_rank:
            values = list(self.rss_by_rank.values())
            if len(values) <= 4:
                parts.append("RSS " + "|".join(f"{v / 2**20:.0f}" for v in values) + " MB")
            else:
                parts.append(f"RSS max {max(values) / 2**20:.0f} MB x{len(values)}")
        if self.gpus:
            parts.append("GPU " + "|".join(
                f"{g['util_percent']}% {g['mem_used_bytes'] / 2**30:.0f}G"
                + (f" {g['power_watts']:.0f}W" if g.get("power_watts") is not None else "")
                for g in self.gpus))
        return "  ".join(parts)
