"""Kept as run for docs/benchmarks.md (issue #20); see README.md here."""
# ruff: noqa: E401, E402, E501, E701, E702, E731, F401, I001
import sys
import time
import statistics
import argparse
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
import jax
import jax.numpy as jnp
import optax
from sextant.workload import resolve_workload
from sextant import data
from sextant.init import init_params, decays
from sextant.schedule import lr_table
from sextant.backends.jax_backend.model import loss_fn
import jax_gpt as eg
w = resolve_workload(sys.argv[1])
m = w.model
a = argparse.Namespace(vocab=256, seq_len=m.seq_len, d_model=m.d_model, n_heads=m.n_heads, n_layers=m.n_layers, d_ff=m.d_ff, seed=0)
o = w.optimizer
# sextant's step, as in jax_backend/train.py (single)
p0 = init_params(m, 0); lrs = jnp.asarray(lr_table(o, w.steps)); last = w.steps - 1
tx = optax.adamw(lambda c: lrs[jnp.minimum(c, last)], b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay, mask={k: decays(k, v.shape) for k, v in p0.items()})
def sx_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(m, p, x, y))(params)
    norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jnp.stack([loss, norm])
sx = jax.jit(sx_step, donate_argnums=(0, 1))
sp = {k: jnp.asarray(v) for k, v in p0.items()}; ss = tx.init(sp)
# expert's
ep = eg.init(a, jax.random.PRNGKey(0))
etx = optax.adamw(3e-3, b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay, mask=jax.tree.map(lambda p: p.ndim >= 2, ep))
es = etx.init(ep)
def e_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(eg.forward(a.n_heads, p, x), y).mean())(params)
    u, opt_state = etx.update(grads, opt_state, params)
    return optax.apply_updates(params, u), opt_state, loss
ex = jax.jit(e_step, donate_argnums=(0, 1))
xs, ys = data.global_batch(w, 0); x, y = jax.device_put(xs), jax.device_put(ys)
res = {"sextant step": [], "expert step": [], "sextant step + fetch": []}
for i in range(60):
    t0 = time.perf_counter(); sp, ss, out = sx(sp, ss, x, y); out.block_until_ready(); res["sextant step"].append(time.perf_counter() - t0)
    t0 = time.perf_counter(); ep, es, out = ex(ep, es, x, y); out.block_until_ready(); res["expert step"].append(time.perf_counter() - t0)
    t0 = time.perf_counter(); b = data.global_batch(w, i); bx, by = jax.device_put(b[0]), jax.device_put(b[1]); sp, ss, out = sx(sp, ss, bx, by); out.block_until_ready(); res["sextant step + fetch"].append(time.perf_counter() - t0)
for k, v in res.items(): print(f"{k:22s} med {statistics.median(v[5:])*1e3:7.2f} ms  p10 {sorted(v[5:])[5]*1e3:7.2f}  min {min(v[5:])*1e3:7.2f}")
