"""Tensor and pipeline parallelism, and their 2-D layouts with data parallelism, train
exactly what one process trains: fp32 losses and global gradient norms within 1e-5 relative
over 10 steps of llama-tiny. Each check has a deliberately broken twin (a skipped
all-reduce, a mis-routed stage hand-off, summed instead of averaged gradients) that must
fail it, so the parity test can fail."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import PARITY_RTOL, loss_deviation, needs_torch, same_training, short

pytestmark = pytest.mark.slow
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="jax not installed")
STEPS = 10


def _run(strategy: Strategy, fault: str | None = None) -> dict:
    env = {"SEXTANT_TEST_FAULT": fault} if fault else None
    pairs = 2 if strategy.parallel in ("tp", "tp-manual") else 0  # their exposed communication
    return execute(short("llama-tiny", STEPS, nosync_steps=pairs), strategy,
                   runs_dir=Path(tempfile.mkdtemp()), extra_env=env)


@pytest.fixture(scope="module")
def single() -> dict:
    return _run(Strategy(framework="torch"))


def _broken(run: dict, single: dict) -> None:
    """The run did not train what one process trains: some step's loss or gradient norm is
    off by far more than the parity tolerance."""
    norms = np.max(np.abs(np.subtract(run.grad_norms, single.grad_norms))
                   / np.asarray(single.grad_norms))
    assert max(loss_deviation(run, single), norms) > 100 * PARITY_RTOL["fp32"]


@needs_torch
@pytest.mark.parametrize("fields", [
    dict(parallel="tp", workers=2, tp=2),
    dict(parallel="tp", workers=2, tp=2, sequence_parallel=True),
    dict(parallel="pp", workers=2, pp=2, microbatches=4),
    dict(parallel="pp", workers=2, pp=2, microbatches=4, schedule="1f1b"),
], ids=lambda f: Strategy(framework="torch", **f).label)
def test_torch_model_parallel_matches_single(fields: dict, single: dict) -> None:
    run = _run(Strategy(framework="torch", **fields))
    same_training(run, single)
    assert any(w in run.ranks[0].details["wrapping"] for w in ("tensor", "pipeline"))
    if fields["parallel"] == "tp":  # the same step without its collectives, alternated
        assert run.metrics.comm_pairs >= 1 and run.metrics.exposed_comm_s is not None
        assert run.ranks[0].details["tp_collectives_bytes_per_step"]
    else:
        assert all(r.details["pipeline"]["step_s"] > 0 for r in run.ranks)


@needs_torch
@pytest.mark.parametrize("fields", [
    dict(parallel="tp", workers=4, tp=2),
    dict(parallel="pp", workers=4, pp=2, microbatches=2),
], ids=["dp2 x tp2", "dp2 x pp2"])
def test_torch_2d_layouts_match_single(fields: dict, single: dict) -> None:
    """4 processes on 2 cores: slow (about 10 s each) but the only way to hold a 2-D mesh."""
    same_training(_run(Strategy(framework="torch", **fields)), single)


@needs_torch
@pytest.mark.parametrize("fields, fault", [
    (dict(parallel="tp", workers=2, tp=2), "skip-tp-allreduce"),
    (dict(parallel="pp", workers=2, pp=2, microbatches=2), "pp-misrouted-handoff"),
    (dict(parallel="tp", workers=4, tp=2), "sum-gradients"),
], ids=["tp without its all-reduce", "pp hand-off mis-routed", "dp x tp summing"])
def test_torch_broken_model_parallel_fails_parity(fields: dict, fault: str,
                                                  single: dict) -> None:
    _broken(_run(Strategy(framework="torch", **fields), fault), single)


@needs_torch
@needs_jax
@pytest.mark.parametrize("fields", [
    dict(parallel="tp", workers=1, devices_per_worker=2, tp=2),
    dict(parallel="tp-manual", workers=1, devices_per_worker=2, tp=2),
    dict(parallel="tp-manual", workers=2, tp=2),
    dict(parallel="tp", workers=1, devices_per_worker=4, tp=2),
    dict(parallel="tp-manual", workers=1, devices_per_worker=4, tp=2),
    dict(parallel="pp", workers=1, devices_per_worker=2, pp=2, microbatches=4),
    dict(parallel="pp", workers=2, pp=2, microbatches=4),
    dict(parallel="pp", workers=1, devices_per_worker=4, pp=2, microbatches=2),
], ids=lambda f: Strategy(framework="jax", mode="compiled", **f).label)
def test_jax_model_parallel_matches_single(fields: dict, single: dict) -> None:
    run = _run(Strategy(framework="jax", mode="compiled", **fields))
    same_training(run, single)
    hlo = run.ranks[0].details["hlo_collectives"]
    # XLA's (tp) or Megatron's (tp-manual) all-reduces; the pipeline's hand-offs.
    assert hlo and ("collective-permute" if fields["parallel"] == "pp" else "all-reduce") in hlo
    if fields["parallel"] == "tp-manual":  # timed against its own copy without collectives
        assert run.metrics.comm_pairs >= 1 and run.metrics.exposed_comm_s is not None


@needs_torch
@needs_jax
@pytest.mark.parametrize("fields, fault", [
    (dict(parallel="tp-manual", workers=1, devices_per_worker=2, tp=2), "skip-tp-allreduce"),
    (dict(parallel="tp-manual", workers=1, devices_per_worker=4, tp=2), "sum-gradients"),
    (dict(parallel="pp", workers=1, devices_per_worker=2, pp=2, microbatches=2),
     "pp-misrouted-handoff"),
], ids=["tp-manual without g's psum", "dp x tp-manual summing", "pp hand-off mis-routed"])
def test_jax_broken_tensor_parallel_fails_parity(fields: dict, fault: str,
                                                 single: dict) -> None:
    _broken(_run(Strategy(framework="jax", mode="compiled", **fields), fault), single)


@needs_torch
@needs_jax
def test_tied_embeddings_split_the_same_way() -> None:
    """A tied head is the embedding matrix: torch keeps it whole under tp (it cannot be split
    by rows for one use and by columns for the other), JAX splits it over the vocabulary for
    both; either way the training matches one process."""
    import dataclasses

    w = short("llama-tiny", STEPS)
    w = w.replace(model=dataclasses.replace(w.model, tie_embeddings=True))

    def run(**fields: object) -> dict:
        return execute(w, Strategy(**fields), runs_dir=Path(tempfile.mkdtemp()))

    one = run(framework="torch")
    same_training(run(framework="torch", parallel="tp", workers=2, tp=2), one)
    same_training(run(framework="jax", mode="compiled", parallel="tp-manual", workers=1,
                      devices_per_worker=2, tp=2), one)
