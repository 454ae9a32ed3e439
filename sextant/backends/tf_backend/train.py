"""One TensorFlow worker for parallel 'single' and 'dp', under the shared timed loop.

Written the way TensorFlow's custom-training-loop guides do it: raw tf.Variables created under
the strategy's scope, a step traced once by tf.function (`jit_compile=True` for 'compiled'),
`strategy.run` for the per-replica work, the replica context's `all_reduce(MEAN, ...)` for
the gradients, no host transfer inside the step (the loss/grad-norm pair is read back every
`log_every` steps).

- single: the whole step (forward, backward, norm, AdamW) is one tf.function; with
  'compiled' XLA compiles all of it into one executable.
- dp, one device per worker: MultiWorkerMirroredStrategy, one process per rank, TF_CONFIG
  on each rank's host address (ctx.endpoint), ring all-reduce over gRPC with the collective timeout.
- dp, one worker with devices_per_worker N: MirroredStrategy over N logical CPU devices.
  In both, XLA (when 'compiled') compiles the per-replica forward/backward and the per-device
  AdamW update as two executables; the cross-replica all-reduce runs between them as a
  tf.distribute collective, outside XLA, so it keeps its ring implementation and timeout and
  the no-sync variant only has to leave it out.

Levers (docs/levers.md), all inside the traced step:
- grad_accum K: K micro-batches of the replica's rows, gradients summed and divided by K,
  then one all-reduce per optimizer step;
- precision bf16: forward/backward on bf16 copies of the fp32 variables, loss in fp32, AdamW
  on the fp32 variables (model.value_and_grad);
- compress bf16|fp16 (dp): gradients cast to 16 bits before the all-reduce, back after;
- checkpoint/resume: tf.train.Checkpoint of parameters, Adam moments and update counter,
  written through sextant.checkpoint's sealed-directory protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from sextant import data
from sextant.backends import harness, precision
from sextant.backends.harness import Description, Trainer
from sextant.backends.tf_backend.common import nbytes
from sextant.core.errors import UserError
from sextant.workloads.init import adapter_shapes, param_shapes
from sextant.pretrained.weights import initial_params, trainable
from sextant.measure.guard import guard_recompiles
from sextant.measure.env import fingerprint
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext

INTER_OP_THREADS = 2


def configure(tf: Any, ctx: WorkerContext, logical_cpus: int = 1) -> None:
    """Threads and logical devices; must run before TensorFlow initialises its runtime."""
    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
    tf.config.threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)
    if logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_cpus)]
        )


def make_strategy(tf: Any, ctx: WorkerContext) -> tuple[Any, str, str | None]:
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
        "cluster": {"worker": [ctx.endpoint(r) for r in range(ctx.world)]},
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


def run(ctx: WorkerContext) -> RankResult:
    from sextant.backends.tf_backend import import_tensorflow

    tf = import_tensorflow(ctx)

    from sextant.backends.tf_backend import model as tm

    workload, strategy = ctx.workload, ctx.strategy
    applied = precision.apply_tensorflow(strategy.precision)
    accum = strategy.grad_accum  # divides each replica's rows (checked by the runner)
    dist, wrapping, collectives = make_strategy(tf, ctx)
    jit = strategy.mode == "compiled"
    compute_dtype = precision.half_dtype(tf, strategy.precision, tf.float32)
    wire = precision.half_dtype(tf, strategy.compress)
    notices = probe_16bit_notice(tf, ctx, [d for d in (compute_dtype, wire)
                                           if d is not None and d != tf.float32])
    spec = workload.model
    shapes = {**param_shapes(spec), **adapter_shapes(spec, workload.finetune)}
    names = list(shapes)
    # What the optimizer updates: every parameter, or LoRA's adapters (the base is frozen:
    # no gradient, no moments).
    train_mask = [trainable(workload, n) for n in names]
    train_names = [n for n, t in zip(names, train_mask) if t]
    params0 = initial_params(workload)
    opt = tm.AdamW(workload.optimizer, lr_table(workload.optimizer, workload.steps),
                   train_names, shapes)

    with dist.scope() if dist is not None else contextlib.nullcontext():
        params = [tf.Variable(params0[n], name=_var_name(n)) for n in names]
        ms = [tf.Variable(np.zeros_like(params0[n]), name="m." + _var_name(n))
              for n in train_names]
        vs = [tf.Variable(np.zeros_like(params0[n]), name="v." + _var_name(n))
              for n in train_names]
        k = tf.Variable(0, dtype=tf.int32, name="update_count")

    def apply(p_vars: list[Any], m_vars: list[Any], v_vars: list[Any], k_var: Any,
              grads: list[Any]) -> None:
        s = opt.scalars(k_var.read_value())
        p_train = [p for p, t in zip(p_vars, train_mask) if t]
        for i, (p, g, m, v) in enumerate(zip(p_train, grads, m_vars, v_vars)):
            opt.update(i, p, g, m, v, s)
        k_var.assign_add(1)

    value_and_grad = _accumulated(tf, tm, spec, names, compute_dtype, accum,
                                  train_mask if workload.finetune.lora else None,
                                  workload.finetune.scale)

    rows = {"n": 0}  # rows of the batch this process fetched last
    variables = (params, ms, vs, k)
    if dist is None:
        steps = _single_device_steps(tf, tm, ctx, jit, variables, value_and_grad, apply, rows)
    else:
        sizes = [int(np.prod(shapes[n])) for n in train_names]
        steps = _replicated_steps(tf, tm, ctx, dist, jit, wire, variables, sizes,
                                  value_and_grad, apply, rows)
    sync_fn, nosync_fn, n_local, device, fetch = steps

    guarded = guard_recompiles(sync_fn, workload.measure.warmup_steps,
                               count=sync_fn.experimental_get_tracing_count)

    def step(batch: tuple[Any, Any]) -> Any:
        return guarded(*batch)

    def step_nosync(batch: tuple[Any, Any]) -> Any:
        assert nosync_fn is not None  # handed to the loop only when there is one
        return nosync_fn(*batch)

    gpu = strategy.device == "gpu"

    def block(handle: Any) -> None:
        # TensorFlow executes tf.functions synchronously on CPU: the call returns when the
        # step's work is done, so there is nothing to wait for. On a GPU the kernels are
        # queued: reading the step's two-float result back waits for them.
        if gpu:
            handle.numpy()

    def to_floats(handles: list[Any]) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in np.stack([h.numpy() for h in handles]).tolist()]

    def final_params() -> dict[str, np.ndarray] | None:
        # Rank 0 only, as torch does.
        return ({n: np.asarray(p.numpy()) for n, p in zip(names, params)}
                if ctx.rank == 0 else None)

    def describe() -> Description:
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] if gpu else None
        return Description(
            device_peak_bytes=int(peak) if peak is not None else None,
            memory={"params": nbytes(params0.values()) * n_local,
                    "frozen_params": nbytes(params0[n] for n in names
                                            if n not in train_names) * n_local,
                    "grads": None,  # live only inside the traced step
                    "optimizer_state": 2 * nbytes(params0[n] for n in train_names) * n_local},
            details=_details(ctx, dist is not None, wrapping, collectives, n_local,
                             notices),
            fingerprint=fingerprint(
                framework="tensorflow",
                framework_version=tf.__version__,
                threads=tf.config.threading.get_intra_op_parallelism_threads(),
                inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
                device=device,
                xla=jit,
                gpu=(tf.config.experimental.get_device_details(
                    tf.config.list_physical_devices("GPU")[0]).get("device_name")
                     if gpu else None),
                onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            ),
            precision=applied,
        )

    save, restore, barrier = _checkpointing(
        tf, ctx, dist, tf.train.Checkpoint(params=params, m=ms, v=vs, update_count=k), k)
    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in params0.values()),
        n_trainable=sum(int(np.prod(m.shape)) for m in ms),  # the variables with moments
        fetch=fetch, step=step, block=block, to_floats=to_floats,
        step_nosync=step_nosync if nosync_fn is not None else None,
        rows_of=lambda batch: rows["n"], final_params=final_params, describe=describe,
        save=save, restore=restore, barrier=barrier,
    ))


class _Steps(NamedTuple):
    """The traced steps of one worker and how it feeds them."""

    sync: Any
    """step(x, y) -> [loss, grad norm]: the training step, gradients all-reduced."""
    nosync: Any
    """The same step without the all-reduce (exposed communication), or None."""
    n_local: int
    """Replicas (devices) in this process."""
    device: str
    """The devices, in words, for the fingerprint."""
    fetch: Callable[[int], tuple[Any, Any]]
    """fetch(i): this process's rows of global batch i, as the step takes them."""


