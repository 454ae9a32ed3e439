"""Versioned opinions: a run keeps the planner version and catalogue hash beside the figures
the planner made, and the report marks those of another planner stale."""

from __future__ import annotations

import hashlib

from sextant.planner.version import CATALOGUE, PLANNER_VERSION, catalogue_hash, is_current
from sextant.report.model import _planner_stale, accelerator_cells
from sextant.results.record import Metrics


def test_the_catalogue_hash_is_the_bundled_files():
    assert catalogue_hash() == hashlib.sha256(CATALOGUE.read_bytes()).hexdigest()[:16]
    assert is_current(PLANNER_VERSION, catalogue_hash())
    assert not is_current(PLANNER_VERSION, "0" * 16)
    assert not is_current("2000.1.1", catalogue_hash())
    assert not is_current(None, None)


def test_a_record_keeps_the_stamp_and_an_old_one_reads_without_it():
    now = Metrics(mfu=0.4, planner_step_s=0.1, planner_error=0.05,
                  planner_version=PLANNER_VERSION, catalogue_hash=catalogue_hash())
    again = Metrics.from_dict(now.to_dict())
    assert again == now and not _planner_stale(again)
    old = Metrics.from_dict({k: v for k, v in now.to_dict().items()
                             if k not in ("planner_version", "catalogue_hash")})
    assert old.planner_version is None and _planner_stale(old)
    moved = Metrics.from_dict({**now.to_dict(), "planner_version": "2000.1.1"})
    assert _planner_stale(moved)
    assert not _planner_stale(Metrics(step_time_median_s=0.1))  # no planner figure at all


def test_the_report_marks_stale_planner_figures():
    fresh = accelerator_cells(0.4, 1e9, 0.1, 0.05)
    stale = accelerator_cells(0.4, 1e9, 0.1, 0.05, stale=True)
    assert "stale" not in " ".join(fresh)
    assert stale[0].endswith("(stale planner)") and stale[2].endswith("(stale planner)")
    assert accelerator_cells(None, None, None, None, stale=True)[::2] == ["-", "-"]
