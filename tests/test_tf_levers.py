"""The distributed-training levers on TensorFlow, for real: gradient accumulation, bf16
compute, gradient compression, checkpoint/resume (docs/tensorflow.md, docs/levers.md).

Kept lean (one TF process costs ~5 s of import on a 2-core machine): the references are
shared module fixtures, most runs use TensorFlow's graph mode ('eager'; XLA compiles add
seconds per run) and each lever is pulled once per flavour it has. TF eager mode's parity
with torch (single and dp x2) is tests/test_tf_training.py::test_single_and_dp_match_torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sextant import checkpoint as ckpt
from sextant.backends.base import get_backend, require
from sextant.core.errors import UserError
from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import kill_then_resume, loss_deviation, needs_torch, same_training, short

needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                              reason="tensorflow not installed")
pytestmark = [needs_tf, needs_torch, pytest.mark.slow]
# fp32 parity at tests.helpers.PARITY_RTOL["fp32"] = 1e-5 (observed <= 1.1e-7 here)


def tf(parallel: str = "single", mode: str = "eager", **kw) -> Strategy:
    workers = kw.pop("workers", 1 if parallel == "single" else 2)
    return Strategy(framework="tensorflow", mode=mode, parallel=parallel, workers=workers, **kw)


def sha(record: dict) -> str:
    digest = record.ranks[0].final_params_sha256  # rank 0 exports the final parameters
    assert digest is not None
    return digest


def assert_quiet(record: dict) -> None:
    """No worker log lines, 16-bit runs included: TensorFlow's one-time ERROR-level notice
    that oneDNN has no 16-bit kernels on a CPU without AVX-512 is captured into the record."""
    logs = sorted(Path(record.run_dir).glob("rank*.std*.log"))
    assert logs and {log.name: log.read_text() for log in logs} == {log.name: "" for log in logs}
    for rank in record.ranks:
        assert all("oneDNN supports DT_" in n for n in rank.details["tensorflow_notices"])


# gpt-tiny, 8 steps, no exposed-communication pairs (they train on after the export of the
# final parameters, for timing only, and cost a run's time here).
W = short("gpt-tiny", 8, nosync_steps=0)


@pytest.fixture(scope="module")
def single_ref(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return execute(W, tf(), runs_dir=tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def dp_ref(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return execute(W, tf("dp"), runs_dir=tmp_path_factory.mktemp("dp"))


def test_capabilities_and_refusals() -> None:
    caps = get_backend("tensorflow").capabilities()
    assert caps.parallel == ("single", "dp", "ps")  # no ZeRO/FSDP in tf.distribute
    assert caps.precisions == ("fp32", "tf32", "bf16") and caps.grad_accum
    assert caps.compress == ("none", "bf16", "fp16")  # no PowerSGD in TensorFlow
    assert caps.checkpoint == ("single", "dp")
    require(tf("dp", compress="fp16", precision="bf16", grad_accum=2))
    require(tf("dp", workers=1, devices_per_worker=2, checkpoint_every=2, checkpoint_dir="/x"))
    with pytest.raises(UserError, match="does not support compression 'powersgd'; supported: "
                                        "none, bf16, fp16"):
        require(tf("dp", compress="powersgd"))
    with pytest.raises(UserError, match="does not support parallel 'fsdp'"):
        require(tf("fsdp"))
    with pytest.raises(UserError, match=r"parallel ps\) runs fp32 without levers; .*"
                                        r"Received: --precision bf16, --grad-accum 2"):
        require(tf("ps", ps=1, precision="bf16", grad_accum=2))
    with pytest.raises(UserError, match="cannot checkpoint parallel 'ps'; checkpointing works "
                                        "with: single, dp"):
        require(tf("ps", ps=1, resume=True, checkpoint_dir="/x"))


def test_grad_accumulation_equals_one_big_batch(tmp_path: Path, single_ref: dict,
                                                dp_ref: dict) -> None:
    # K micro-batches inside the traced step (XLA here), one all-reduce per update (dp).
    same_training(execute(W, tf(mode="compiled", grad_accum=4), runs_dir=tmp_path), single_ref)
    same_training(execute(W, tf("dp", grad_accum=2), runs_dir=tmp_path), dp_ref)


def test_compression_moves_the_loss_a_little(tmp_path: Path, dp_ref: dict) -> None:
    # MultiWorkerMirroredStrategy (ring over gRPC) and MirroredStrategy (in-process).
    for strategy in (tf("dp", compress="bf16"),
                     tf("dp", workers=1, devices_per_worker=2, compress="fp16")):
        rec = execute(W, strategy, runs_dir=tmp_path)
        assert 0 < loss_deviation(rec, dp_ref) < 1e-3, strategy.label
        assert rec.label.endswith(f"compress={strategy.compress}")
        assert_quiet(rec)
        planned = rec.ranks[0].comm["planned_bytes_per_step"]["all_reduce"]
        assert planned == pytest.approx(2 * rec.metrics.params)  # 2 bytes, ring 2(n-1)/n


def test_bf16_stays_close_to_fp32(tmp_path: Path) -> None:
    w = short("digits-mlp", 20, nosync_steps=0)
    fp32 = execute(w, tf(), runs_dir=tmp_path)
    # With XLA (single) and without (TF graph, dp x2).
    for strategy in (tf(mode="compiled", precision="bf16"), tf("dp", precision="bf16")):
        bf16 = execute(w, strategy, runs_dir=tmp_path)
        # bf16 keeps 8 mantissa bits; with fp32 master weights and an fp32 loss the loss
        # after 20 steps stays within 2% of fp32.
        assert 0 < loss_deviation(bf16, fp32) < 2e-2, strategy.label
        assert bf16.losses[-1] < bf16.losses[0]
        assert_quiet(bf16)


@pytest.mark.parametrize("parallel", ["single", "dp"])
def test_kill_and_resume_is_bit_identical(tmp_path: Path, single_ref: dict, dp_ref: dict,
                                          parallel: str) -> None:
    uninterrupted = single_ref if parallel == "single" else dp_ref
    resumed = kill_then_resume(W, lambda **kw: tf(parallel, **kw), tmp_path)
    # TensorFlow on CPU is deterministic here (fixed thread counts; XLA or TF graph), and the
    # checkpoint holds everything the step reads: parameters, Adam moments, update counter.
    np.testing.assert_array_equal(resumed.losses, uninterrupted.losses[3:])
    assert sha(resumed) == sha(uninterrupted)


def test_corrupt_checkpoint_is_refused_and_previous_used(tmp_path: Path, dp_ref: dict) -> None:
    # MirroredStrategy over two logical CPUs (one process): the run that saves is also the
    # uninterrupted reference.
    d = tmp_path / "ckpt"
    mirrored = tf("dp", workers=1, devices_per_worker=2, checkpoint_every=2, checkpoint_dir=str(d))
    saved = execute(W, mirrored, runs_dir=tmp_path)
    same_training(saved, dp_ref)  # two replicas in one process train what two processes do
    assert sorted(p.name for p in d.iterdir()) == [f"step-{s:08d}" for s in (2, 4, 6, 8)]
    data_file = next((d / "step-00000008").glob("ckpt.data-*"))
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])  # truncated
    (d / "step-00000006" / "manifest.json").unlink()  # a save that never finished
    (d / "step-00000010.partial").mkdir()  # a crash in the middle of a save
    assert "truncated" in (ckpt.verify(d / "step-00000008") or "")
    resumed = execute(W, replace(mirrored, checkpoint_every=0, resume=True), runs_dir=tmp_path)
    notes = resumed.ranks[0].details["notes"]
    assert notes[0].startswith("checkpoint step-00000008 refused: ") and "truncated" in notes[0]
    assert notes[1] == "checkpoint step-00000006 refused: no manifest (the save did not finish)"
    assert notes[2:] == ("resumed from step-00000004",)
    np.testing.assert_array_equal(resumed.losses, saved.losses[4:])
    assert sha(resumed) == sha(saved)
