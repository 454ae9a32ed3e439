"""Kept as run for docs/benchmarks.md (issue #20); see README.md here.

sextant's TensorFlow step and the expert's Keras step, and their parts, in one process,
alternating 10-step blocks: python benchmarks/inprocess/tf_parts.py WORKLOAD ROUNDS [VARIANTS]
(run under `taskset -c 0` with OMP_NUM_THREADS=1 for the one-thread comparison). Variants:
sx (sextant's step: since the layer-norm change, the fast one), -nonorm (without the gradient norm), -fb (forward and backward only,
returning each gradient's sum), -upd2/-upd3 (its AdamW with one division, or in Keras'
in-place form), -normcat (the norm of the concatenated gradients), -vars (the forward on the
variables), -split (two XLA programs), -upd-only (the update alone on fixed gradients),
sxp-* (sextant's model with its layer norm as it was before the change, and one difference from the expert's switched: -wpe, -mask, -3d, -ln
(tf.nn.moments), -lnsg (the variance's gradient through the mean stopped)); ex (the expert's
Keras step), -fused, -fb, -upd-only, -sxopt (its model with sextant's AdamW)."""
# ruff: noqa: E401, E402, E501, E701, E702, E731, F401, I001
import sys, time, statistics, argparse
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
from sextant.backends.tf_backend import prepare_environment
prepare_environment()
import numpy as np
import tensorflow as tf
import keras
from sextant.workload import resolve_workload
from sextant import data
from sextant.init import init_params, param_shapes
from sextant.schedule import lr_table
from sextant.backends.tf_backend import model as tm
from sextant.backends.tf_backend.train import INTER_OP_THREADS
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)
sys.argv, wl, rounds, sys_argv_rest = [sys.argv[0]], sys.argv[1], int(sys.argv[2]), sys.argv[3:]
import tf_gpt  # the expert's model (no sextant import)
w = resolve_workload(wl); spec = w.model; shapes = param_shapes(spec); names = list(shapes); p0 = init_params(spec, 0)
opt = tm.AdamW(w.optimizer, lr_table(w.optimizer, 10_000), names, shapes)
ps = [tf.Variable(p0[n]) for n in names]; ms = [tf.Variable(np.zeros_like(p0[n])) for n in names]; vs = [tf.Variable(np.zeros_like(p0[n])) for n in names]; k = tf.Variable(0, dtype=tf.int32)

def upd2(i, p, g, m, v, s):
    b1, b2 = opt.b1, opt.b2
    m_new = b1 * m + (1.0 - b1) * g
    v_new = b2 * v + (1.0 - b2) * tf.square(g)
    m.assign(m_new); v.assign(v_new)
    base = p * s["decay_factor"] if opt.decay[i] else tf.convert_to_tensor(p)
    p.assign(base - (s["step_size"] * s["bc2_sqrt"]) * m_new / (tf.sqrt(v_new) + opt.eps * s["bc2_sqrt"]))

def upd3(i, p, g, m, v, s):
    b1, b2 = opt.b1, opt.b2
    m.assign_add((g - m) * (1.0 - b1))
    v.assign_add((tf.square(g) - v) * (1.0 - b2))
    if opt.decay[i]:
        p.assign_sub(p * (1.0 - s["decay_factor"]))
    p.assign_sub((s["step_size"] * s["bc2_sqrt"]) * m / (tf.sqrt(v) + opt.eps * s["bc2_sqrt"]))

def sx_vars(norm=True):
    """The forward on the variables themselves (as a Keras model reads its weights), not on
    values read before the tape."""
    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tm.loss_fn(spec, dict(zip(names, ps)), x, y)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, ps)]
        s = opt.scalars(k.read_value())
        for i, (p, g, m, v) in enumerate(zip(ps, grads, ms, vs)): opt.update(i, p, g, m, v, s)
        k.assign_add(1)
        return tf.stack([loss, tm.global_norm(grads)] if norm else [loss])
    return step

G = [tf.constant(np.random.default_rng(1).normal(0, 1e-3, p0[n].shape).astype(np.float32)) for n in names]

def sx_update_only():
    @tf.function(jit_compile=True)
    def step(x, y):
        s = opt.scalars(k.read_value())
        for i, (p, g, m, v) in enumerate(zip(ps, G, ms, vs)): opt.update(i, p, g, m, v, s)
        k.assign_add(1)
        return tf.stack([tf.constant(0.0)])
    return step

def ex_update_only():
    model = tf_gpt.GPT(a, fused=True); model(tf.zeros((1, a.seq_len), tf.int32))
    tv = model.trainable_variables
    kopt = keras.optimizers.AdamW(learning_rate=tf_gpt.WarmupCosine(a), beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1)
    kopt.exclude_from_weight_decay(var_list=[v for v in tv if len(v.shape) < 2]); kopt.build(tv)
    GE = [tf.constant(np.random.default_rng(1).normal(0, 1e-3, v.shape).astype(np.float32)) for v in tv]
    @tf.function(jit_compile=True)
    def step(x, y):
        kopt.apply_gradients(zip(GE, tv)); return tf.constant(0.0)
    return step

