"""Errors a user can cause and fix.

`UserError` is the single exception type the CLI turns into a one-line message and exit
code 2. Raise it for bad input (files, flags, combinations); let genuine bugs raise anything
else so that they surface with a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message says what was received and what is allowed."""


class RunFailed(Exception):
    """A training run failed (a worker died, timed out or raised); the message names the rank."""


class TrainingDiverged(UserError):
    """A loss or gradient norm became NaN or infinite: the message names step, rank and
    value. A UserError because its fix is the user's (learning rate, data); the run is
    stored with status 'diverged'."""
