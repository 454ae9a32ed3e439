"""Live monitoring of runs: per-step metrics files, TensorBoard scalars, GPU and memory probes.

Light on purpose (stdlib only): the measuring process imports it, and it must never import an
ML framework.
"""

import argparse
from pathlib import Path

from sextant.monitor.metrics import (
    METRICS_FILE,
    METRICS_SCHEMA,
    MetricsSchemaError,
    read_metrics,
    steps_by_rank,
    validate_record,
    write_metrics,
)

__all__ = ["METRICS_FILE", "METRICS_SCHEMA", "MetricsSchemaError", "add_monitor_args",
           "read_metrics", "steps_by_rank", "validate_record", "write_metrics"]


def add_monitor_args(p: argparse.ArgumentParser) -> None:
    """`--tensorboard DIR` for `sextant run` and `sextant compare` (pass args.tensorboard to
    RunProgress)."""
    p.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                   help="also write every run's per-step scalars as TensorBoard event files "
                        "under DIR/<run> (view with: pip install tensorboard; "
                        "tensorboard --logdir DIR)")
