"""One MindSpore worker, written the way MindSpore's functional training tutorials write a
step:

- the model is a Cell tree holding the canonical parameters (model.build), the gradient is
  `mindspore.value_and_grad` of the loss with respect to the optimizer's parameters, the
  update is `mindspore.experimental.optim.AdamW` called with the gradients;
- 'eager': PyNative, the forward and backward run op by op (MindSpore's AdamW and gradient
  reducer compile their own small graphs with `jit` inside, as they do for every user);
  'compiled': the whole step (forward, backward, gradient mean, norm, learning rate, AdamW)
  under `mindspore.jit` (static graph, MindSpore's Graph mode for one function);
- AdamW: `experimental.optim.AdamW` is torch's update (decay p *= 1 - lr*wd first, then
  p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)), one parameter group with decay
  (matrices, `sextant.workloads.init.decays`) and one without; the learning rate of update i is the
  workload's schedule (`sextant.workloads.schedule.lr_table`), written into the groups' learning-rate
  Parameters inside the step (it travels with the batch, so the step never recompiles);
- dp: MindSpore's dynamic cluster (`mindspore.communication.init()`, backend mccl on the
  CPU), one process per worker plus the scheduler process MindSpore needs, started by
  sextant's launcher as a service rank (see `serve_scheduler`); gradients averaged by
  `nn.DistributedGradReducer(mean=True)` (AllReduce of the sum, times 1/workers); the
  no-sync variant leaves the reducer out. Gradient accumulation sums the micro-batches'
  gradients locally and reduces once, as torch's `no_sync` does;
- checkpoint/resume: parameters, AdamW moments and the update counter through
  `mindspore.save_checkpoint(..., format="safetensors")` (arrays only: loading deserialises
  no Python objects), each rank its own file (dp replicas are identical; rank 0's is read back
  on every rank).

MindSpore is imported only inside the worker process, after `prepare_environment`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sextant import data
from sextant.backends import harness
from sextant.backends.harness import Description, Trainer
from sextant.workloads.init import decays
from sextant.pretrained.weights import initial_params
from sextant.measure.env import fingerprint, package_version
from sextant.measure.guard import guard_recompiles
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext

SCHEDULER_ROLE = "scheduler"
SCHEDULER_CODE = (
    "from sextant.launch.hosts import adopt_host\n"
    "adopt_host()\n"  # SIGKILLed with the rank that started it (SEXTANT_PARENT_PID)
    "import mindspore as ms\n"
    "from mindspore.communication import init\n"
    "ms.set_device('CPU')\n"
    "init()\n"  # MindSpore exits the process here once every worker has unregistered
)


def prepare_environment(ctx: WorkerContext) -> None:
    """MindSpore's settings, before it is imported: errors only in its logs (its INFO and
    WARNING lines, hundreds per run, go to the rank's stderr log otherwise), and the files
    it writes on a failure (analyze_fail.ir and the like) inside the run directory rather
    than the working directory. A value the user set wins."""
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("MS_OM_PATH", str(Path(ctx.run_dir).resolve() / "mindspore"))


def cluster_env(ctx: WorkerContext, workers: int) -> dict[str, str]:
    """The dynamic-cluster variables (what `msrun` sets) for this rank, from the plan: the
    scheduler listens on the port reserved for its rank; every timeout is the run's
    collective timeout (seconds)."""
    sched = ctx.roles.index(SCHEDULER_ROLE)
    timeout = str(max(1, int(ctx.collective_timeout_s)))
    env = {
        "MS_SCHED_HOST": ctx.addresses[sched],
        "MS_SCHED_PORT": str(ctx.ports[sched]),
        "MS_WORKER_NUM": str(workers),
        # Cluster building: how long the scheduler and the workers wait for each other.
        "MS_TOPO_TIMEOUT": timeout,
        # A CPU collective that a peer never joins fails after this long.
        "MS_CPU_COMM_OP_TIMEOUT": timeout,
    }
    if ctx.role != SCHEDULER_ROLE:
        env.update(MS_ROLE="MS_WORKER", MS_NODE_ID=str(ctx.rank))
    else:
        env["MS_ROLE"] = "MS_SCHED"
    return env


def serve_scheduler(ctx: WorkerContext) -> None:
    """The scheduler rank: run MindSpore's scheduler (a process of the cluster that trains
    nothing) until every worker has unregistered. MindSpore ends that process from inside
    `init()` as soon as the last worker unregisters, which can be before the workers have
    exited; sextant's launcher counts a service rank that exits first as a failure, so the
    scheduler runs in a child process and this rank stays until the launcher stops it.

    The child is in this rank's process group (the launcher kills the group at the end of
    the run or at its timeout) and dies with this rank (PR_SET_PDEATHSIG, via adopt_host).
    A scheduler that fails (a worker that never registered within MS_TOPO_TIMEOUT, or one
    whose heartbeats stopped) fails this rank with its error line."""
    env = {**os.environ, **cluster_env(ctx, ctx.strategy.workers),
           "SEXTANT_PARENT_PID": str(os.getpid())}
    log = ctx.run_dir / f"rank{ctx.rank}.scheduler.log"
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, "-c", SCHEDULER_CODE], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    code = child.wait()
    if code != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines()
                 if ln.startswith(("RuntimeError", "ValueError", "[ERROR]"))]
        raise RuntimeError(f"MindSpore's scheduler exited with code {code}: "
                           f"{lines[-1] if lines else 'no error line'} (log: {log})")
    while True:  # every worker is done; the launcher ends this rank when they have exited
        time.sleep(60)


def _wait_for_scheduler(host: str, port: int, timeout_s: float) -> None:
    """Block until the scheduler accepts connections. MindSpore 2.10's worker that first
    dials the scheduler before it listens keeps failing to register for many seconds (13 s
    and then over 30 s in two tries here) while its peer registers at once, so the worker
    only starts registering once the port is open."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"MindSpore's scheduler at {host}:{port} did not listen "
                                   f"within {timeout_s:.0f} s") from None
            time.sleep(0.05)