def sx_split():
    """Two XLA programs, as sextant's distributed step: gradients (and norm), then the update."""
    grad_fn = tf.function(lambda vals, x, y: tm.value_and_grad(spec, names, vals, x, y), jit_compile=True)
    def apply(grads):
        s = opt.scalars(k.read_value())
        for i, (p, g, m, v) in enumerate(zip(ps, grads, ms, vs)): opt.update(i, p, g, m, v, s)
        k.assign_add(1)
    apply_fn = tf.function(apply, jit_compile=True)
    norm_fn = tf.function(tm.global_norm, jit_compile=True)
    @tf.function
    def step(x, y):
        loss, grads = grad_fn([p.read_value() for p in ps], x, y)
        norm = norm_fn(grads)
        apply_fn(grads)
        return tf.stack([loss, norm])
    return step

def ex_sxopt(norm=False):
    """The expert's Keras model, updated by sextant's AdamW (tm.AdamW, decay on >= 2-D)."""
    model = tf_gpt.GPT(a, fused=True); model(tf.zeros((1, a.seq_len), tf.int32))
    tv = model.trainable_variables
    vnames = [f"v{i}.weight" if len(v.shape) >= 2 else f"v{i}.bias" for i, v in enumerate(tv)]
    o = tm.AdamW(w.optimizer, lr_table(w.optimizer, 10_000), vnames, {n: tuple(v.shape) for n, v in zip(vnames, tv)})
    m2 = [tf.Variable(tf.zeros(v.shape)) for v in tv]; v2 = [tf.Variable(tf.zeros(v.shape)) for v in tv]; k2 = tf.Variable(0, dtype=tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, tv)]
        s = o.scalars(k2.read_value())
        for i, (p, g, m, v) in enumerate(zip(tv, grads, m2, v2)): o.update(i, p.value if hasattr(p, "value") else p, g, m, v, s)
        k2.assign_add(1)
        return tf.stack([loss, tm.global_norm(grads)] if norm else [loss])
    return step

import math, functools
def gpt_logits_var(spec, p, idx, wpe_gather=False, mask="inf", dense3d=False, ln="old"):
    """sextant's _gpt_logits with one difference from the expert's model switched at a time."""
    B, T = tf.shape(idx)[0], idx.shape[1]
    C, nh, hd = spec.d_model, spec.n_heads, spec.head_dim
    pos = tf.gather(p["wpe"], tf.range(T)) if wpe_gather else p["wpe"][:T]
    x = tf.gather(p["wte"], idx) + pos
    if not dense3d:
        x = tf.reshape(x, (-1, C))
    causal = tf.constant(np.tril(np.ones((T, T), dtype=bool)))
    neg = tf.constant(-np.inf if mask == "inf" else -1e9, x.dtype)
    scale = tf.constant(1.0 / math.sqrt(hd), x.dtype)
    def ln_sg(x, g, b):  # sextant's formula, the variance's path through the mean stopped
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        var = tf.reduce_mean(tf.math.squared_difference(x, tf.stop_gradient(mean)), axis=-1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b
    def ln_old(x, g, b):  # sextant's layer norm before the change (autodiff through the mean)
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b
    lnf = {"old": ln_old, "sg": ln_sg,
           "tfnn": lambda x, g, b: tf.nn.batch_normalization(x, *tf.nn.moments(x, [-1], keepdims=True), b, g, 1e-5)}[ln]
    def heads(t):
        return tf.transpose(tf.reshape(t, (B, T, nh, hd)), (0, 2, 1, 3))
    for i in range(spec.n_layers):
        b = f"blocks.{i}."
        h = lnf(x, p[b + "ln1.scale"], p[b + "ln1.bias"])
        q, k_, v = tf.split(tm._dense(h, p[b + "attn.qkv.weight"], p[b + "attn.qkv.bias"]), 3, axis=-1)
        q, k_, v = heads(q), heads(k_), heads(v)
        att = tf.matmul(q, k_, transpose_b=True) * scale
        att = tf.nn.softmax(tf.where(causal, att, neg), axis=-1)
        y = tf.transpose(tf.matmul(att, v), (0, 2, 1, 3))
        y = tf.reshape(y, (B, T, C) if dense3d else (-1, C))
        x = x + tm._dense(y, p[b + "attn.proj.weight"], p[b + "attn.proj.bias"])
        h = lnf(x, p[b + "ln2.scale"], p[b + "ln2.bias"])
        h = tf.nn.gelu(tm._dense(h, p[b + "mlp.fc.weight"], p[b + "mlp.fc.bias"]), approximate=True)
        x = x + tm._dense(h, p[b + "mlp.proj.weight"], p[b + "mlp.proj.bias"])
    x = lnf(x, p["ln_f.scale"], p["ln_f.bias"])
    out = tm._dense(x, p["head.weight"])
    return tf.reshape(out, (-1, spec.vocab_size))

def sx_patched(**flags):
    step = sx(norm=False)
    orig = tm._gpt_logits
    tm._gpt_logits = functools.partial(gpt_logits_var, **flags)
    try:
        xs, ys = (tf.constant(v) for v in data.global_batch(w, 0)); step(xs, ys)  # traced now
    finally:
        tm._gpt_logits = orig
    return step

def norm_concat(grads):
    return tf.norm(tf.concat([tf.reshape(g, (-1,)) for g in grads], 0))

def sx(norm=True, update=True, upd=None, normf=None):
    upd = upd or opt.update
    normf = normf or tm.global_norm
    @tf.function(jit_compile=True)
    def step(x, y):
        loss, grads = tm.value_and_grad(spec, names, [p.read_value() for p in ps], x, y)
        if update:
            s = opt.scalars(k.read_value())
            for i, (p, g, m, v) in enumerate(zip(ps, grads, ms, vs)): upd(i, p, g, m, v, s)
            k.assign_add(1)
            out = [loss]
        else:
            out = [loss] + [tf.reduce_sum(g) for g in grads]
        if norm: out.append(normf(grads))
        return tf.stack(out)
    return step

a = argparse.Namespace(vocab=spec.vocab_size, seq_len=spec.seq_len, d_model=spec.d_model, n_layers=spec.n_layers,
                       n_heads=spec.n_heads, d_ff=spec.d_ff, steps=10_000, lr=3e-3, lr_warmup=5, min_lr_ratio=0.1)
def ex(fused, update=True, keras_opt=True):
    model = tf_gpt.GPT(a, fused=fused); model(tf.zeros((1, a.seq_len), tf.int32))
    kopt = keras.optimizers.AdamW(learning_rate=tf_gpt.WarmupCosine(a), beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1)
    kopt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2]); kopt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        if update:
            kopt.apply_gradients(zip(grads, model.trainable_variables)); return loss
        return tf.stack([loss] + [tf.reduce_sum(tf.convert_to_tensor(g)) for g in grads])
    return step

