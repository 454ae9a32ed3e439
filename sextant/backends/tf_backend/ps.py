"""Parameter-server training: ParameterServerStrategy driven by a ClusterCoordinator.

Processes (ProcessLayout): rank 0 is the coordinator ('chief' in TF_CONFIG) and the only
primary rank; then `ps` parameter servers and `workers` workers, which are service ranks: each
starts a `tf.distribute.Server` on its reserved loopback port and joins it. The launcher stops
them when the chief is done; one that dies fails the run, named by the launcher.

The chief creates the variables under the strategy's scope (round-robin over the parameter
servers, each parameter's AdamW moments colocated with it). Step i of the shared loop splits
global batch i into W shards (W workers) and schedules one closure per shard: W optimizer
updates, numbered i*W + r. A closure runs on whichever worker is free: it reads the current
parameters from the servers, computes the gradient of its shard on that worker (XLA for
'compiled'), and pushes it to the servers, where the AdamW update of each parameter runs next
to it (only gradients travel). The W updates of a step run concurrently and are not
aggregated: each may read parameters another is updating (asynchronous, Hogwild-style, as
TensorFlow's parameter-server training is). Losses therefore cannot match the synchronous
runs step for step; a PS run reports its convergence and its throughput. The learning-rate
schedule is indexed by update, stretched so that it is the workload's schedule as a function
of samples seen.

Timing: `block` waits for the step's W updates (the loop's contract: the step's work is done
when the clock stops), so a step's time is that of W concurrent updates on B/W samples each
and samples/s = global batch / step time, comparable with dp. TensorFlow's coordinator alone
would let a fast worker run ahead; the per-step wait is the measurement's, documented.

Test hook: SEXTANT_TEST_FAULT=kill-rank-R[-at-S] with R a service rank (a parameter server or
a worker) SIGKILLs that process once the chief has reported step S (default 2), as the loop's
own hook does for training ranks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from sextant import data
from sextant.backends import harness
from sextant.backends.harness import Description, Trainer
from sextant.backends.tf_backend.common import nbytes
from sextant.core.errors import UserError
from sextant.workloads.init import param_shapes
from sextant.pretrained.weights import initial_params
from sextant.core.cores import default_threads
from sextant.measure.env import fingerprint
from sextant.measure.guard import guard_recompiles
from sextant.measure.loop import Faults
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext

ASYNC_NOTE = (
    "parameter-server training is asynchronous: each step is {w} concurrent updates, one per "
    "worker on its 1/{w} of the global batch, each computed on parameters the others may be "
    "updating; losses do not match the synchronous runs step for step and grad_norms are the "
    "mean norm of the per-worker gradients, not the global one. Compare convergence and "
    "throughput, not per-step parity"
)
PS_INTER_OP_THREADS = 2


def cluster_of(ctx: WorkerContext) -> dict[str, list[str]]:
    """TF cluster spec from the process layout: one host:port per rank."""
    if len(ctx.ports) < ctx.world:
        raise UserError(
            f"tensorflow ps: the launcher reserved {len(ctx.ports)} ports for {ctx.world} ranks"
        )
    cluster: dict[str, list[str]] = {}
    for rank, role in enumerate(ctx.roles):
        cluster.setdefault(role, []).append(ctx.endpoint(rank))
    return cluster


def task_index(ctx: WorkerContext) -> int:
    return ctx.roles[: ctx.rank].count(ctx.role)


def worker_threads(ctx: WorkerContext) -> int:
    """Intra-op threads of a ps worker: the cores shared by the workers (the launcher's
    default divides them by the primary ranks, here only the chief)."""
    if ctx.strategy.threads is not None:
        return ctx.strategy.threads
    return default_threads(ctx.strategy.workers)


def update_lrs(opt: Any, steps: int, workers: int) -> np.ndarray:
    """Learning rate of each of the steps * workers updates: the workload's schedule as a
    function of samples seen (warm-up and cosine stretched by the updates per step)."""
    return lr_table(dataclasses.replace(opt, warmup_steps=opt.warmup_steps * workers),
                    steps * workers)


def run(ctx: WorkerContext) -> RankResult:
    # gRPC errors surface to the caller at once instead of being retried by the channel, so
    # the coordinator sees a dead server (TensorFlow's parameter-server guide sets this).
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    if ctx.role == "chief":
        return _coordinate(ctx)
    _serve(ctx)
    raise AssertionError("unreachable: Server.join() returned")


def _serve(ctx: WorkerContext) -> None:
    from sextant.backends.tf_backend import import_tensorflow

    tf = import_tensorflow(ctx, scratch=False)

    tf.get_logger().setLevel("ERROR")
    threads = worker_threads(ctx) if ctx.role == "worker" else 1
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=PS_INTER_OP_THREADS,
    )
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster_of(ctx)), job_name=ctx.role, task_index=task_index(ctx),
        protocol="grpc", config=config, start=True,
    )
    kill_at = Faults(ctx).kill_at
    if kill_at is not None:
        threading.Thread(target=_die_after_chief_step, args=(ctx, kill_at), daemon=True).start()
    server.join()


def _die_after_chief_step(ctx: WorkerContext, step: int) -> None:
    """Test hook: SIGKILL this service process once the chief has logged `step`."""
    path = ctx.run_dir / "rank0.events.jsonl"
    while True:
        try:
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "step" and event.get("step", 0) >= step:
                    os.kill(os.getpid(), signal.SIGKILL)
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.02)


def _coordinate(ctx: WorkerContext) -> RankResult:
    from sextant.backends.tf_backend import import_tensorflow

    tf = import_tensorflow(ctx)

    from sextant.backends.tf_backend import model as tm

    workload, strategy = ctx.workload, ctx.strategy
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": cluster_of(ctx), "task": {"type": "chief", "index": 0},
    })
    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
    tf.config.threading.set_inter_op_parallelism_threads(PS_INTER_OP_THREADS)
    dist = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(dist)

    jit = strategy.mode == "compiled"
    spec = workload.model
    shapes = param_shapes(spec)
    names = list(shapes)
    params0 = initial_params(workload)
    w = strategy.workers
    opt = tm.AdamW(workload.optimizer, update_lrs(workload.optimizer, workload.steps, w),
                   names, shapes)
    with dist.scope():
        params = [tf.Variable(params0[n], name=n.replace(".", "_")) for n in names]
        ms, vs = [], []
        for n, p in zip(names, params):
            with dist.extended.colocate_vars_with(p):
                ms.append(tf.Variable(np.zeros_like(params0[n]), name="m"))
                vs.append(tf.Variable(np.zeros_like(params0[n]), name="v"))
    placement = sorted({p.device for p in params})

    grad_fn = tf.function(lambda values, x, y: tm.value_and_grad(spec, names, values, x, y),
                          jit_compile=jit)

    def replica(x: Any, y: Any, u: Any) -> Any:
        loss, grads = grad_fn([p.read_value() for p in params], x, y)
        norm = tm.global_norm(grads)
        for i, (p, g, m, v) in enumerate(zip(params, grads, ms, vs)):
            with tf.device(p.device):  # the update runs on the parameter's server
                opt.update(i, p, g, m, v, opt.scalars(u))
        return tf.stack([loss, norm])

    @tf.function
    def worker_fn(x: Any, y: Any, u: Any) -> Any:
        return dist.run(replica, args=(x, y, u))

    # The coordinator traces worker_fn when scheduling; a retrace after warm-up would mean an
    # input changed signature (the guard only reads the tracing count here).
    check_traces = guard_recompiles(lambda: None, workload.measure.warmup_steps,
                                    count=worker_fn.experimental_get_tracing_count)

    def fetch(i: int) -> list[tuple[Any, Any, Any]]:
        # Global batch i in W shards, one per update; update r of step i is number i*W + r.
        x, y = data.global_batch(workload, i)
        return [(tf.constant(data.shard(x, r, w)), tf.constant(data.shard(y, r, w)),
                 tf.constant(i * w + r, tf.int32)) for r in range(w)]

    def step(batch: list[tuple[Any, Any, Any]]) -> list[Any]:
        handles = [coordinator.schedule(worker_fn, args=args) for args in batch]
        check_traces()
        return handles

    def block(handles: list[Any]) -> None:
        for handle in handles:
            handle.fetch()

    def to_floats(steps: list[list[Any]]) -> list[tuple[float, float]]:
        # Per step: the mean of its W updates' losses (each on its shard, at the parameters
        # that update read) and of their gradient norms (each of a B/W-sample gradient).
        return [tuple(np.mean([np.asarray(h.fetch()) for h in handles], axis=0).tolist())
                for handles in steps]

    def final_params() -> dict[str, np.ndarray]:
        coordinator.join()
        return {n: np.asarray(p.numpy()) for n, p in zip(names, params)}

    def describe() -> Description:
        coordinator.join()
        return Description(
            memory={  # held by the parameter servers, not by the chief
                "params": None, "grads": None, "optimizer_state": None,
                "on_parameter_servers": 3 * nbytes(params0.values()),
            },
            details={
                "optimizer": "AdamW by hand on tf.Variables (torch.optim.AdamW semantics), "
                             "applied on the parameter servers",
                "wrapping": "ParameterServerStrategy + ClusterCoordinator + "
                            + ("tf.function(jit_compile=True) gradient" if jit
                               else "tf.function"),
                "collectives": None,
                "xla": jit,
                "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                "parameter_servers": strategy.ps,
                "variable_placement": placement,
                "worker_threads": worker_threads(ctx),
                "updates_per_step": w,
                "note": ASYNC_NOTE.format(w=w),
            },
            fingerprint=fingerprint(
                framework="tensorflow",
                framework_version=tf.__version__,
                threads=worker_threads(ctx),  # intra-op threads of each training worker
                chief_threads=ctx.threads,
                inter_op_threads=PS_INTER_OP_THREADS,
                device="coordinator /job:chief; workers /job:worker/device:CPU:0",
                xla=jit,
                onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            ),
        )

    try:
        return harness.train(ctx, Trainer(
            n_params=sum(v.size for v in params0.values()),
            fetch=fetch, step=step, block=block, to_floats=to_floats,
            rows_of=lambda batch: workload.global_batch,
            final_params=final_params, describe=describe,
        ))
    except tf.errors.OpError as exc:
        raise _named_failure(ctx, exc) from exc


def _named_failure(ctx: WorkerContext, exc: Exception) -> Exception:
    """The coordinator's error, naming the rank of the server it lost when it can."""
    text = str(exc)
    # A lost parameter server is reported through the worker that ran the closure, so its
    # path comes second in the message: look for the server first.
    match = (re.search(r"/job:(ps)/replica:\d+/task:(\d+)", text)
             or re.search(r"/job:(worker)/replica:\d+/task:(\d+)", text))
    if match is None:
        return exc
    role, index = match.group(1), int(match.group(2))
    ranks = [r for r, name in enumerate(ctx.roles) if name == role]
    rank = ranks[index] if index < len(ranks) else None
    # Give the launcher a moment to see the dead process itself (it names the first rank that
    # exited), so the run's error names the cause rather than this coordinator.
    time.sleep(2.0)
    return RuntimeError(
        f"tensorflow ps: lost {role} task {index} (rank {rank}): "
        f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
    )
