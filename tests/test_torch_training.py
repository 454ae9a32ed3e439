"""Real PyTorch training in real worker processes (gloo): parity, failures, measurements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sextant.core.errors import RunFailed
from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import (
    PARITY_RTOL,
    assert_summed_gradients_caught,
    needs_torch,
    same_training,
    short,
)

pytestmark = [needs_torch, pytest.mark.slow]


SINGLE = Strategy(framework="torch")
DP2 = Strategy(framework="torch", parallel="dp", workers=2)


def losses(record: dict) -> np.ndarray:
    return np.asarray(record.losses)


@pytest.mark.parametrize("workload", ["gpt-tiny", "digits-mlp"])
def test_single_and_dp_losses_agree(tmp_path: Path, workload: str) -> None:
    w = short(workload, 5)
    single = execute(w, SINGLE, runs_dir=tmp_path)
    dp = execute(w, DP2, runs_dir=tmp_path)
    assert len(single.losses) == 5
    same_training(dp, single)
    # It trained: the loss went down.
    assert single.losses[-1] < single.losses[0]


def test_parity_test_fails_when_gradients_are_summed(tmp_path: Path) -> None:
    """The deliberate bug (sum instead of average across ranks) must break parity."""
    w = short("gpt-tiny", 5)
    single = execute(w, SINGLE, runs_dir=tmp_path)
    broken = execute(w, DP2, runs_dir=tmp_path, extra_env={"SEXTANT_TEST_FAULT": "sum-gradients"})
    assert_summed_gradients_caught(broken, single)


def test_eager_and_compiled_agree(tmp_path: Path) -> None:
    w = short("gpt-tiny", 10)
    eager = execute(w, SINGLE, runs_dir=tmp_path)
    compiled = execute(w, Strategy(framework="torch", mode="compiled"), runs_dir=tmp_path)
    same_training(compiled, eager, PARITY_RTOL["fp32-compiled"])
    # The first compiled step includes compilation, reported apart from the steady state.
    assert compiled.metrics.first_step_s > compiled.metrics.step_time_median_s


def test_dp_measurements_are_complete(tmp_path: Path) -> None:
    w = short("gpt-tiny", 6, nosync_steps=4)
    rec = execute(w, DP2, runs_dir=tmp_path)
    m = rec.metrics
    assert m.steps_timed == 5
    assert m.step_time_p10_s <= m.step_time_median_s <= m.step_time_p90_s
    assert m.tokens_per_s == pytest.approx(16 * 64 / m.step_time_median_s)
    assert m.comm_pairs == 4 and m.exposed_comm_s is not None
    assert m.peak_rss_bytes > 50 * 2**20
    assert [r.rank for r in rec.ranks] == [0, 1]
    for r in rec.ranks:
        assert r.fingerprint["framework_version"].startswith("2.")
        assert r.fingerprint["threads"] >= 1
        assert r.details["collectives"] == "gloo"


def test_dead_worker_is_named(tmp_path: Path) -> None:
    w = short("gpt-tiny", 6)
    with pytest.raises(RunFailed, match=r"torch dp x2: rank 1 was killed by SIGKILL") as info:
        execute(w, DP2, runs_dir=tmp_path, extra_env={"SEXTANT_TEST_FAULT": "kill-rank-1"},
                timeout_s=180)
    assert info.value.run_dir is not None and info.value.run_dir.parent == tmp_path
    assert (info.value.run_dir / "rank1.events.jsonl").exists()


def test_hung_run_times_out(tmp_path: Path) -> None:
    # Rank 1 sleeps a minute inside its first step (its collective partner waits), so the run
    # cannot end on its own within the timeout, however fast the machine: the launcher's
    # timeout must fire and name the ranks still running.
    w = short("gpt-tiny", 6)
    with pytest.raises(RunFailed, match=r"timed out after 3 s; rank\(s\) .* still running"):
        execute(w, DP2, runs_dir=tmp_path, timeout_s=3,
                extra_env={"SEXTANT_TEST_FAULT": "slow-rank-1-60000"})
