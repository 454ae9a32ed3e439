"""sextant.measure.pipeline_schedule: DeepSpeed's TrainSchedule replayed with blocking sends."""

from __future__ import annotations

import pytest

from sextant.measure import pipeline_schedule


def _schedule():
    return pipeline_schedule


@pytest.mark.parametrize("stages, micro_batches", [(1, 4), (2, 2), (4, 8), (35, 240), (7, 3)])
def test_with_instant_sends_the_fill_and_drain_is_one_f_one_b_s_bubble(stages, micro_batches):
    sim = _schedule()
    step = sim.simulate(stages, micro_batches, forward=1.0, backward=3.0)
    assert step == pytest.approx(4.0 * (micro_batches + stages - 1))


def test_every_micro_batch_runs_once_forward_and_once_backward_per_stage():
    sim = _schedule()
    for stage in range(5):
        ops = sim.stage_program(stage, 5, 7)
        assert sorted(j for op, j in ops if op == "F") == list(range(7))
        assert sorted(j for op, j in ops if op == "B") == list(range(7))
        kinds = {op for op, _ in ops}
        # The first stage has no one to receive from, the last no one to send on to.
        assert ("recv_act" in kinds) == (stage > 0) == ("send_grad" in kinds)
        assert ("send_act" in kinds) == (stage < 4) == ("recv_grad" in kinds)


def test_blocking_sends_slow_every_micro_batch():
    sim = _schedule()
    free = sim.simulate(8, 32, 1.0, 3.0)
    slow = sim.simulate(8, 32, 1.0, 3.0, send_activation=0.1, send_gradient=0.1)
    assert slow > free + 32 * 0.1