def _init_distributed(ctx: WorkerContext) -> None:
    """Join the dynamic cluster as worker `ctx.rank` (MS_NODE_ID fixes the rank id)."""
    from mindspore.communication import get_group_size, get_rank, init

    workers = ctx.strategy.workers
    env = cluster_env(ctx, workers)
    os.environ.update(env)
    _wait_for_scheduler(env["MS_SCHED_HOST"], int(env["MS_SCHED_PORT"]),
                        ctx.collective_timeout_s)
    init()  # backend mccl on the CPU
    if get_rank() != ctx.rank or get_group_size() != workers:
        raise RuntimeError(f"MindSpore dynamic cluster: rank {get_rank()} of "
                           f"{get_group_size()}, expected {ctx.rank} of {workers}")


def run(ctx: WorkerContext) -> RankResult:
    prepare_environment(ctx)
    if ctx.role == SCHEDULER_ROLE:
        serve_scheduler(ctx)
        raise AssertionError("unreachable: the scheduler rank serves until it is stopped")
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.device_context.cpu.op_tuning.threads_num(ctx.threads)
    if ctx.is_distributed:
        _init_distributed(ctx)
        # The training world is the workers; the scheduler is a service rank.
        ctx = dataclasses.replace(ctx, world=ctx.strategy.workers)
    return _train(ctx)


def _optimizer(ctx: WorkerContext, by_name: dict[str, Any]) -> Any:
    """AdamW with weight decay on the matrices only (sextant.workloads.init.decays)."""
    from mindspore.experimental.optim import AdamW

    spec = ctx.workload.optimizer
    decay = [p for name, p in by_name.items() if decays(name, tuple(p.shape))]
    plain = [p for name, p in by_name.items() if not decays(name, tuple(p.shape))]
    groups = [{"params": decay, "weight_decay": float(spec.weight_decay)}]
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    return AdamW(groups, lr=float(spec.lr), betas=(float(spec.beta1), float(spec.beta2)),
                 eps=float(spec.eps))


