"""Checkpoints are verified at the point of use: what a framework loads is the very bytes that
were hashed (a private copy), never a file re-opened by path after the check; symbolic links
and anything but regular files are refused; a rank that refuses the checkpoint the launching
process accepted stops the run. Real torch checkpoints (tests/test_reliability.py's
`saved`), real files, a real swapping thread."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
import time
from pathlib import Path

import pytest

from sextant import checkpoint as ckpt
from sextant.core.errors import RunFailed
from sextant.core.keys import checkpoint_key, sign
from sextant.runner import execute
from tests.helpers import needs_torch, short
from tests.test_reliability import (
    STEPS,
    TIMEOUT,
    WARMUP,
    copy_of,
    resume_cli,
    torch_single,
    write_workload,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """step-00000001 ... step-00000006 of one real torch run (checkpoint every step), of the
    workload `write_workload` writes."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("saved")
    execute(short("digits-mlp", STEPS, warmup_steps=WARMUP, nosync_steps=0),
            torch_single(checkpoint_every=1, checkpoint_dir=str(root / "ckpt")),
            runs_dir=root / "runs", timeout_s=TIMEOUT)
    return root / "ckpt"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # what a crafted pickle does when it is loaded
        return (os.system, (f"touch {self.marker}",))


def _crafted_metadata(victim: Path, marker: Path, *, resign: bool) -> None:
    """Replace `.metadata` with a code-running pickle; `resign`: recompute the manifest's
    checksums and signature as the user's own sextant would (what an attacker with the key
    could do, or a user who passes --trust-checkpoint sees)."""
    (victim / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    if resign:
        manifest = json.loads((victim / ckpt.MANIFEST).read_text())
        data = (victim / ".metadata").read_bytes()
        import hashlib

        manifest["files"][".metadata"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                          "bytes": len(data)}
        manifest.pop("hmac")
        manifest["hmac"] = sign(checkpoint_key(), manifest, field="hmac")
        (victim / ckpt.MANIFEST).write_text(json.dumps(manifest))


@needs_torch
def test_a_file_swapped_between_check_and_load_is_never_loaded(tmp_path: Path,
                                                               saved: Path) -> None:
    """TOCTOU: a thread swaps `.metadata` for a code-running pickle right after the parent's
    check. The rank's copy is hashed from the bytes it copies, so the swap is refused; a swap
    after the copy changes nothing that is loaded."""
    directory = copy_of(saved, tmp_path)
    victim = ckpt.step_dir(directory, STEPS)
    genuine = (victim / ".metadata").read_bytes()
    marker = tmp_path / "pwned"
    checked, swapped = threading.Event(), threading.Event()

    def swap() -> None:
        checked.wait(30)
        crafted = victim / ".metadata.new"
        payload = pickle.dumps(_Payload(marker))  # padded: the size matches, not the hash
        crafted.write_bytes(payload + b"." * (len(genuine) - len(payload)))
        os.replace(crafted, victim / ".metadata")
        swapped.set()

    thread = threading.Thread(target=swap)
    thread.start()
    assert ckpt.verify(victim) is None  # the parent's check
    checked.set()
    assert swapped.wait(30)
    thread.join()
    into = tmp_path / "copy"
    into.mkdir(mode=0o700)
    assert "does not match its checksum" in (ckpt.stage(victim, into) or "")

    # Swapped back, staged, then swapped again: the copy holds what was verified.
    (victim / ".metadata").write_bytes(genuine)
    shutil.rmtree(into)
    into.mkdir(mode=0o700)
    assert ckpt.stage(victim, into) is None
    (victim / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    assert (into / ".metadata").read_bytes() == genuine
    assert not marker.exists()


@needs_torch
def test_a_rank_that_refuses_the_accepted_checkpoint_stops_the_run(tmp_path: Path,
                                                                   saved: Path) -> None:
    """The parent accepts step 6; a thread corrupts it while the worker starts. The run
    fails with CheckpointChanged's message instead of training from step 0 with status ok."""
    directory = copy_of(saved, tmp_path)
    runs = tmp_path / "runs"
    done = threading.Event()

    def corrupt_once_launched() -> None:
        while not done.is_set():
            if list(runs.rglob("plan.json")):  # written before the workers start
                path = ckpt.step_dir(directory, STEPS) / "__0_0.distcp"
                data = bytearray(path.read_bytes())
                data[len(data) // 2] ^= 0xFF
                path.write_bytes(bytes(data))
                return
            time.sleep(0.005)

    thread = threading.Thread(target=corrupt_once_launched)
    thread.start()
    try:
        with pytest.raises(RunFailed, match="which the launching process accepted"):
            execute(short("digits-mlp", STEPS, warmup_steps=WARMUP, nosync_steps=0),
                    torch_single(resume=True, checkpoint_dir=str(directory)),
                    runs_dir=runs, timeout_s=TIMEOUT)
    finally:
        done.set()
        thread.join()


def test_symbolic_links_fifos_and_outside_files_are_refused(tmp_path: Path,
                                                            saved: Path) -> None:
    directory = copy_of(saved, tmp_path)
    step = ckpt.step_dir(directory, STEPS)
    outside = tmp_path / "outside.distcp"
    shutil.copy(step / "__0_0.distcp", outside)
    (step / "__0_0.distcp").unlink()
    (step / "__0_0.distcp").symlink_to(outside)  # same bytes, but not in the directory
    assert "__0_0.distcp is a symbolic link" in (ckpt.verify(step) or "")

    linked = ckpt.step_dir(directory, STEPS + 1)
    linked.symlink_to(ckpt.step_dir(directory, STEPS - 1))
    assert ckpt.verify(linked) == "the checkpoint directory is a symbolic link"
    assert ckpt.candidates(directory)[0] == linked  # listed, to be refused by name

    fifo_step = ckpt.step_dir(directory, STEPS - 2)
    os.mkfifo(fifo_step / "pipe")
    assert "pipe is not a regular file" in (ckpt.verify(fifo_step) or "")


def test_a_private_copy_is_private(tmp_path: Path, saved: Path) -> None:
    directory = copy_of(saved, tmp_path)
    step = ckpt.step_dir(directory, STEPS)
    into = tmp_path / "copy"
    into.mkdir(mode=0o700)
    assert ckpt.stage(step, into) is None
    names = sorted(p.name for p in into.iterdir())
    assert names == sorted(p.name for p in step.iterdir() if p.name != ckpt.MANIFEST)
    assert all(p.stat().st_mode & 0o077 == 0 for p in into.iterdir())


@needs_torch
def test_a_crafted_pickle_never_runs_even_when_trusted(tmp_path: Path, saved: Path) -> None:
    """--trust-checkpoint skips the signature, and torch's `.metadata` is still read with
    only checkpoint metadata allowed: the crafted pickle is refused, its code never runs."""
    directory = copy_of(saved, tmp_path)
    for step in range(1, STEPS):
        shutil.rmtree(ckpt.step_dir(directory, step))
    marker = tmp_path / "pwned"
    _crafted_metadata(ckpt.step_dir(directory, STEPS), marker, resign=True)
    proc = resume_cli(tmp_path, directory, write_workload(tmp_path), "--trust-checkpoint")
    assert proc.returncode != 0
    assert "not checkpoint metadata" in proc.stderr, proc.stderr[-2000:]
    assert not marker.exists()


@needs_torch
def test_the_run_says_which_checkpoint_it_resumes_from(tmp_path: Path, saved: Path) -> None:
    """docs/reliability.md: a tampered newest checkpoint is refused with a warning, the
    previous intact one is used, and the run names it."""
    directory = copy_of(saved, tmp_path)
    (ckpt.step_dir(directory, STEPS) / "extra.pkl").write_bytes(b"x")
    proc = resume_cli(tmp_path, directory, write_workload(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checkpoint step-00000006 refused: file extra.pkl is not in the manifest" in proc.stderr
    assert f"resuming from checkpoint step-{STEPS - 1:08d} in {directory}" in proc.stderr
