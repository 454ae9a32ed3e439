"""Pipeline parallelism the way JAX experts write it: one SPMD program over a 'stage' mesh
axis (jax.shard_map), the blocks' parameters stacked and sharded by stage, activations
handed to the next stage with lax.ppermute, micro-batches fed one per tick.

Schedule: GPipe. With p stages and m micro-batches the forward runs m + p - 1 ticks; at tick t
stage 0 embeds micro-batch t, every stage runs its blocks on what it holds, the last stage
keeps its output for micro-batch t - (p - 1), and everything moves one stage on. The backward
is JAX's transpose of that program (ppermute's transpose sends the gradients back), so every
forward completes before the first backward, as in GPipe. In the p - 1 bubble ticks a stage
computes on zeros (SPMD: every device runs every tick); that is the bubble, spent as wasted
compute rather than idle time.

The embedding, final norm and head are replicated; only stage 0's embedding and the last
stage's head feed the result (`where` on the stage index), so their gradients come from
those stages alone. Loss: the last stage's mean over its micro-batches, summed over the
stage axis (the other stages contribute zero) and averaged over 'data'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sextant.workloads.init import decays, param_shapes
from sextant.workloads.spec import LlamaSpec

STACK = "stages."
"""Prefix of a stacked block parameter: `stages.attn.q.weight` holds every block's
`blocks.{i}.attn.q.weight`, shape (pp, layers / pp, *shape)."""


def _block_names(spec: LlamaSpec) -> list[str]:
    return [k[len("blocks.0."):] for k in param_shapes(spec) if k.startswith("blocks.0.")]


def stack(params: dict[str, np.ndarray], spec: LlamaSpec, pp: int) -> dict[str, np.ndarray]:
    """Canonical parameters -> the pipeline's layout (blocks stacked by stage)."""
    per = spec.n_layers // pp
    out = {k: v for k, v in params.items() if not k.startswith("blocks.")}
    for name in _block_names(spec):
        layers = np.stack([params[f"blocks.{i}.{name}"] for i in range(spec.n_layers)])
        out[STACK + name] = layers.reshape(pp, per, *layers.shape[1:])
    return out


def unstack(params: dict[str, np.ndarray], spec: LlamaSpec) -> dict[str, np.ndarray]:
    """The pipeline's layout -> canonical parameters, in canonical order."""
    flat: dict[str, np.ndarray] = {}
    for name in _block_names(spec):
        layers = np.asarray(params[STACK + name])
        layers = layers.reshape(-1, *layers.shape[2:])
        for i in range(spec.n_layers):
            flat[f"blocks.{i}.{name}"] = layers[i]
    return {k: (flat[k] if k in flat else np.asarray(params[k])) for k in param_shapes(spec)}


def spec_of(name: str) -> Any:
    from jax.sharding import PartitionSpec as P

    return P("stage") if name.startswith(STACK) else P()


def decay_mask(params: dict[str, Any], spec: LlamaSpec) -> dict[str, bool]:
    """Weight decay by the canonical shape of what a stacked array holds."""
    shapes = param_shapes(spec)
    return {k: decays(k, shapes[f"blocks.0.{k[len(STACK):]}" if k.startswith(STACK) else k])
            for k in params}


def make_loss(spec: LlamaSpec, mesh: Any, pp: int, microbatches: int,
              fault: str | None = None) -> Any:
    """loss(params, x, y) over the ('data', 'stage') mesh (see the module docstring).
    SEXTANT_TEST_FAULT=pp-misrouted-handoff sends each hand-off to the wrong stage order
    (a reversed ring), which the parity tests must catch."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from sextant.backends.jax_backend.model import llama_block, rms_norm
    from sextant.workloads.init import rope_tables

    m, per = microbatches, spec.n_layers // pp
    forward = [(i, i + 1) for i in range(pp - 1)]
    if fault and "pp-misrouted-handoff" in fault.split(","):
        forward = [(i, (i + 2) % pp) for i in range(pp)] if pp > 2 else [(0, 0), (1, 1)]

    def stage_program(stacked: Any, rest: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        s = jax.lax.axis_index("stage")
        T = x.shape[1]
        cos, sin = (jnp.asarray(t[:T, None, :]) for t in rope_tables(spec))
        local = {k[len(STACK):]: v[0] for k, v in stacked.items()}  # (layers / pp, ...)
        xm, ym = x.reshape(m, -1, T), y.reshape(m, -1, T)
        state = jnp.zeros((xm.shape[1], T, spec.d_model), rest["wte"].dtype)
        outs = jnp.zeros((m, *state.shape), state.dtype)
        for t in range(m + pp - 1):
            h = jnp.where(s == 0, rest["wte"][xm[min(t, m - 1)]], state)
            for j in range(per):
                h = llama_block(spec, {k: v[j] for k, v in local.items()}, h, cos, sin)
            if 0 <= t - (pp - 1) < m:
                outs = outs.at[t - (pp - 1)].set(jnp.where(s == pp - 1, h, outs[t - (pp - 1)]))
            state = jax.lax.ppermute(h, "stage", forward)
        h = rms_norm(outs, rest["norm_f.scale"], spec.norm_eps)
        head = rest["wte"].T if spec.tie_embeddings else rest["head.weight"]
        logits = (h @ head).reshape(-1, spec.vocab_size).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, ym.reshape(-1, 1), axis=-1)[:, 0]
        loss = jnp.where(s == pp - 1, jnp.mean(jax.nn.logsumexp(logits, -1) - picked), 0.0)
        return jax.lax.pmean(jax.lax.psum(loss, "stage"), "data")

    def loss(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
        stacked = {k: v for k, v in params.items() if k.startswith(STACK)}
        rest = {k: v for k, v in params.items() if not k.startswith(STACK)}
        return jax.shard_map(
            stage_program, mesh=mesh,
            in_specs=({k: P("stage") for k in stacked}, {k: P() for k in rest},
                      P("data"), P("data")),
            out_specs=P())(stacked, rest, x, y)

    return loss
