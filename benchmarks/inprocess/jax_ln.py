"""Kept as run for docs/benchmarks.md (issue #20); see README.md here.

sextant's JAX step with its layer norm as shipped, with the variance's gradient path through
the mean stopped, and the expert's step; one process, alternating 10-step blocks:
python benchmarks/inprocess/jax_ln.py WORKLOAD ROUNDS"""
# ruff: noqa: E401, E402, E501, E701, E702, E731, F401, I001
import sys, argparse
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
from alternate import alternate, report
import jax, jax.numpy as jnp, optax
from sextant.workload import resolve_workload
from sextant import data
from sextant.init import init_params, decays
from sextant.schedule import lr_table
from sextant.backends.jax_backend import model as jm
import jax_gpt as eg
w = resolve_workload(sys.argv[1]); rounds = int(sys.argv[2]); m = w.model; o = w.optimizer
a = argparse.Namespace(vocab=m.vocab_size, seq_len=m.seq_len, d_model=m.d_model, n_heads=m.n_heads, n_layers=m.n_layers, d_ff=m.d_ff, seed=0)
p0 = init_params(m, 0); lrs = jnp.asarray(lr_table(o, 10_000))
tx = optax.adamw(lambda c: lrs[jnp.minimum(c, 9_999)], b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay, mask={k: decays(k, v.shape) for k, v in p0.items()})

def ln_sg(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - jax.lax.stop_gradient(mean)).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + jm.LAYER_NORM_EPS) * scale + bias

def sx(ln=None):
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jm.loss_fn(m, p, x, y))(params)
        norm = optax.global_norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jnp.stack([loss, norm])
    f = jax.jit(step, donate_argnums=(0, 1))
    state = [{k: jnp.asarray(v) for k, v in p0.items()}]; state.append(tx.init(state[0]))
    orig = jm._layer_norm
    if ln is not None: jm._layer_norm = ln
    try:
        f = f.lower(state[0], state[1], x, y).compile()  # traced with the variant
    finally:
        jm._layer_norm = orig
    def run():
        state[0], state[1], out = f(state[0], state[1], x, y); out.block_until_ready()
    return run

def ex():
    ep = eg.init(a, jax.random.PRNGKey(0))
    etx = optax.adamw(3e-3, b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay, mask=jax.tree.map(lambda p: p.ndim >= 2, ep))
    state = [ep, etx.init(ep)]
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(eg.forward(a.n_heads, p, x), y).mean())(params)
        u, opt_state = etx.update(grads, opt_state, params)
        return optax.apply_updates(params, u), opt_state, loss
    f = jax.jit(step, donate_argnums=(0, 1))
    def run():
        state[0], state[1], out = f(state[0], state[1], x, y); out.block_until_ready()
    return run

xs, ys = data.global_batch(w, 0); x, y = jax.device_put(xs), jax.device_put(ys)
variants = {"sextant": sx(), "sextant, ln stop_gradient": sx(ln_sg), "expert": ex()}
report(alternate(variants, rounds), "expert")