def _single_device_steps(tf: Any, tm: Any, ctx: WorkerContext, jit: bool,
                         variables: tuple[Any, ...], value_and_grad: Any, apply: Any,
                         rows: dict[str, int]) -> _Steps:
    """parallel 'single': the whole step (forward, backward, norm, AdamW) in one
    tf.function."""
    params, ms, vs, k = variables

    @tf.function(jit_compile=jit)
    def step_fn(x: Any, y: Any) -> Any:
        loss, grads = value_and_grad([p.read_value() for p in params], x, y)
        norm = tm.global_norm(grads)
        apply(params, ms, vs, k, grads)
        return tf.stack([loss, norm])

    def fetch(i: int) -> tuple[Any, Any]:
        x, y = data.local_batch(ctx.workload, i, 0, 1, ctx.fault)
        rows["n"] = len(x)
        return tf.constant(x), tf.constant(y)

    return _Steps(step_fn, None, 1, "/device:CPU:0", fetch)


def _replicated_steps(tf: Any, tm: Any, ctx: WorkerContext, dist: Any, jit: bool, wire: Any,
                      variables: tuple[Any, ...], sizes: list[int], value_and_grad: Any,
                      apply: Any, rows: dict[str, int]) -> _Steps:
    """parallel 'dp' under a tf.distribute strategy: per replica, the forward/backward and
    (synced) the gradient all-reduce; then each local device's AdamW on its own copy."""
    params, ms, vs, k = variables
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=ctx.collective_timeout_s)
    # The deliberate bug behind SEXTANT_TEST_FAULT=sum-gradients: sum instead of mean.
    sum_gradients = "sum-gradients" in (ctx.fault or "").split(",")
    reduce_op = tf.distribute.ReduceOp.SUM if sum_gradients else tf.distribute.ReduceOp.MEAN
    replicas = dist.num_replicas_in_sync
    grad_fn = tf.function(value_and_grad, jit_compile=jit)
    apply_fn = tf.function(apply, jit_compile=jit)
    local_devices = dist.extended.worker_devices
    n_local = len(local_devices)
    # Per local device: the component variables of each mirrored variable. After the
    # all-reduce every replica holds the same gradients, so updating each component with
    # its own replica's gradients keeps them identical without a broadcast.
    local = [
        [[dist.experimental_local_results(var)[d] for var in group]
         for group in (params, ms, vs)] + [dist.experimental_local_results(k)[d]]
        for d in range(n_local)
    ]
    all_reduce = _gradient_mean(tf, wire, reduce_op, options, sizes,
                                1.0 if sum_gradients else 1.0 / replicas)

    def make_step(sync: bool) -> Any:
        def replica(x: Any, y: Any) -> tuple[Any, ...]:
            loss, grads = grad_fn([p.read_value() for p in params], x, y)
            if sync:
                grads = all_reduce(grads)
            return loss, tm.global_norm(grads), grads

        @tf.function
        def step_fn(x: Any, y: Any) -> Any:
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

    def fetch(i: int) -> tuple[Any, Any]:
        x, y = data.local_batch(ctx.workload, i, ctx.rank, ctx.world, ctx.fault)
        rows["n"] = len(x)

        def local_shard(value_ctx: Any) -> tuple[Any, Any]:
            d = value_ctx.replica_id_in_sync_group - ctx.rank * n_local
            with tf.device(local_devices[d]):
                return (tf.constant(data.shard(x, d, n_local)),
                        tf.constant(data.shard(y, d, n_local)))

        xs = dist.experimental_distribute_values_from_function(lambda c: local_shard(c)[0])
        ys = dist.experimental_distribute_values_from_function(lambda c: local_shard(c)[1])
        return xs, ys

    return _Steps(make_step(True), make_step(False), n_local, ", ".join(local_devices), fetch)


