"""Kept as run for docs/benchmarks.md (issue #20); see README.md here."""
# ruff: noqa: E401, E402, E501, E701, E702, E731, F401, I001
import sys
import time
import statistics
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
from sextant.backends.tf_backend import prepare_environment
prepare_environment()
import numpy as np
import tensorflow as tf
from sextant.workload import resolve_workload
from sextant import data
from sextant.init import init_params, param_shapes
from sextant.schedule import lr_table
from sextant.backends.tf_backend import model as tm
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(int(sys.argv[2]))
w = resolve_workload(sys.argv[1]); shapes = param_shapes(w.model); names = list(shapes); p0 = init_params(w.model, 0)
opt = tm.AdamW(w.optimizer, lr_table(w.optimizer, w.steps), names, shapes)
ps = [tf.Variable(p0[n]) for n in names]; ms = [tf.Variable(np.zeros_like(p0[n])) for n in names]; vs = [tf.Variable(np.zeros_like(p0[n])) for n in names]; k = tf.Variable(0, dtype=tf.int32)
@tf.function(jit_compile=True)
def step(x, y):
    loss, grads = tm.value_and_grad(w.model, names, [p.read_value() for p in ps], x, y)
    s = opt.scalars(k.read_value())
    for i, (p, g, m, v) in enumerate(zip(ps, grads, ms, vs)): opt.update(i, p, g, m, v, s)
    k.assign_add(1)
    return tf.stack([loss, tm.global_norm(grads)])
x, y = (tf.constant(a) for a in data.global_batch(w, 0))
ts = []
for i in range(80):
    t0 = time.perf_counter(); step(x, y); ts.append(time.perf_counter() - t0)
ts = ts[5:]; print(f"inter {sys.argv[2]}: med {statistics.median(ts)*1e3:.2f} p10 {sorted(ts)[len(ts)//10]*1e3:.2f} min {min(ts)*1e3:.2f}", flush=True)
