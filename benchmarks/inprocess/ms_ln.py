"""Kept as run for docs/benchmarks.md (issue #20); see README.md here.

sextant's MindSpore step (value_and_grad, the gradient norm, AdamW) with the layer norm as
shipped (the variance's gradient path through the mean left to autodiff) and with that path
stopped, as the JAX and TensorFlow layer norms do; one process, alternating 10-step blocks,
under jit or op by op. Runs in the MindSpore environment:
python benchmarks/inprocess/ms_ln.py WORKLOAD ROUNDS jit|pynative"""
# ruff: noqa: E401, E402, E501, E701, E702, E731, I001
import sys
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
from alternate import alternate, report
import mindspore as ms
from mindspore import ops
from sextant.workload import resolve_workload
from sextant import data
from sextant.init import init_params
from sextant.backends.mindspore_backend import model as mm
from sextant.backends.mindspore_backend.train import _optimizer
from types import SimpleNamespace

w = resolve_workload(sys.argv[1]); rounds = int(sys.argv[2]); mode = sys.argv[3]
ms.set_context(mode=ms.PYNATIVE_MODE); ms.set_device("CPU"); ms.device_context.cpu.op_tuning.threads_num(1)


class Stopped(mm.LayerNorm):
    """The variance's gradient through the mean (zero) stopped."""
    def construct(self, x):
        mean = x.mean(-1, keep_dims=True)
        dev = x - ops.stop_gradient(mean)
        var = (dev * dev).mean(-1, keep_dims=True)
        return (x - mean) * ops.rsqrt(var + mm.LAYER_NORM_EPS) * self.scale + self.bias


def variant(cls):
    """sextant's step with every LayerNorm cell of the model made a `cls`."""
    net, by_name = mm.build(w.model, init_params(w.model, w.seed))
    for _, cell in net.cells_and_names():
        if isinstance(cell, mm.LayerNorm):
            cell.__class__ = cls
    opt = _optimizer(SimpleNamespace(workload=w), by_name)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        norm = ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads]))
        opt(grads)
        return ops.stack([loss, norm])
    f = ms.jit(step) if mode == "jit" else step
    return lambda: f(x, y).asnumpy()


xs, ys = data.global_batch(w, 0); x, y = mm.tensor(xs), mm.tensor(ys)
variants = {"as shipped": variant(mm.LayerNorm), "mean stopped": variant(Stopped)}
report(alternate(variants, rounds), "as shipped", width=14)