def _accumulated(tf: Any, tm: Any, spec: Any, names: list[str], compute_dtype: Any,
                 accum: int, train_mask: list[bool] | None = None, lora_scale: float = 1.0
                 ) -> Any:
    """value_and_grad(values, x, y): (loss, gradients) of this replica's rows, in `accum`
    micro-batches.

    Micro-batch j is the j-th contiguous chunk of the replica's rows (torch's `x.chunk(K)`;
    the JAX backend takes rows j mod K: the same mean either way). The gradients are summed
    and divided by K once, so the result is the gradient of the mean loss over all the rows,
    as with K = 1. The K forward/backward passes are unrolled in the trace (K is static);
    each starts after the previous one's gradients exist, so only one micro-batch's
    activations are alive at a time."""
    def value_and_grad(values: list[Any], x: Any, y: Any) -> tuple[Any, list[Any]]:
        if accum == 1:
            return tm.value_and_grad(spec, names, values, x, y, compute_dtype, train_mask,
                                     lora_scale)
        loss_sum: Any = None
        grad_sums: list[Any] = []
        for xj, yj in zip(tf.split(x, accum), tf.split(y, accum)):
            with tf.control_dependencies(grad_sums):
                loss, grads = tm.value_and_grad(spec, names, values, tf.identity(xj), yj,
                                                compute_dtype, train_mask, lora_scale)
            if not grad_sums:
                loss_sum, grad_sums = loss, grads
            else:
                loss_sum = loss_sum + loss
                grad_sums = [a + g for a, g in zip(grad_sums, grads)]
        return loss_sum / accum, [g / accum for g in grad_sums]

    return value_and_grad


