"""One PaddlePaddle worker, written the way Paddle's own dygraph recipes (PaddleNLP's trainer,
the `paddle.DataParallel` and `paddle.jit.to_static` guides) write a step:

- the model is a `paddle.nn.Layer` holding the canonical parameters (model.py), its loss
  computed inside the layer (`WithLoss`), so that to_static and DataParallel see one layer;
- 'compiled': `paddle.jit.to_static(full_graph=True)` converts the layer's forward (model and
  loss) into one static program (Paddle's AST transcription, run by its PIR executor; the
  backward is that program's generated grad program); the gradient sync, norm and AdamW
  stay in dygraph, as in Paddle's guides. 'eager': plain dygraph;
- AdamW: `paddle.optimizer.AdamW` with `apply_decay_param_fun` selecting the matrices
  (`sextant.workloads.init.decays`, by Paddle's internal parameter names) and the learning rate set
  from the workload's schedule before every update (`set_lr`). Its kernel is torch's
  update rearranged: decay lr*wd*p from the old parameter first, then
  lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps*sqrt(1-b2^t)) (docs/paddle.md);
- dp: `paddle.distributed.init_parallel_env` over gloo, one process per rank started by
  sextant's launcher (not `paddle.distributed.launch`), then `paddle.DataParallel`, whose
  reducer scales each fused gradient bucket by 1/world and all-reduces it during backward;
  the no-sync variant runs backward under `no_sync()`;
- gradient accumulation: K micro-batches of the rank's rows, each loss divided by K, the
  sync on the last one only;
- checkpoint/resume: the model's and the optimizer's state dicts through `paddle.save` /
  `paddle.load` with `safetensors=True` (arrays only, nothing unpickled), keyed by
  canonical names; every dp replica holds the same state, so rank 0's files serve every rank.

bf16 is refused before a worker starts (the capabilities list fp32 only): Paddle's autocast
on CPU leaves the matmuls in fp32, so a "bf16" run would be an fp32 run under another name.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle
import paddle.distributed as dist

from sextant import data
from sextant.backends import harness
from sextant.backends.harness import Description, Trainer
from sextant.backends.paddle_backend import model as pm
from sextant.workloads.init import decays
from sextant.pretrained.weights import initial_params
from sextant.measure.env import fingerprint, package_version
from sextant.measure.guard import guard_recompiles
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext

GLOO_TIMEOUT_S = 30
"""Paddle 3.3's ProcessGroupGloo keeps gloo's default timeout (no Python option sets it): a
collective a peer does not join within 30 s fails with gloo's TIMEOUT error."""


def run(ctx: WorkerContext) -> RankResult:
    paddle.set_device("cpu")
    if ctx.is_distributed:
        _init_distributed(ctx)
    return _train(ctx)


def _init_distributed(ctx: WorkerContext) -> None:
    """Join the gloo process group. `init_parallel_env` reads its rank, world and endpoints
    from Paddle's launcher variables, set here from sextant's plan: PADDLE_MASTER is the
    rendezvous (Paddle's TCPStore, served by rank 0, waits up to its fixed 900 s for the
    others), PADDLE_TRAINER_ENDPOINTS one address per rank (the plan's per-rank ports),
    PADDLE_DISTRI_BACKEND=gloo selects the CPU process group."""
    os.environ.update({
        "PADDLE_DISTRI_BACKEND": "gloo",
        "PADDLE_TRAINER_ID": str(ctx.rank),
        "PADDLE_TRAINERS_NUM": str(ctx.world),
        "PADDLE_MASTER": f"{ctx.master_addr}:{ctx.master_port}",
        "PADDLE_TRAINER_ENDPOINTS": ",".join(ctx.endpoint(r) for r in range(ctx.world)),
        "PADDLE_CURRENT_ENDPOINT": ctx.endpoint(ctx.rank),
        "PADDLE_LOCAL_RANK": str(ctx.local_rank),
    })
    dist.init_parallel_env()
    if dist.get_rank() != ctx.rank or dist.get_world_size() != ctx.world:
        raise RuntimeError(f"paddle.distributed: rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}, expected {ctx.rank} of {ctx.world}")


