"""One TensorFlow worker for parallel 'single' and 'dp', under the shared timed loop.

Written the way TensorFlow's custom-training-loop guides do it: raw tf.Variables created under
the strategy's scope, a step traced once by tf.function (`jit_compile=True` for 'compiled'),
`strategy.run` for the per-replica work, the replica context's `all_reduce(MEAN, ...)` for
the gradients, no host transfer inside the step (the loss/grad-norm pair is read back every
`log_every` steps).

- single: the whole step (forward, backward, norm, AdamW) is one tf.function; with
  'compiled' XLA compiles all of it into one executable.
- dp, one device per worker: MultiWorkerMirroredStrategy, one process per rank, TF_CONFIG
  on loopback (ctx.ports), ring all-reduce over gRPC with the collective timeout.
- dp, one worker with devices_per_worker N: MirroredStrategy over N logical CPU devices.
  In both, XLA (when 'compiled') compiles the per-replica forward/backward and the per-device
  AdamW update as two executables; the cross-replica all-reduce runs between them as a
  tf.distribute collective, outside XLA, so it keeps its ring implementation and timeout and
  the no-sync variant only has to leave it out.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import numpy as np

from sextant import data
from sextant.backends.tf_backend.common import nbytes
from sextant.measure.guard import guard_recompiles
from sextant.init import params_digest
from sextant.errors import UserError
from sextant.init import init_params, param_shapes
from sextant.measure.comm import bytes_per_step
from sextant.measure.env import fingerprint
from sextant.measure.loop import timed_training
from sextant.schedule import lr_table

INTER_OP_THREADS = 2


def configure(tf: Any, ctx: Any, logical_cpus: int = 1) -> None:
    """Threads and logical devices; must run before TensorFlow initialises its runtime."""
    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
    tf.config.threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)
    if logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_cpus)]
        )


def make_strategy(tf: Any, ctx: Any) -> tuple[Any, str, str | None]:
    """(strategy or None, its description, collectives description)."""
    strategy = ctx.strategy
    if strategy.parallel == "single":
        configure(tf, ctx)
        return None, "none", None
    if strategy.devices_per_worker > 1:
        if strategy.workers > 1:
            raise UserError(
                "tensorflow dp: devices_per_worker > 1 needs workers=1 (MirroredStrategy over "
                "logical CPU devices); MultiWorkerMirroredStrategy uses one CPU device per "
                f"worker. Received: workers={strategy.workers}, "
                f"devices_per_worker={strategy.devices_per_worker}"
            )
        n = strategy.devices_per_worker
        configure(tf, ctx, logical_cpus=n)
        devices = [d.name for d in tf.config.list_logical_devices("CPU")][:n]
        return (
            tf.distribute.MirroredStrategy(devices=devices,
                                           cross_device_ops=tf.distribute.ReductionToOneDevice()),
            f"MirroredStrategy over {n} logical CPU devices",
            "in-process (ReductionToOneDevice)",
        )
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ctx.ports[: ctx.world]]},
        "task": {"type": "worker", "index": ctx.rank},
    })
    configure(tf, ctx)
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=ctx.collective_timeout_s,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )
    return (
        tf.distribute.MultiWorkerMirroredStrategy(communication_options=options),
        f"MultiWorkerMirroredStrategy x{ctx.world}",
        f"ring all-reduce over gRPC (timeout {ctx.collective_timeout_s:g} s)",
    )


def run(ctx: Any) -> dict[str, Any]:
    from sextant.backends.tf_backend import import_tensorflow

    tf = import_tensorflow(ctx)

    from sextant.backends.tf_backend import model as tm

    workload, strategy = ctx.workload, ctx.strategy
    dist, wrapping, collectives = make_strategy(tf, ctx)
    jit = strategy.mode == "compiled"
    spec = workload.model
    shapes = param_shapes(spec)
    names = list(shapes)
    params0 = init_params(spec, workload.seed)
    opt = tm.AdamW(workload.optimizer, lr_table(workload.optimizer, workload.steps), names, shapes)
    faults = (ctx.fault or "").split(",")

    with dist.scope() if dist is not None else contextlib.nullcontext():
        params = [tf.Variable(params0[n], name=_var_name(n)) for n in names]
        ms = [tf.Variable(np.zeros_like(params0[n]), name="m." + _var_name(n)) for n in names]
        vs = [tf.Variable(np.zeros_like(params0[n]), name="v." + _var_name(n)) for n in names]
        k = tf.Variable(0, dtype=tf.int32, name="update_count")

    def apply(p_vars: list[Any], m_vars: list[Any], v_vars: list[Any], k_var: Any,
              grads: list[tf.Tensor]) -> None:
        s = opt.scalars(k_var.read_value())
        for i, (p, g, m, v) in enumerate(zip(p_vars, grads, m_vars, v_vars)):
            opt.update(i, p, g, m, v, s)
        k_var.assign_add(1)

    rows = {"n": 0}  # rows of the batch this process fetched last

    if dist is None:
        @tf.function(jit_compile=jit)
        def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            loss, grads = tm.value_and_grad(spec, names, [p.read_value() for p in params], x, y)
            norm = tm.global_norm(grads)
            apply(params, ms, vs, k, grads)
            return tf.stack([loss, norm])

        sync_fn, nosync_fn, n_local = step_fn, None, 1
        device = "/device:CPU:0"

        def fetch(i: int) -> tuple[tf.Tensor, tf.Tensor]:
            x, y = data.local_batch(workload, i, 0, 1, ctx.fault)
            rows["n"] = len(x)
            return tf.constant(x), tf.constant(y)
    else:
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=ctx.collective_timeout_s)
        # The deliberate bug behind SEXTANT_TEST_FAULT=sum-gradients: sum instead of mean.
        reduce_op = (tf.distribute.ReduceOp.SUM if "sum-gradients" in faults
                     else tf.distribute.ReduceOp.MEAN)
        grad_fn = tf.function(lambda values, x, y: tm.value_and_grad(spec, names, values, x, y),
                              jit_compile=jit)
        apply_fn = tf.function(apply, jit_compile=jit)
        local_devices = dist.extended.worker_devices
        n_local = len(local_devices)
        device = ", ".join(local_devices)
        # Per local device: the component variables of each mirrored variable. After the
        # all-reduce every replica holds the same gradients, so updating each component with
        # its own replica's gradients keeps them identical without a broadcast.
        local = [
            [[dist.experimental_local_results(var)[d] for var in group]
             for group in (params, ms, vs)] + [dist.experimental_local_results(k)[d]]
            for d in range(n_local)
        ]

        def make_step(sync: bool) -> Any:
            def replica(x: tf.Tensor, y: tf.Tensor) -> tuple[Any, ...]:
                loss, grads = grad_fn([p.read_value() for p in params], x, y)
                if sync:
                    grads = tf.distribute.get_replica_context().all_reduce(
                        reduce_op, grads, options=options)
                return loss, tm.global_norm(grads), grads

            @tf.function
            def step_fn(x: Any, y: Any) -> tf.Tensor:
                loss, norm, grads = dist.run(replica, args=(x, y))
                per_device_grads = [dist.experimental_local_results(g) for g in grads]
                for d in range(n_local):
                    with tf.device(local_devices[d]):
                        p_vars, m_vars, v_vars, k_var = local[d]
                        apply_fn(p_vars, m_vars, v_vars, k_var,
                                 [g[d] for g in per_device_grads])
                losses = dist.experimental_local_results(loss)
                # Mean of this process's replicas (the runner averages the processes).
                return tf.stack([tf.add_n(list(losses)) / len(losses),
                                 dist.experimental_local_results(norm)[0]])

            return step_fn

        sync_fn, nosync_fn = make_step(True), make_step(False)

        def fetch(i: int) -> tuple[Any, Any]:
            x, y = data.local_batch(workload, i, ctx.rank, ctx.world, ctx.fault)
            rows["n"] = len(x)

            def local_shard(value_ctx: Any) -> tuple[tf.Tensor, tf.Tensor]:
                d = value_ctx.replica_id_in_sync_group - ctx.rank * n_local
                with tf.device(local_devices[d]):
                    return (tf.constant(data.shard(x, d, n_local)),
                            tf.constant(data.shard(y, d, n_local)))

            xs = dist.experimental_distribute_values_from_function(lambda c: local_shard(c)[0])
            ys = dist.experimental_distribute_values_from_function(lambda c: local_shard(c)[1])
            return xs, ys

    guarded = guard_recompiles(sync_fn, workload.measure.warmup_steps,
                               count=sync_fn.experimental_get_tracing_count)

    def step(batch: tuple[Any, Any]) -> tf.Tensor:
        return guarded(*batch)

    def step_nosync(batch: tuple[Any, Any]) -> tf.Tensor:
        return nosync_fn(*batch)

    def block(handle: tf.Tensor) -> None:
        # TensorFlow executes tf.functions synchronously on CPU: the call returns when the
        # step's work is done, so there is nothing to wait for.
        return None

    def to_floats(handles: list[tf.Tensor]) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in np.stack([h.numpy() for h in handles]).tolist()]

    exported: dict[str, Any] = {}

    def export_final() -> None:
        # Right after the last training step, before the exposed-communication pairs (which
        # keep updating the parameters, for timing only). Rank 0 only, as torch does.
        if ctx.rank == 0:
            final = {n: np.asarray(p.numpy()) for n, p in zip(names, params)}
            np.savez(ctx.run_dir / "final_params.npz", **final)
            exported["sha256"] = params_digest(final)

    result = timed_training(
        ctx, fetch=fetch, step=step, block=block, to_floats=to_floats,
        step_nosync=step_nosync if nosync_fn is not None else None,
        rows_of=lambda batch: rows["n"], on_trained=export_final,
    )
    result["final_params_sha256"] = exported.get("sha256")
    n_params = sum(v.size for v in params0.values())
    result["memory_accounting"] = {
        "params": nbytes(params0.values()) * n_local,
        "grads": None,  # live only inside the traced step
        "optimizer_state": 2 * nbytes(params0.values()) * n_local,
        "parameters": n_params,
    }
    result["comm"] = {"planned_bytes_per_step": bytes_per_step(strategy, n_params),
                      "measured_grad_payload_bytes_per_step": None}
    result["details"] = {
        "optimizer": "AdamW by hand on tf.Variables (torch.optim.AdamW semantics)",
        "wrapping": " + ".join(
            w for w, on in ((wrapping, dist is not None),
                            ("tf.function(jit_compile=True)" if jit else "tf.function", True))
            if on
        ),
        "step": ("one tf.function" + (", XLA-compiled whole" if jit else "")
                 if dist is None else
                 "tf.function: strategy.run(" + ("XLA " if jit else "")
                 + "forward/backward) + all_reduce(MEAN) + per-device "
                 + ("XLA " if jit else "") + "AdamW"),
        "devices": n_local,
        "collectives": collectives,
        "xla": jit,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
    }
    result["fingerprint"] = fingerprint(
        framework="tensorflow",
        framework_version=tf.__version__,
        threads=tf.config.threading.get_intra_op_parallelism_threads(),
        inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
        device=device,
        xla=jit,
        onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    )
    return result


def _var_name(canonical: str) -> str:
    return canonical.replace(".", "_")