def _gradient_mean(tf: Any, wire: Any, reduce_op: Any, options: Any, sizes: list[int],
                   scale: float) -> Any:
    """all_reduce(grads): the gradient mean over all replicas, one collective for all
    gradients (called in a replica context).

    fp32: the list goes to tf.distribute, which concatenates it into one flat buffer inside a
    tf.function (CommunicationOptions.bytes_per_pack 0 makes one pack). Compressed (`wire` a
    16-bit dtype): the same flat buffer made here, in fp32, multiplied by `scale` (1/replicas;
    torch's fp16_compress_hook order: dividing first keeps fp16 from overflowing in the sum),
    cast to 16 bits once, summed, cast back and split. Casting is elementwise, so this is
    per-tensor casting's result, with two casts instead of two per tensor and no 16-bit
    concat/split."""
    def all_reduce(grads: list[Any]) -> list[Any]:
        replica_ctx = tf.distribute.get_replica_context()
        if wire is None:
            return replica_ctx.all_reduce(reduce_op, grads, options=options)
        flat = tf.concat([tf.reshape(g, (-1,)) for g in grads], axis=0) * scale
        reduced = replica_ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(flat, wire),
                                         options=options)
        pieces = tf.split(tf.cast(reduced, tf.float32), sizes)
        return [tf.reshape(piece, g.shape) for piece, g in zip(pieces, grads)]

    return all_reduce


def _details(ctx: WorkerContext, distributed: bool, wrapping: str, collectives: str | None,
             n_local: int, notices: list[str]) -> dict[str, Any]:
    strategy = ctx.strategy
    jit, accum = strategy.mode == "compiled", strategy.grad_accum
    xla = "XLA " if jit else ""
    micro = f"{accum} micro-batches of " if accum > 1 else ""
    bf16 = "bf16 " if strategy.precision == "bf16" else ""
    compressed = strategy.compress in ("bf16", "fp16")
    cast = f"cast to {strategy.compress} + " if compressed else ""
    return {
        "optimizer": "AdamW by hand on tf.Variables (torch.optim.AdamW semantics)",
        "wrapping": " + ".join(
            w for w, on in ((wrapping, distributed),
                            ("tf.function(jit_compile=True)" if jit else "tf.function", True),
                            ("bf16 compute copies", strategy.precision == "bf16"))
            if on
        ),
        "step": (f"tf.function: strategy.run({xla}{micro}{bf16}forward/backward) + {cast}"
                 f"all_reduce({'SUM' if compressed else 'MEAN'}) + per-device {xla}AdamW"
                 if distributed else
                 f"one tf.function ({micro}{bf16}forward/backward, norm, AdamW)"
                 + (", XLA-compiled whole" if jit else "")),
        "devices": n_local,
        "collectives": collectives,
        "xla": jit,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "precision": strategy.precision,
        "grad_accum": accum,
        "compression": strategy.compress,
        "tensorflow_notices": notices,
    }