def _optimizer(ctx: WorkerContext, params: dict[str, Any]) -> Any:
    """AdamW over every parameter, decaying the matrices only."""
    spec = ctx.workload.optimizer
    decayed = {p.name for name, p in params.items() if decays(name, tuple(p.shape))}
    return paddle.optimizer.AdamW(
        learning_rate=float(spec.lr), beta1=spec.beta1, beta2=spec.beta2, epsilon=spec.eps,
        parameters=list(params.values()), weight_decay=spec.weight_decay,
        apply_decay_param_fun=lambda name: name in decayed,
    )


class _Step:
    """The optimizer step: forward/backward over the micro-batches (the gradient sync on the
    last one only), the global gradient norm, the schedule's learning rate, AdamW. Returns
    the (loss, norm) pair as a tensor: no host transfer."""

    def __init__(self, ctx: WorkerContext, module: Any, dp: Any, optimizer: Any,
                 params: list[Any]) -> None:
        self.ctx, self.module, self.dp, self.optimizer, self.params = (
            ctx, module, dp, optimizer, params)
        self.lrs = lr_table(ctx.workload.optimizer, ctx.workload.steps).tolist()
        self.updates = 0
        """Optimizer updates so far (the schedule's index; set on resume)."""
        self.accounting: dict[str, int] = {}
        """Bytes of parameters, gradients and optimizer state, read at the first update."""
        # The deliberate bug behind SEXTANT_TEST_FAULT=sum-gradients: the sum an all-reduce
        # without the division by the world size gives (DataParallel's mean times world).
        self.summed = dp is not None and "sum-gradients" in (ctx.fault or "").split(",")

    def sync_context(self, last: bool, sync: bool) -> Any:
        if self.dp is not None and not (last and sync):
            return self.dp.no_sync()
        return contextlib.nullcontext()

    def __call__(self, batch: tuple[Any, Any], sync: bool = True) -> Any:
        x, y = batch
        accum = self.ctx.strategy.grad_accum
        if accum == 1:
            with self.sync_context(True, sync):
                loss = self.module(x, y)
                loss.backward()
            total = loss.detach()
        else:
            total = paddle.zeros([], dtype="float32")
            for k, (xk, yk) in enumerate(zip(paddle.chunk(x, accum), paddle.chunk(y, accum))):
                with self.sync_context(k == accum - 1, sync):
                    loss = self.module(xk, yk) / accum
                    loss.backward()
                total = total + loss.detach()
        grads = [p.grad for p in self.params]
        if self.summed and sync:
            with paddle.no_grad():
                for g in grads:
                    g.scale_(float(self.ctx.world))
        norm = paddle.sqrt(paddle.add_n([paddle.sum(paddle.square(g)) for g in grads]))
        self.optimizer.set_lr(self.lrs[min(self.updates, len(self.lrs) - 1)])
        self.optimizer.step()
        if not self.accounting:
            self.accounting.update(
                params=_nbytes(self.params), grads=_nbytes(grads),
                optimizer_state=_nbytes(self.optimizer.state_dict().values()))
        self.optimizer.clear_grad(set_to_zero=False)
        self.updates += 1
        return paddle.stack([total.reshape([]), norm.reshape([])])


def _nbytes(tensors: Any) -> int:
    return int(sum(t.numel().item() * t.element_size() for t in tensors))


def _compile(ctx: WorkerContext, module: Any) -> tuple[Any, Any]:
    """(the layer to call, a count of its static programs): to_static with the AST
    transcription of the whole forward, or the layer itself (eager, count 0)."""
    if ctx.strategy.mode != "compiled":
        return module, lambda: 0
    static = paddle.jit.to_static(module, full_graph=True)
    forward = static.forward
    return static, lambda: len(forward.program_cache)


