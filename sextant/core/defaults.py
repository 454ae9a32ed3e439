"""Limits that several commands and functions share, written once.

Imports nothing of sextant, so that any layer may read it.
"""

from __future__ import annotations

RUN_TIMEOUT_S = 900.0
"""Seconds before a run's workers are killed (`--timeout`)."""

COLLECTIVE_TIMEOUT_S = 120.0
"""Seconds a collective may wait for the other ranks (`--collective-timeout`); also how long
the launcher waits for every rank to join it."""

MEASUREMENT_TIMEOUT_S = 120.0
"""Seconds the worker processes of a collective measurement (`sextant calibrate`, the
interconnect check, an emulated link's fit) may take."""
