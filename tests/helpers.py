"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sextant.results.record import RunRecord
from sextant.workloads.spec import Workload
from sextant.sources import resolve_workload

REPO = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def short(name: str, steps: int, **measure: int) -> Workload:
    """A bundled workload cut to `steps` steps with light measurement settings. No
    exposed-communication pairs unless a test asks for them (nosync_steps=2): in JAX and
    TensorFlow they compile a second step, 6 s of a 20 s data-parallel run on two cores, and
    they run after the timed steps, so they change no loss or gradient norm."""
    w = resolve_workload(name)
    m = w.measure.__class__(**{"warmup_steps": 1, "nosync_steps": 0, "log_every": 2, **measure})
    return w.replace(steps=steps, measure=m)


TINY_GPT_TOML = """
name = "{name}"
seed = 0
steps = {steps}
global_batch = 8
[model]
family = "gpt"
vocab_size = 256
seq_len = 32
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
[data]
dataset = "python-reference"
[optimizer]
name = "adamw"
lr = 3e-3
[measure]
warmup_steps = 1
nosync_steps = 2
log_every = 2
"""


def tiny_gpt_file(path: Path, name: str, steps: int) -> Path:
    """A one-layer GPT workload file at `path`, small enough for multi-process tests of the
    launchers and the collector (a workload given by file, as a user's would be)."""
    path.write_text(TINY_GPT_TOML.format(name=name, steps=steps))
    return path


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a fresh interpreter.

    `prelude` is Python executed first (used to hide an installed framework)."""
    code = f"{prelude}\nimport sys\nfrom sextant.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def ensure_environment(name: str) -> None:
    """Make the framework environment `name` (sextant.core.envs) unless it is ready: the first
    test run pays its creation (minutes), later ones reuse it (see conftest's SEXTANT_ENVS)."""
    from sextant.core import envs

    if envs.load(name) is None:
        envs.create(name, quiet=True, say=lambda line: None)


# --- comparing run records -------------------------------------------------------------------

PARITY_RTOL: dict[str, float] = {
    "fp32": 1e-5,
    "fp32-compiled": 1e-4,
    "fp32-mlx": 2e-5,
    "fp32-torch-cpu-norm": 5e-4,
}
"""Relative tolerance of loss and gradient-norm parity, by what differs between two fp32 runs
(docs/methodology.md): the one table of the tests. Each is what the tests observed with
margin, and each still fails a summed-instead-of-averaged gradient (the norm doubles):

- "fp32": the same arithmetic in another order or another framework's kernels (single vs
  dp, a lever that must not change training, JAX/TensorFlow/Keras/Paddle/MindSpore vs
  PyTorch): observed <= 7e-7 over 10 steps.
- "fp32-compiled": torch eager vs torch.compile (inductor fuses kernels and reorders
  reductions): ~1e-6 after 10 Adam steps; a wrong gradient scale moves the loss by > 1e-2.
- "fp32-mlx": MLX vs PyTorch: <= 5.6e-6 on the gradient norm over 10 steps (MLX keeps the
  schedule's learning rate and the bias corrections in float32).
- "fp32-torch-cpu-norm": gradient norms only, against torch on CPU for a large head: torch's
  float32 norm of a 2M-element gradient (torch.nn.utils.get_total_norm) is 5e-5 off the
  float64 one (1.9e-4 after six Adam steps); JAX's and TensorFlow's are within 1e-7.
"""


def same_training(a: RunRecord, b: RunRecord, rtol: float = PARITY_RTOL["fp32"], *,
                  norm_rtol: float | None = None, b_from: int = 0) -> None:
    """Two runs trained the same thing: losses and global gradient norms agree at every step
    (the norm catches a summed-instead-of-averaged gradient, which Adam hides in the loss).
    `norm_rtol`: the norms' own tolerance, where one side computes its norm more coarsely.
    `b_from`: a's first step is b's step `b_from` (a run resumed there, b uninterrupted)."""
    import numpy as np

    np.testing.assert_allclose(a.losses, b.losses[b_from:], rtol=rtol, atol=0)
    np.testing.assert_allclose(a.grad_norms, b.grad_norms[b_from:],
                               rtol=rtol if norm_rtol is None else norm_rtol, atol=0)


def assert_summed_gradients_caught(broken: RunRecord, reference: RunRecord,
                                   rtol: float = PARITY_RTOL["fp32"]) -> None:
    """The parity check catches a two-rank run whose all-reduce sums instead of averaging
    (SEXTANT_TEST_FAULT=sum-gradients): same_training fails, and the first step's gradient
    norm, taken before any update, is twice the reference's. Adam divides by the root of the
    second moment, so the scale barely moves the loss curve: the norm is what sees it."""
    import numpy as np

    with pytest.raises(AssertionError):
        same_training(broken, reference, rtol)
    np.testing.assert_allclose(broken.grad_norms[0], 2 * reference.grad_norms[0], rtol=rtol)


def loss_deviation(a: RunRecord, b: RunRecord) -> float:
    """Largest relative difference of a's losses from b's."""
    import numpy as np

    return float(np.max(np.abs(np.subtract(a.losses, b.losses)) / np.asarray(b.losses)))


def kill_then_resume(workload: Workload, make: object, tmp_path: Path) -> RunRecord:
    """Run `make(checkpoint_every=3, ...)` until rank 0 SIGKILLs itself after step 5, check
    that only the step-3 checkpoint was sealed, resume from it and return the resumed run."""
    from sextant.core.errors import RunFailed
    from sextant.runner import execute

    d = str(tmp_path / "ckpt")
    with pytest.raises(RunFailed, match="SIGKILL"):
        execute(workload, make(checkpoint_every=3, checkpoint_dir=d), runs_dir=tmp_path / "b",
                extra_env={"SEXTANT_TEST_FAULT": "kill-rank-0-at-5"})
    assert [p.name for p in sorted(Path(d).iterdir())] == ["step-00000003"]
    resumed = execute(workload, make(checkpoint_every=3, checkpoint_dir=d, resume=True),
                      runs_dir=tmp_path / "c")
    assert resumed.ranks[0].details["notes"] == ("resumed from step-00000003",)
    assert resumed.metrics.resumed_from_step == 3
    return resumed
