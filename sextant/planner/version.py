"""Which planner made a figure: its version and the hash of the catalogue it read.

A run record stores both next to the planner-derived figures it keeps (MFU against a
catalogue peak, the planner's predicted step); the report marks a figure stale when either
differs from the planner now installed, instead of showing an old opinion as today's.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

PLANNER_VERSION = "2026.12.5.1"
"""Raised with every change to what the planner predicts (its terms, conventions, profiles
or defaults); CHANGELOG.md says what changed."""

CATALOGUE = Path(__file__).with_name("catalogue.toml")


@cache
def catalogue_hash() -> str:
    """SHA-256 of the bundled catalogue (its first 16 hex digits)."""
    return hashlib.sha256(CATALOGUE.read_bytes()).hexdigest()[:16]


def is_current(planner_version: str | None, catalogue: str | None) -> bool:
    """Whether a stored figure was made by this planner on this catalogue."""
    return planner_version == PLANNER_VERSION and catalogue == catalogue_hash()
