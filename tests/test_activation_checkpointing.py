"""The activation-checkpointing lever (Strategy.activation_checkpointing).

Recomputing a block in backward changes what is kept, not what is computed: in fp32 the
losses and global gradient norms equal the run without it (tests.helpers.PARITY_RTOL["fp32"]). The
in-process tests prove the lever is really applied (a flag the backend ignored would pass
the parity test too).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sextant.backends import require
from sextant.core.errors import UserError
from sextant.strategy import Strategy
from tests.helpers import needs_torch, same_training, short

HAS_JAX = importlib.util.find_spec("jax") is not None
needs_jax = pytest.mark.skipif(not HAS_JAX, reason="jax not installed")


def test_tensorflow_refuses_in_one_line() -> None:
    with pytest.raises(UserError) as info:
        require(Strategy(framework="tensorflow", activation_checkpointing=True))
    message = str(info.value)
    assert message == ("tensorflow does not support --activation-checkpointing; "
                       "supported by: torch, jax")


def test_strategy_field_is_validated_and_labelled() -> None:
    with pytest.raises(UserError, match="activation_checkpointing must be true or false"):
        Strategy(framework="torch", activation_checkpointing=1)  # type: ignore[arg-type]
    on = Strategy(framework="torch", parallel="fsdp", workers=2, activation_checkpointing=True)
    assert on.label == "torch fsdp x2 act-ckpt"
    # Records stored before the field existed still load (default off).
    raw = on.to_dict()
    del raw["activation_checkpointing"]
    assert Strategy.from_dict(raw).activation_checkpointing is False


@needs_torch
def test_torch_recomputes_every_block_in_backward() -> None:
    import torch

    from sextant.backends.torch_backend import model as tm
    from sextant.backends.torch_backend.train import _apply_activation_checkpointing
    from sextant.workloads.init import init_params

    spec = short("gpt-tiny", 2).model
    net = tm.build(spec)
    tm.load_canonical(net, init_params(spec, 0))
    calls = {"n": 0}
    for block in net.blocks:  # a submodule's hook fires on every forward, recomputed or not
        block.ln1.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    x = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    y = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    loss = tm.WithLoss(net)(x, y)
    loss.backward()
    plain = calls["n"]
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    _apply_activation_checkpointing(net)
    calls["n"] = 0
    recomputed_loss = tm.WithLoss(net)(x, y)
    recomputed_loss.backward()
    assert plain == spec.n_layers and calls["n"] == 2 * spec.n_layers
    assert torch.equal(loss, recomputed_loss)
    for a, p in zip(grads, net.parameters()):
        torch.testing.assert_close(p.grad, a, rtol=1e-6, atol=0)
    # Parameter names are unchanged: the canonical mapping and checkpoints still apply.
    assert set(dict(net.named_parameters())) == set(tm.canonical_names(net, init_params(spec, 0)))


@needs_jax
def test_jax_puts_each_block_under_checkpoint() -> None:
    import jax

    from sextant.backends.jax_backend.model import loss_fn
    from sextant.workloads.init import init_params

    spec = short("gpt-tiny", 2).model
    params = init_params(spec, 0)
    x = jax.numpy.zeros((2, spec.seq_len), jax.numpy.int32)

    def remat_calls(remat: bool) -> int:
        jaxpr = jax.make_jaxpr(jax.grad(lambda p: loss_fn(spec, p, x, x, remat)))(params)
        return str(jaxpr).count("checkpoint[") + str(jaxpr).count("remat2[")

    assert remat_calls(False) == 0
    assert remat_calls(True) >= spec.n_layers


@pytest.mark.slow
@needs_torch
def test_fp32_losses_and_grad_norms_unchanged(tmp_path: Path) -> None:
    """torch single without the lever is the reference; with it: torch single, torch FSDP
    (per-block sharding around the recomputed blocks) and JAX."""
    from sextant.runner import execute

    w = short("gpt-tiny", 4, nosync_steps=0)
    reference = execute(w, Strategy(framework="torch"), runs_dir=tmp_path)
    cells = [Strategy(framework="torch", activation_checkpointing=True),
             Strategy(framework="torch", parallel="fsdp", workers=2,
                      activation_checkpointing=True)]
    if HAS_JAX:
        cells.append(Strategy(framework="jax", mode="compiled", parallel="fsdp", workers=1,
                              devices_per_worker=2, activation_checkpointing=True))
    for strategy in cells:
        record = execute(w, strategy, runs_dir=tmp_path)
        same_training(record, reference)
        details = record.ranks[0].details
        # The run says what it did (torch: the wrapping list; jax: its own entry).
        said = f"{details.get('wrapping')} {details.get('activation_checkpointing')}"
        assert "checkpoint" in said, said


@pytest.mark.slow
@needs_torch
def test_model_without_blocks_is_refused(tmp_path: Path) -> None:
    from sextant.core.errors import RunFailed
    from sextant.runner import execute

    with pytest.raises(RunFailed, match="recomputes transformer blocks; this model"):
        execute(short("digits-mlp", 2), Strategy(framework="torch",
                                                 activation_checkpointing=True),
                runs_dir=tmp_path)