ALL = {"sx": lambda: sx(), "sx-nonorm": lambda: sx(norm=False), "sx-fb": lambda: sx(norm=False, update=False),
       "sx-upd2": lambda: sx(upd=upd2), "sx-upd2-nonorm": lambda: sx(norm=False, upd=upd2), "sx-normcat": lambda: sx(normf=norm_concat), "sx-upd3": lambda: sx(upd=upd3), "sx-upd3-nonorm": lambda: sx(norm=False, upd=upd3),
       "sx-fb-norm": lambda: sx(update=False), "sx-vars": lambda: sx_vars(), "sx-upd-only": sx_update_only, "sx-split": sx_split, "ex-sxopt": ex_sxopt, "sxp-base": lambda: sx_patched(), "sxp-wpe": lambda: sx_patched(wpe_gather=True),
       "sxp-mask": lambda: sx_patched(mask="1e9"), "sxp-3d": lambda: sx_patched(dense3d=True), "sxp-ln": lambda: sx_patched(ln="tfnn"), "sxp-lnsg": lambda: sx_patched(ln="sg"), "sxp-lnsg3d": lambda: sx_patched(ln="sg", dense3d=True), "ex-sxopt-norm": lambda: ex_sxopt(True), "ex-upd-only": ex_update_only, "sx-vars-nonorm": lambda: sx_vars(False),
       "ex": lambda: ex(False), "ex-fused": lambda: ex(True), "ex-fb": lambda: ex(False, update=False), "ex-fused-fb": lambda: ex(True, update=False)}
pick = (sys_argv_rest[0].split(",") if sys_argv_rest else list(ALL))
variants = {n: ALL[n]() for n in pick}
x, y = (tf.constant(v) for v in data.global_batch(w, 0))
for f in variants.values():
    for _ in range(5): f(x, y).numpy()
ts = {n: [] for n in variants}
for r in range(rounds):
    order = list(variants) if r % 2 == 0 else list(variants)[::-1]
    for n in order:
        f = variants[n]
        for _ in range(10):
            t0 = time.perf_counter(); f(x, y); ts[n].append(time.perf_counter() - t0)
base = statistics.median(ts["ex" if "ex" in ts else list(ts)[-1]])
for n, t in ts.items():
    print(f"{n:<12} median {statistics.median(t)*1e3:7.2f} ms  p10 {sorted(t)[len(t)//10]*1e3:7.2f} ms  / ex {statistics.median(t)/base:.3f}")