def _checkpointing(tf: Any, ctx: WorkerContext, dist: Any, state: Any, k: Any
                   ) -> tuple[Any, Any, Any]:
    """(save, restore, barrier) through tf.train.Checkpoint of parameters, Adam moments and
    the update counter."""
    multi_worker = dist is not None and ctx.world > 1
    barrier = _barrier(tf, dist, ctx) if multi_worker else (lambda: None)

    def save(directory: Any) -> None:
        # TensorFlow's multi-worker rule (keras distributed_file_utils.write_dirpath):
        # every worker saves, the chief into the real directory, the others into a
        # temporary one that they delete afterwards.
        if dist is None or dist.extended.should_checkpoint:
            directory.mkdir(parents=True, exist_ok=True)
            state.write(str(directory / CKPT_PREFIX))
        else:
            scratch = ctx.run_dir / f"rank{ctx.rank}.workertemp"
            state.write(str(scratch / CKPT_PREFIX))
            shutil.rmtree(scratch, ignore_errors=True)

    def restore(directory: Any, step_found: int) -> None:
        # Every worker reads the chief's files; assert_consumed: every saved value found
        # its variable and every variable was restored.
        state.read(str(directory / CKPT_PREFIX)).assert_consumed()
        if int(k.numpy()) != step_found:
            raise RuntimeError(f"{directory}: update counter {int(k.numpy())} saved at "
                               f"step {step_found}")

    return save, restore, barrier


def probe_16bit_notice(tf: Any, ctx: WorkerContext, dtypes: list[Any]) -> list[str]:
    """TensorFlow's once-per-process notice that its oneDNN kernels do not run these 16-bit
    dtypes on this CPU (no AVX-512; the Eigen kernels do), provoked here by a tiny function
    while stderr is captured, and returned for the record instead of landing in the worker's
    log as an ERROR line (which would also read like the cause of any later failure)."""
    from sextant.backends.tf_backend import ONEDNN_16BIT_NOTICE, filtered_stderr

    if not dtypes:
        return []
    with filtered_stderr(ctx.run_dir / f"rank{ctx.rank}.tf-16bit.log",
                         (ONEDNN_16BIT_NOTICE,)) as dropped:
        for dtype in dtypes:
            # A reshape of a 16-bit tensor in a graph is enough for the rewrite pass to ask.
            probe = tf.function(lambda x, d=dtype: tf.cast(tf.reshape(tf.cast(x, d), (2, 2)),
                                                           tf.float32))
            probe(tf.zeros((4,))).numpy()
    return [line.split("] ", 1)[-1] for line in dropped]


# The checkpoint's file prefix inside a step directory: tf.train.Checkpoint.write makes
# ckpt.index and ckpt.data-00000-of-00001.
CKPT_PREFIX = "ckpt"


def _barrier(tf: Any, dist: Any, ctx: WorkerContext) -> Any:
    """A barrier across the MultiWorkerMirroredStrategy workers, outside the training step:
    a one-element all-reduce, traced once, whose value is read back (the read waits for
    every worker's contribution). Each worker calls it at the same points, in order."""
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=ctx.collective_timeout_s)

    @tf.function
    def reduce_one() -> Any:
        return dist.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.ones(()), options=options))

    def barrier() -> None:
        total = float(dist.experimental_local_results(reduce_one())[0].numpy())
        if total != dist.num_replicas_in_sync:
            raise RuntimeError(f"barrier: {total:g} of {dist.num_replicas_in_sync} replicas")

    return barrier


def _var_name(canonical: str) -> str:
    return canonical.replace(".", "_")
