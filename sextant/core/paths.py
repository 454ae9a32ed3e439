"""Where sextant keeps what it writes: one results folder per project directory.

    sextant-results/
        results.db          the runs (sextant.results.store); --db or $SEXTANT_RESULTS moves it
        calibration.json    this machine's calibration (`sextant calibrate`), beside the database
        runs/<run>/         each run's logs, events, checkpoints and exports, beside the database

Everything that names one of these paths takes it from here. Imports nothing of sextant.
"""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "SEXTANT_RESULTS"
"""Environment variable that names the results database when --db does not."""
RESULTS_DIR = Path("sextant-results")
DB_NAME = "results.db"
CALIBRATION_NAME = "calibration.json"
RUNS_NAME = "runs"

DEFAULT_DB = RESULTS_DIR / DB_NAME
DEFAULT_CALIBRATION = RESULTS_DIR / CALIBRATION_NAME
DEFAULT_RUNS = RESULTS_DIR / RUNS_NAME


def default_db() -> Path:
    """The results database when no --db is given: $SEXTANT_RESULTS, else ./sextant-results/."""
    return Path(os.environ.get(RESULTS_ENV) or DEFAULT_DB)


def runs_beside(db: str | Path) -> Path:
    """The run directories' parent for the database at `db`."""
    return Path(db).parent / RUNS_NAME


def calibration_in(results_dir: str | Path) -> Path:
    """The calibration file of the results folder `results_dir`."""
    return Path(results_dir) / CALIBRATION_NAME
