"""The outcome of one pre-flight check."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
# Every check, in the order they run and print (the names --only takes).
CHECKS = ("mvp", "interconnect", "versions", "loader", "balance", "scaling", "checkpoint",
          "quiet")
"""(quiet is measured first, before any check run loads the machine, and printed last.)"""
# Worst first. "skip" (not run) never changes the exit code.
SEVERITY = {FAIL: 3, WARN: 2, PASS: 1, SKIP: 0}


@dataclass(kw_only=True)
class CheckResult:
    check: str
    """Short name (what --only takes)."""
    status: str
    """pass, warn, fail or skip (not run)."""
    summary: str
    """One line: the measured figure against the threshold, or what went wrong."""
    measured: float | None = None
    threshold: float | None = None
    unit: str = ""
    hint: str | None = None
    """One-line fix, for warn and fail."""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worst(results: list[CheckResult]) -> str:
    return max((r.status for r in results), key=SEVERITY.__getitem__, default=SKIP)