def _compile_count(leave_out: str = "") -> int:
    """Graphs MindSpore has compiled in this process (its `jit` cache: the compiled step,
    and in PyNative the optimizer's and reducer's own graphs), but for those of functions
    named `leave_out` (their cache keys start with the function's module and name)."""
    from mindspore.graph import api

    cache = getattr(api, "ms_compile_cache", ())
    return sum(1 for phase in cache
               if not (leave_out and phase.startswith(f"{__name__}.{leave_out}.")))


def _train(ctx: WorkerContext) -> RankResult:
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from sextant.backends.mindspore_backend import model as mm

    workload, strategy = ctx.workload, ctx.strategy
    params0 = initial_params(workload)
    net, by_name = mm.build(workload.model, params0)
    optimizer = _optimizer(ctx, by_name)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)
    summed = "sum-gradients" in (ctx.fault or "").split(",")
    # The test hook SEXTANT_TEST_FAULT=sum-gradients sums without dividing (mean=False).
    reducer = (nn.DistributedGradReducer(optimizer.parameters, mean=not summed,
                                         degree=ctx.world)
               if ctx.is_distributed else None)
    accum = strategy.grad_accum

    def step_fn(x: Any, y: Any, lr: Any, sync: bool) -> Any:
        if accum == 1:
            loss, grads = grad_fn(x, y)
        else:  # micro-batches summed locally, reduced once (torch: no_sync on all but last)
            micro = x.shape[0] // accum
            loss, grads = grad_fn(x[:micro], y[:micro])
            for k in range(1, accum):
                loss_k, grads_k = grad_fn(x[k * micro:(k + 1) * micro],
                                          y[k * micro:(k + 1) * micro])
                loss = loss + loss_k
                grads = tuple(g + gk for g, gk in zip(grads, grads_k))
            loss = loss / accum
            grads = tuple(g / accum for g in grads)
        if reducer is not None and sync:
            grads = reducer(grads)
        norm = ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads]))
        for group_lr in optimizer.lrs:
            ops.assign(group_lr, lr)
        optimizer(grads)
        return ops.stack([loss, norm])

    def train_step(x: Any, y: Any, lr: Any) -> Any:
        return step_fn(x, y, lr, True)

    def train_step_nosync(x: Any, y: Any, lr: Any) -> Any:
        return step_fn(x, y, lr, False)

    if strategy.mode == "compiled":
        sync_step, nosync_step = ms.jit(train_step), ms.jit(train_step_nosync)
    else:
        sync_step, nosync_step = train_step, train_step_nosync
    # The no-sync variant compiles once, after training (the exposed-communication pairs).
    guarded = guard_recompiles(lambda batch: sync_step(*batch), workload.measure.warmup_steps,
                               count=lambda: _compile_count(leave_out=train_step_nosync.__name__))
    lrs = lr_table(workload.optimizer, workload.steps)

    def fetch(i: int) -> tuple[Any, Any, Any]:
        x, y = data.local_batch(workload, i, ctx.rank, ctx.world, ctx.fault)
        if ctx.fault == "shape-change" and i == workload.measure.warmup_steps + 1:
            x, y = x[:-1], y[:-1]  # test hook: a batch of another shape after warm-up
        # The exposed-communication pairs run past the last step: the last rate again.
        return mm.tensor(x), mm.tensor(y), Tensor(lrs[min(i, len(lrs) - 1)])

    def block(handle: Any) -> None:
        # PyNative dispatches ops to a pipeline that runs them in order, so reading the
        # step's last output (its (loss, norm) pair, dispatched after AdamW) waits for the
        # whole step. mindspore.runtime.synchronize lists Ascend and GPU only: on the CPU its
        # first call logs an error and returns without waiting.
        handle.asnumpy()

    def to_floats(handles: list[Any]) -> list[tuple[float, float]]:
        return [(float(a), float(b)) for a, b in np.stack([h.asnumpy() for h in handles])]

    def final_params() -> dict[str, np.ndarray] | None:
        return mm.to_canonical(by_name) if ctx.rank == 0 else None

    save, restore = _checkpointing(ctx, by_name, optimizer)

    def describe() -> Description:
        nbytes = sum(v.nbytes for v in params0.values())
        compiled = strategy.mode == "compiled"
        return Description(
            # experimental.optim.AdamW allocates max_exp_avg_sq (AMSGrad's) beside the two
            # moments even when amsgrad is off.
            memory={"params": nbytes, "grads": None if compiled else nbytes,
                    "optimizer_state": 3 * nbytes},
            details={
                "optimizer": "mindspore.experimental.optim.AdamW (decay / no-decay groups)",
                "step": ("mindspore.jit(" if compiled else "PyNative ")
                        + "value_and_grad"
                        + (" + DistributedGradReducer(mean)" if reducer is not None else "")
                        + " + AdamW" + (")" if compiled else ""),
                "collectives": ("MindSpore dynamic cluster, mccl AllReduce (TCP)"
                                if reducer is not None else None),
                "precision": strategy.precision,
                "compiled_graphs": _compile_count(),
            },
            fingerprint=fingerprint(
                framework="mindspore",
                framework_version=package_version("mindspore"),
                device="CPU",
                threads=ctx.threads,
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            ),
        )

    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in params0.values()),
        fetch=fetch, step=guarded, block=block, to_floats=to_floats,
        step_nosync=(lambda batch: nosync_step(*batch)) if reducer is not None else None,
        rows_of=lambda batch: int(batch[0].shape[0]),
        final_params=final_params, describe=describe,
        save=save, restore=restore, barrier=_barrier(ctx),
    ))


