"""Errors a user can cause and fix.

`UserError` is the single exception type the CLI turns into a one-line message and exit
code 2. Raise it for bad input (files, flags, combinations); let genuine bugs raise anything
else so that they surface with a traceback.
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """Bad input: the message says what was received and what is allowed."""


class RunFailed(Exception):
    """A training run failed (a worker died, timed out or raised); the message names the rank.
    `run_dir` is the failed run's directory (its logs and events) when the run got one."""

    def __init__(self, message: str, *, run_dir: str | Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = Path(run_dir) if run_dir is not None else None

    def __reduce__(self):  # keeps run_dir through pickling (a keyword-only argument)
        return _run_failed, (str(self), self.run_dir)


def _run_failed(message: str, run_dir: Path | None) -> RunFailed:
    return RunFailed(message, run_dir=run_dir)


class TrainingDiverged(UserError):
    """A loss or gradient norm became NaN or infinite: the message names step, rank and
    value. A UserError because its fix is the user's (learning rate, data); the run is
    stored with status 'diverged'."""
