"""Shared fixtures. Training tests use the real frameworks and real gloo process groups."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "results" / "results.db"
