"""An expert's JAX GPT training loop, sharing no code with sextant.

    python benchmarks/expert/jax_gpt.py [shape flags]

Pure functions of a parameter pytree: pre-LayerNorm blocks, fused qkv projection,
jax.nn.dot_product_attention (causal), GELU (tanh), learned positions, untied head.
optax.adamw (weight decay masked to the >= 2-D parameters, learning rate from a warm-up +
cosine schedule function of optax's step count) after optax.clip_by_global_norm(--clip);
the whole step (value_and_grad, update, apply) under one jax.jit with the parameters and
optimizer state donated. Batches: random byte tokens put on the device before the loop. Each
step is timed to block_until_ready.

--precision fp32 sets jax_default_matmul_precision to 'highest' (XLA's GPU default is TF32),
tf32 to 'tensorfloat32'; bf16 keeps fp32 parameters, feeds every matmul bf16 operands and
keeps layer norms and the loss in fp32. On a GPU in bf16 the attention is cuDNN's fused
kernel (jax.nn.dot_product_attention(implementation="cudnn")).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parse, report  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402


def init(a, key: jax.Array) -> dict:  # noqa: ANN001
    d, f = a.d_model, a.d_ff
    keys = iter(jax.random.split(key, 4 + 4 * a.n_layers))

    def normal(shape: tuple[int, ...], std: float = 0.02) -> jax.Array:
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    def ln() -> dict:
        return {"scale": jnp.ones((d,)), "bias": jnp.zeros((d,))}

    resid = 0.02 / math.sqrt(2 * a.n_layers)
    return {
        "wte": normal((a.vocab, d)), "wpe": normal((a.seq_len, d)),
        "blocks": [{
            "ln1": ln(), "ln2": ln(),
            "qkv": {"w": normal((d, 3 * d)), "b": jnp.zeros((3 * d,))},
            "proj": {"w": normal((d, d), resid), "b": jnp.zeros((d,))},
            "fc": {"w": normal((d, f)), "b": jnp.zeros((f,))},
            "fc_proj": {"w": normal((f, d), resid), "b": jnp.zeros((d,))},
        } for _ in range(a.n_layers)],
        "ln_f": ln(), "head": normal((d, a.vocab)),
    }


COMPUTE = jnp.float32
ATTENTION = None


def mm(x: jax.Array, w: jax.Array) -> jax.Array:
    return x.astype(COMPUTE) @ w.astype(COMPUTE)


def layer_norm(p: dict, x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def forward(n_heads: int, params: dict, idx: jax.Array) -> jax.Array:
    B, T = idx.shape
    x = params["wte"][idx] + params["wpe"][:T]
    C = x.shape[-1]
    for blk in params["blocks"]:
        h = mm(layer_norm(blk["ln1"], x), blk["qkv"]["w"]) + blk["qkv"]["b"].astype(COMPUTE)
        q, k, v = (t.reshape(B, T, n_heads, C // n_heads) for t in jnp.split(h, 3, axis=-1))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                         implementation=ATTENTION).reshape(B, T, C)
        x = x + mm(y, blk["proj"]["w"]) + blk["proj"]["b"].astype(COMPUTE)
        h = jax.nn.gelu(mm(layer_norm(blk["ln2"], x), blk["fc"]["w"])
                        + blk["fc"]["b"].astype(COMPUTE), approximate=True)
        x = x + mm(h, blk["fc_proj"]["w"]) + blk["fc_proj"]["b"].astype(COMPUTE)
    return mm(layer_norm(params["ln_f"], x), params["head"]).astype(jnp.float32)


def main() -> None:
    global COMPUTE, ATTENTION
    a = parse(__doc__.splitlines()[0])
    jax.config.update("jax_default_matmul_precision",
                      "tensorfloat32" if a.precision == "tf32" else "highest")
    device = jax.devices("gpu" if a.device == "gpu" else "cpu")[0]
    jax.config.update("jax_default_device", device)
    if a.precision == "bf16":
        COMPUTE = jnp.bfloat16
        ATTENTION = "cudnn" if a.device == "gpu" else None
    params = init(a, jax.random.PRNGKey(a.seed))
    n_params = sum(p.size for p in jax.tree.leaves(params))

    def schedule(count: jax.Array) -> jax.Array:
        k = count.astype(jnp.float32)
        warm = a.lr * (k + 1) / a.lr_warmup
        progress = jnp.minimum(1.0, (k - a.lr_warmup) / max(1, a.steps - a.lr_warmup - 1))
        cos = a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * progress)))
        return jnp.where(k < a.lr_warmup, warm, cos)

    tx = optax.adamw(schedule, b1=a.beta1, b2=a.beta2, eps=a.eps, weight_decay=a.weight_decay,
                     mask=jax.tree.map(lambda p: p.ndim >= 2, params))
    if a.clip:
        tx = optax.chain(optax.clip_by_global_norm(a.clip), tx)
    opt_state = tx.init(params)

    def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = forward(a.n_heads, params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params: dict, opt_state, x: jax.Array, y: jax.Array):  # noqa: ANN001, ANN202
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(a.seed + 1)
    data = rng.integers(0, a.vocab, (a.steps, a.batch, a.seq_len + 1), dtype=np.int32)
    batches = [(jax.device_put(d[:, :-1]), jax.device_put(d[:, 1:])) for d in data]

    times, losses, ends = [], [], []
    for x, y in batches:
        t0 = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state, x, y)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
        ends.append(time.time())  # wall clock, to align with a run beside it (--concurrent)
        losses.append(loss)
    stats = device.memory_stats() if a.device == "gpu" else None
    report(a, "jax", n_params, times, [float(v) for v in losses], mode="jit",
           step_end_unix=ends, precision=a.precision, device=a.device,
           attention=ATTENTION or "xla",
           device_peak_bytes=stats.get("peak_bytes_in_use") if stats else None)


if __name__ == "__main__":
    main()