def _train(ctx: WorkerContext) -> RankResult:
    workload, strategy = ctx.workload, ctx.strategy
    values = initial_params(workload)
    net = pm.build(workload.model)
    params = pm.parameters_by_name(net, list(values))
    pm.load_canonical(params, values)
    module, programs = _compile(ctx, pm.WithLoss(net))
    dp = paddle.DataParallel(module) if ctx.is_distributed else None
    optimizer = _optimizer(ctx, params)
    step = _Step(ctx, dp if dp is not None else module, dp, optimizer, list(params.values()))
    guarded = guard_recompiles(step, workload.measure.warmup_steps, count=programs)

    def fetch(i: int) -> tuple[Any, Any]:
        x, y = data.local_batch(workload, i, ctx.rank, ctx.world, ctx.fault)
        return paddle.to_tensor(x), paddle.to_tensor(y)

    def block(handle: Any) -> None:
        """Paddle's CPU kernels run synchronously: the step is done when it returns."""

    def to_floats(handles: list[Any]) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in paddle.stack(handles).numpy().tolist()]

    def final_params() -> dict[str, np.ndarray] | None:
        return pm.export_canonical(params) if ctx.rank == 0 else None

    save, restore = _checkpointing(ctx, params, optimizer, step)

    def describe() -> Description:
        return Description(
            memory=step.accounting,
            details={
                "optimizer": "paddle.optimizer.AdamW (apply_decay_param_fun: matrices)",
                "step": ("paddle.jit.to_static(full_graph=True) forward + loss"
                         if strategy.mode == "compiled" else "dygraph")
                        + (" under paddle.DataParallel" if dp is not None else ""),
                "static_programs": programs() if strategy.mode == "compiled" else None,
                "collectives": "gloo (paddle.distributed)" if dp is not None else None,
                # What bounds a collective a peer does not join (not the plan's
                # collective_timeout_s, which Paddle gives no way to set).
                "collective_timeout_s": GLOO_TIMEOUT_S if dp is not None else None,
                "precision": strategy.precision,
            },
            fingerprint=fingerprint(
                framework="paddle",
                framework_version=paddle.__version__,
                paddlepaddle=package_version("paddlepaddle"),
                device=str(paddle.get_device()),
                threads=ctx.threads,
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            ),
        )

    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in values.values()),
        fetch=fetch, step=guarded, block=block, to_floats=to_floats,
        step_nosync=(lambda batch: step(batch, sync=False)) if dp is not None else None,
        final_params=final_params, describe=describe,
        save=save, restore=restore, barrier=_barrier(dp is not None),
    ))


def _barrier(distributed: bool) -> Any:
    def barrier() -> None:
        if distributed:
            dist.barrier()

    return barrier


def _optimizer_key(native: str, canonical_of: dict[str, str]) -> str:
    """An optimizer state key with its parameter's internal name ("linear_3.w_0_moment1_0")
    replaced by the canonical one ("blocks.0.mlp.fc.weight/moment1_0"): internal names
    depend on the order layers were created in, canonical ones do not."""
    for internal, canonical in canonical_of.items():
        if native.startswith(internal + "_"):
            return f"{canonical}/{native[len(internal) + 1:]}"
    raise RuntimeError(f"optimizer state {native!r} belongs to no parameter")


def _checkpointing(ctx: WorkerContext, params: dict[str, Any], optimizer: Any, step: _Step
                   ) -> tuple[Any, Any]:
    """(save, restore): the parameters and the optimizer state (moments, beta powers) as
    safetensors through paddle.save/paddle.load."""
    canonical_of = {p.name: name for name, p in params.items()}

    def save(directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        paddle.save(dict(params), str(directory / f"rank{ctx.rank}.params.safetensors"),
                    safetensors=True)
        state = {_optimizer_key(key, canonical_of): value
                 for key, value in optimizer.state_dict().items()}
        paddle.save(state, str(directory / f"rank{ctx.rank}.optimizer.safetensors"),
                    safetensors=True)

    def restore(directory: Path, step_found: int) -> None:
        # Every dp replica holds the same state: rank 0's files serve every rank.
        saved = paddle.load(str(directory / "rank0.params.safetensors"), safetensors=True)
        if set(saved) != set(params):
            raise RuntimeError(f"{directory}: parameters {sorted(set(saved) ^ set(params))} "
                               "differ from the model's")
        for name, p in params.items():
            p.set_value(saved[name])
        opt = paddle.load(str(directory / "rank0.optimizer.safetensors"), safetensors=True)
        internal = {name: p.name for name, p in params.items()}
        native = {}
        for key, value in opt.items():
            canonical, _, suffix = key.partition("/")
            if canonical not in internal:
                raise RuntimeError(f"{directory}: optimizer state {key!r} of no parameter")
            native[f"{internal[canonical]}_{suffix}"] = value
        optimizer.set_state_dict(native)
        step.updates = step_found

    return save, restore
