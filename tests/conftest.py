"""Shared fixtures. Training tests use the real frameworks and real gloo process groups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "results" / "results.db"


@pytest.fixture(autouse=True, scope="session")
def _private_config_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Checkpoint keys (sextant.core.keys) go to a scratch config directory, never the user's;
    workers inherit it through the environment."""
    os.environ["SEXTANT_CONFIG_DIR"] = str(tmp_path_factory.mktemp("sextant-config"))


@pytest.fixture(autouse=True, scope="session")
def _environments_in_checkout() -> None:
    """Framework environments (sextant.core.envs) made by the tests are cached in the checkout,
    ignored by git, and reused by every later test run, unless SEXTANT_ENVS says otherwise."""
    os.environ.setdefault("SEXTANT_ENVS", str(Path(__file__).resolve().parents[1]
                                              / ".sextant-envs"))


@pytest.fixture(autouse=True, scope="session")
def _shared_torch_extensions(tmp_path_factory: pytest.TempPathFactory) -> None:
    """DeepSpeed's just-in-time ops (sextant.backends.deepspeed_backend.train) are built once
    per test session, not once per run directory (its default cache sits beside the runs)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                          str(tmp_path_factory.mktemp("torch-extensions")))
