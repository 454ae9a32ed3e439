"""What sextant's measurement itself costs per step, per framework.

sextant's step does three things an expert's loop does not: it computes the global gradient
norm (recorded beside the loss, so that the data-parallel parity check can fail: Adam hides
a gradient summed instead of averaged from the loss, not from the norm), it fetches the
step's batch inside the clock (data.local_batch + a host-to-framework copy; an expert's
benchmark loop prepares the batches before it), and after the clock stops it writes one
JSON event line and reads the RSS. This script times each in isolation, on the workload's
shapes, with the workload's thread count, alternating "with" and "without" many times in one
process (medians of --reps pairs), so the figures are the increments the harness adds:

- torch:      get_total_norm(foreach) + the stack of (loss, norm), eager, after backward;
- jax:        the jitted, donated step with optax.global_norm + stack vs without;
- tensorflow: the XLA-compiled step with the global norm + stack vs without;
- all:        fetch (data.local_batch + framework copy) and the per-step event + RSS read.

    python benchmarks/step_costs.py --workload benchmarks/expert/gpt-issue20.toml
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sextant import data
from sextant.workloads.init import decays, init_params
from sextant.measure import memory
from sextant.workloads.schedule import lr_table
from sextant.sources import resolve_workload


def alternate(a, b, reps: int) -> tuple[float, float]:  # noqa: ANN001
    """Median seconds of a() and of b(), called alternately `reps` times each."""
    ta, tb = [], []
    for _ in range(reps):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def one(fn, reps: int) -> float:  # noqa: ANN001
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def torch_costs(w, threads: int, reps: int) -> dict:  # noqa: ANN001
    import torch

    from sextant.backends.torch_backend import model as tm

    torch.set_num_threads(threads)
    params = init_params(w.model, w.seed)
    net = tm.build(w.model)
    tm.load_canonical(net, params)
    module = tm.WithLoss(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
    x, y = (torch.from_numpy(a) for a in data.global_batch(w, 0))
    ps = list(net.parameters())

    def step() -> torch.Tensor:
        loss = module(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def norm_only() -> torch.Tensor:
        loss = module(x, y)
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in ps], foreach=True)
        out = torch.stack((loss.detach(), norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out

    for _ in range(5):
        step()
        norm_only()
    with_norm, without = alternate(norm_only, step, reps)
    # The norm alone, after a backward (isolates it from the step's own noise).
    module(x, y).backward()
    alone = one(lambda: torch.stack((x.new_zeros((), dtype=torch.float32),
                                     torch.nn.utils.get_total_norm([p.grad for p in ps],
                                                                   foreach=True))), reps * 5)
    fetch = one(lambda: [torch.from_numpy(a) for a in data.local_batch(w, 3, 0, 1)], reps * 5)
    return {"step_s": without, "step_with_norm_s": with_norm, "norm_alone_s": alone,
            "fetch_s": fetch}


def jax_costs(w, threads: int, reps: int) -> dict:  # noqa: ANN001
    import jax
    import jax.numpy as jnp
    import optax

    from sextant.backends.jax_backend.model import loss_fn

    p0 = init_params(w.model, w.seed)
    lrs = jnp.asarray(lr_table(w.optimizer, w.steps))
    o = w.optimizer
    tx = optax.adamw(lambda c: lrs[jnp.minimum(c, w.steps - 1)], b1=o.beta1, b2=o.beta2,
                     eps=o.eps, weight_decay=o.weight_decay,
                     mask={k: decays(k, v.shape) for k, v in p0.items()})

    def make(with_norm: bool):  # noqa: ANN202
        def step(p, s, x, y):  # noqa: ANN001, ANN202
            loss, g = jax.value_and_grad(lambda q: loss_fn(w.model, q, x, y))(p)
            u, s = tx.update(g, s, p)
            out = jnp.stack([loss, optax.global_norm(g)]) if with_norm else loss
            return optax.apply_updates(p, u), s, out
        return jax.jit(step, donate_argnums=(0, 1))

    x, y = (jax.device_put(a) for a in data.global_batch(w, 0))
    states = {}
    for flag in (True, False):
        p = {k: jnp.asarray(v) for k, v in p0.items()}
        states[flag] = [make(flag), p, tx.init(p)]

    def run(flag: bool):  # noqa: ANN202
        def call() -> None:
            fn, p, s = states[flag]
            p, s, out = fn(p, s, x, y)
            out.block_until_ready()
            states[flag][1:] = [p, s]
        return call

    for _ in range(5):
        run(True)()
        run(False)()
    with_norm, without = alternate(run(True), run(False), reps)
    fetch = one(lambda: [jax.device_put(a) for a in data.global_batch(w, 3)], reps * 5)
    return {"step_s": without, "step_with_norm_s": with_norm, "fetch_s": fetch}


def tf_costs(w, threads: int, reps: int) -> dict:  # noqa: ANN001
    from sextant.backends.tf_backend import prepare_environment

    prepare_environment()
    import numpy as np
    import tensorflow as tf

    from sextant.backends.tf_backend import model as tm
    from sextant.backends.tf_backend.train import INTER_OP_THREADS
    from sextant.workloads.init import param_shapes

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)
    shapes = param_shapes(w.model)
    names = list(shapes)
    p0 = init_params(w.model, w.seed)
    opt = tm.AdamW(w.optimizer, lr_table(w.optimizer, w.steps), names, shapes)

    def make(with_norm: bool):  # noqa: ANN202
        ps = [tf.Variable(p0[n]) for n in names]
        ms = [tf.Variable(np.zeros_like(p0[n])) for n in names]
        vs = [tf.Variable(np.zeros_like(p0[n])) for n in names]
        k = tf.Variable(0, dtype=tf.int32)

        @tf.function(jit_compile=True)
        def step(x, y):  # noqa: ANN001, ANN202
            loss, grads = tm.value_and_grad(w.model, names, [p.read_value() for p in ps], x, y)
            s = opt.scalars(k.read_value())
            for i, (p, g, m, v) in enumerate(zip(ps, grads, ms, vs)):
                opt.update(i, p, g, m, v, s)
            k.assign_add(1)
            return tf.stack([loss, tm.global_norm(grads)]) if with_norm else loss
        return step

    x, y = (tf.constant(a) for a in data.global_batch(w, 0))
    fns = {flag: make(flag) for flag in (True, False)}
    for _ in range(5):
        fns[True](x, y)
        fns[False](x, y)
    with_norm, without = alternate(lambda: fns[True](x, y), lambda: fns[False](x, y), reps)
    fetch = one(lambda: [tf.constant(a) for a in data.local_batch(w, 3, 0, 1)], reps * 5)
    return {"step_s": without, "step_with_norm_s": with_norm, "fetch_s": fetch}


def event_cost(reps: int) -> float:
    """One per-step event line (as WorkerContext.emit writes it) plus the RSS read."""
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "e.jsonl", "a") as f:
        def emit() -> None:
            f.write(json.dumps({"schema": 1, "event": "step", "rank": 0, "time": time.time(),
                                "step": 7, "loss": None, "step_time_s": 0.0123,
                                "data_time_s": 4e-5, "rows": 16,
                                "rss_bytes": memory.current_rss()}) + "\n")
            f.flush()
        return one(emit, reps * 20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="benchmarks/expert/gpt-issue20.toml")
    p.add_argument("--frameworks", default="torch,jax,tensorflow")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args()
    w = resolve_workload(a.workload)
    fns = {"torch": torch_costs, "jax": jax_costs, "tensorflow": tf_costs}
    print(f"{a.workload}, {a.threads} threads, {a.reps} alternating pairs; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name in a.frameworks.split(","):
        r = fns[name](w, a.threads, a.reps)
        extra = r["step_with_norm_s"] - r["step_s"]
        line = (f"{name:<11} step {r['step_s'] * 1e3:7.2f} ms; + gradient norm "
                f"{extra * 1e6:+7.0f} us ({extra / r['step_s']:+.1%})")
        if "norm_alone_s" in r:
            line += f" [norm alone {r['norm_alone_s'] * 1e6:.0f} us]"
        line += f"; fetch {r['fetch_s'] * 1e6:.0f} us ({r['fetch_s'] / r['step_s']:.1%})"
        print(line, flush=True)
    print(f"event line + RSS read (after the clock stops): {event_cost(a.reps) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