def _barrier(ctx: WorkerContext) -> Any:
    """All workers meet: a one-element AllReduce, waited for (a no-op in one process)."""
    from mindspore import Tensor, ops

    allreduce = ops.AllReduce() if ctx.is_distributed else None
    one = Tensor(np.ones(1, np.float32))

    def barrier() -> None:
        if allreduce is not None:
            allreduce(one).asnumpy()  # waits for the collective (and all work before it)

    return barrier


def _checkpointing(ctx: WorkerContext, by_name: dict[str, Any], optimizer: Any
                   ) -> tuple[Any, Any]:
    """(save, restore): parameters, both AdamW moments and the update counter, as one
    safetensors file per rank through MindSpore's own save_checkpoint/load_checkpoint."""
    import mindspore as ms
    from mindspore import ops

    # exp_avg / exp_avg_sq are Parameter tuples in the order of optimizer.parameters.
    position = {id(p): i for i, p in enumerate(optimizer.parameters)}

    def state() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, p in by_name.items():
            i = position[id(p)]
            out[f"param.{name}"] = p
            out[f"exp_avg.{name}"] = optimizer.exp_avg[i]
            out[f"exp_avg_sq.{name}"] = optimizer.exp_avg_sq[i]
        out["update_counter"] = optimizer.state_step
        return out

    def save(directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        ms.save_checkpoint([{"name": k, "data": v} for k, v in state().items()],
                           str(directory / f"rank{ctx.rank}.safetensors"),
                           format="safetensors")

    def restore(directory: Path, step: int) -> None:
        # Every dp replica holds the same state: rank 0's file serves every rank.
        saved = ms.load_checkpoint(str(directory / "rank0.safetensors"), format="safetensors")
        targets = state()
        if set(saved) != set(targets):
            raise RuntimeError(f"{directory}: entries {sorted(set(saved) ^ set(targets))} "
                               "differ from this run's state")
        for key, target in targets.items():
            ops.assign(target, saved[key])
        counter = int(optimizer.state_step.asnumpy())
        if counter != step:
            raise RuntimeError(f"{directory}: update counter {counter} saved at step {step}")

    return save, restore
