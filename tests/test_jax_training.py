"""Real JAX training in real worker processes, checked step by step against PyTorch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sextant.core.errors import RunFailed
from sextant.runner import execute
from sextant.strategy import Strategy
from tests.helpers import needs_torch, same_training, short

pytestmark = [
    needs_torch,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed"),
]

# fp32, 10 steps. JAX and PyTorch compute the same functions with different kernels (XLA vs
# oneDNN/ATen) and summation orders; observed differences are ~3e-7 relative for loss and
# gradient norm after 10 AdamW steps. 1e-5 leaves 30x margin and still fails on any real
# semantic difference (epsilon placement in Adam moves the loss by ~1e-4 within 10 steps,
# a summed instead of averaged gradient doubles the gradient norm).
STEPS = 10


def jax_strategy(parallel: str, workers: int = 2, devices: int = 1) -> Strategy:
    return Strategy(framework="jax", mode="compiled", parallel=parallel,
                    workers=1 if parallel == "single" else workers,
                    devices_per_worker=devices)


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    runs = tmp_path_factory.mktemp("torch-ref")
    return {name: execute(short(name, STEPS), Strategy(framework="torch"), runs_dir=runs)
            for name in ("gpt-tiny", "digits-mlp")}


@pytest.mark.parametrize(
    ("workload", "parallel"),
    [("gpt-tiny", "single"), ("gpt-tiny", "dp"), ("gpt-tiny", "dp-manual"),
     ("gpt-tiny", "fsdp"), ("digits-mlp", "single"), ("digits-mlp", "dp")],
)
def test_jax_matches_torch(tmp_path: Path, torch_reference: dict, workload: str,
                           parallel: str) -> None:
    pairs = 2 if parallel in ("dp", "dp-manual") else 0  # exposed communication, checked below
    rec = execute(short(workload, STEPS, nosync_steps=pairs), jax_strategy(parallel),
                  runs_dir=tmp_path)
    same_training(rec, torch_reference[workload])
    assert rec.fingerprint.values["framework"] == "jax"
    if parallel in ("dp", "dp-manual"):
        assert rec.metrics.exposed_comm_s is not None
    if parallel != "single":
        assert all(r.details["devices"] == 2 for r in rec.ranks)


def test_fsdp_shards_parameters_dp_replicates(tmp_path: Path) -> None:
    w = short("gpt-tiny", 3)
    dp = execute(w, jax_strategy("dp"), runs_dir=tmp_path)
    fsdp = execute(w, jax_strategy("fsdp"), runs_dir=tmp_path)
    same_training(fsdp, dp)
    full = dp.ranks[0].details["local_param_bytes"]
    assert full == 4 * dp.metrics.params
    # Every gpt-tiny parameter has an even axis, so each of 2 processes holds exactly half.
    assert fsdp.ranks[0].details["local_param_bytes"] == full // 2


def test_devices_inside_one_process(tmp_path: Path, torch_reference: dict) -> None:
    rec = execute(short("gpt-tiny", STEPS), jax_strategy("dp", workers=1, devices=2),
                  runs_dir=tmp_path)
    assert rec.ranks[0].details["devices"] == 2 and len(rec.ranks) == 1
    same_training(rec, torch_reference["gpt-tiny"])


def test_recompilation_after_warmup_fails_loudly(tmp_path: Path) -> None:
    w = short("gpt-tiny", 6, warmup_steps=2)
    with pytest.raises(RunFailed, match="recompiled after warm-up"):
        execute(w, jax_strategy("single"), runs_dir=tmp_path,
                extra_env={"SEXTANT_TEST_FAULT": "shape-change"})


HOST_DEVICE_STEPS = """
from sextant.backends.jax_backend import use_host_devices
use_host_devices(2)
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(jax.devices(), ("data",))
@jax.jit
def step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
w = jax.device_put(jnp.full((256, 256), 0.01), NamedSharding(mesh, P()))
x = jax.device_put(jnp.ones((512, 256)), NamedSharding(mesh, P("data")))
for _ in range(300):
    w = step(w, x)
w.block_until_ready()
print("done")
"""


def test_host_devices_never_starve_the_all_reduce() -> None:
    """Two host devices on one core: a data-parallel step (matmul, gradient mean) 300 times.
    With XLA's thread pool sized by the one core, the second device's program found no free
    thread at its all-reduce and XLA aborted the process after 40 s; use_host_devices sizes
    the pool at two threads per device."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "XLA_FLAGS")}
    one_core = {min(os.sched_getaffinity(0))}
    proc = subprocess.run([sys.executable, "-c", HOST_DEVICE_STEPS], env=env,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.sched_setaffinity(0, one_core))
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]
