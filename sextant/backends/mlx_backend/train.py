"""One MLX worker, written the way MLX's own examples (mlx-examples' transformer and MNIST
training) write a step:

- the parameters are MLX's tree (model.to_tree), the gradient is `mx.value_and_grad` of the
  loss, the update is an `mlx.optimizers` optimizer's `apply_gradients`;
- 'compiled': the whole step (forward, backward, gradient mean, norm, AdamW) under
  `mx.compile` with the parameters and the optimizer state declared as its captured
  `inputs`/`outputs`; 'eager': the same function uncompiled (MLX is lazy either way: the step
  builds a graph that `mx.eval` runs, so `block` is where the work happens);
- AdamW: `optim.AdamW(bias_correction=True)` is torch.optim.AdamW's update (bias-corrected
  moments, eps added to sqrt(v_hat), decoupled decay lr*wd*p); one per parameter group in an
  `optim.MultiOptimizer`, since decay applies to matrices only (`sextant.workloads.init.decays`); the
  learning rate is the workload's schedule, indexed by the optimizer's update counter;
- dp: `mx.distributed` over its ring (TCP) backend, one process per rank, the gradients
  averaged by `nn.average_gradients` (one flat all_sum per 32 MiB, as MLX's own data-parallel
  example); the no-sync variant leaves it out;
- bf16: forward/backward on bf16 copies of the fp32 parameters, loss in fp32;
- checkpoint/resume: the parameter tree and the optimizer state (moments, update counter) as
  safetensors (`mx.save_safetensors`: arrays only, nothing unpickled), each rank its own file
  (dp replicas are identical; rank 0's is read back on every rank).
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sextant import data
from sextant.backends import harness, precision
from sextant.backends.harness import Description, Trainer
from sextant.workloads.init import adapter_shapes, decays, param_shapes
from sextant.pretrained.weights import initial_params, trainable
from sextant.measure.env import fingerprint, package_version
from sextant.measure.guard import guard_recompiles
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext


def run(ctx: WorkerContext) -> RankResult:
    group = _init_distributed(ctx) if ctx.is_distributed else None
    return _train(ctx, group)


def _init_distributed(ctx: WorkerContext) -> Any:
    """Join the ring: MLX reads the hosts (one "address:port" per rank, in rank order) from a
    JSON file named by MLX_HOSTFILE and this process's rank from MLX_RANK."""
    import json

    import mlx.core as mx

    hosts = ctx.run_dir / f"rank{ctx.rank}.mlx-hosts.json"
    hosts.write_text(json.dumps([[ctx.endpoint(r)] for r in range(ctx.world)]))
    os.environ["MLX_HOSTFILE"] = str(hosts)
    os.environ["MLX_RANK"] = str(ctx.rank)
    group = mx.distributed.init(strict=True, backend="ring")
    if group.size() != ctx.world or group.rank() != ctx.rank:
        raise RuntimeError(f"mx.distributed ring: rank {group.rank()} of {group.size()}, "
                           f"expected {ctx.rank} of {ctx.world}")
    return group


def _optimizer(ctx: WorkerContext) -> Any:
    import mlx.core as mx
    import mlx.optimizers as optim

    spec = ctx.workload.optimizer
    table = mx.array(lr_table(spec, ctx.workload.steps).astype(np.float32))
    last = ctx.workload.steps - 1

    def schedule(step: mx.array) -> mx.array:
        return table[mx.minimum(step, last)]

    def adamw(weight_decay: float) -> Any:
        return optim.AdamW(learning_rate=schedule, betas=[spec.beta1, spec.beta2],
                           eps=spec.eps, weight_decay=weight_decay, bias_correction=True)

    shapes = {**param_shapes(ctx.workload.model),
              **adapter_shapes(ctx.workload.model, ctx.workload.finetune)}
    return optim.MultiOptimizer([adamw(spec.weight_decay), adamw(0.0)],
                                [lambda name, _: decays(name, shapes[name])])


def _train(ctx: WorkerContext, group: Any) -> RankResult:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_map

    from sextant.backends.mlx_backend import model as mm

    workload, strategy = ctx.workload, ctx.strategy
    spec = workload.model
    params0 = initial_params(workload)
    # What trains is the tree the optimizer and the gradient see: every parameter, or
    # LoRA's adapters, with the frozen base a constant beside them (no gradient, no state).
    params, frozen = _split(workload, params0)
    optimizer = _optimizer(ctx)
    optimizer.init(params)
    holder = {"params": params}
    state = [holder, optimizer.state]
    scale = workload.finetune.scale
    compute = precision.half_dtype(mx, strategy.precision, mx.float32)
    summed = "sum-gradients" in (ctx.fault or "").split(",")

    with_base = _with_base(frozen)

    def loss_of(p: Any, x: mx.array, y: mx.array) -> mx.array:
        p = with_base(p)
        if compute != mx.float32:
            p = tree_map(lambda a: a.astype(compute), p)
            if x.dtype == mx.float32:
                x = x.astype(compute)
        return mm.loss_fn(spec, p, x, y, scale)

    value_and_grad = mx.value_and_grad(loss_of)

    def step_fn(x: mx.array, y: mx.array, sync: bool) -> mx.array:
        loss, grads = value_and_grad(holder["params"], x, y)
        if group is not None and sync:
            # The test hook SEXTANT_TEST_FAULT=sum-gradients sums without dividing.
            grads = (tree_map(lambda g: mx.distributed.all_sum(g, group=group), grads)
                     if summed else nn.average_gradients(grads, group=group))
        norm = mx.sqrt(sum((mx.sum(mx.square(g)) for _, g in tree_flatten(grads)),
                           mx.array(0.0)))
        _assign(holder["params"], optimizer.apply_gradients(grads, holder["params"]))
        return mx.stack([loss, norm])

    def synced(x: mx.array, y: mx.array) -> mx.array:
        return step_fn(x, y, True)

    def unsynced(x: mx.array, y: mx.array) -> mx.array:
        return step_fn(x, y, False)

    traces = {"n": 0}
    if strategy.mode == "compiled":
        def counted(x: mx.array, y: mx.array) -> mx.array:
            traces["n"] += 1  # runs only while mx.compile traces
            return synced(x, y)

        sync_step = mx.compile(counted, inputs=state, outputs=state)
        nosync_step = mx.compile(unsynced, inputs=state, outputs=state)
    else:
        sync_step, nosync_step = synced, unsynced
    guarded = guard_recompiles(lambda batch: sync_step(*batch), workload.measure.warmup_steps,
                               count=lambda: traces["n"])

    def fetch(i: int) -> tuple[mx.array, mx.array]:
        x, y = data.local_batch(workload, i, ctx.rank, ctx.world, ctx.fault)
        return mx.array(x), mx.array(y)

    def block(handle: mx.array) -> None:
        mx.eval(handle, state)  # MLX is lazy: the step's graph runs here

    def to_floats(handles: list[mx.array]) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in np.array(mx.stack(handles)).tolist()]

    def final_params() -> dict[str, np.ndarray] | None:
        trained = mm.to_canonical(holder["params"]) if ctx.rank == 0 else None
        return None if trained is None else {k: trained.get(k, v) for k, v in params0.items()}

    save, restore = _checkpointing(ctx, holder, optimizer)

    def describe() -> Description:
        nbytes = sum(v.nbytes for v in params0.values())
        trained = sum(v.nbytes for _, v in tree_flatten(holder["params"]))
        return Description(
            memory={"params": nbytes, "frozen_params": nbytes - trained,
                    "grads": None,  # live only inside the step's graph
                    "optimizer_state": 2 * trained},
            details={
                "optimizer": "mlx.optimizers.MultiOptimizer(AdamW(bias_correction=True) "
                             "decay / no-decay)",
                "step": ("mx.compile(value_and_grad + " if strategy.mode == "compiled"
                         else "eager (lazy graph, mx.eval per step) value_and_grad + ")
                        + ("nn.average_gradients + " if group is not None else "")
                        + "AdamW" + (")" if strategy.mode == "compiled" else ""),
                "collectives": "mx.distributed ring (TCP)" if group is not None else None,
                "precision": strategy.precision,
            },
            fingerprint=fingerprint(
                framework="mlx",
                framework_version=package_version("mlx"),
                mlx_cpu=package_version("mlx-cpu"),
                device=str(mx.default_device()),
                threads=ctx.threads,
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            ),
        )

    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in params0.values()),
        n_trainable=sum(v.size for _, v in tree_flatten(holder["params"])),
        fetch=fetch, step=guarded, block=block, to_floats=to_floats,
        step_nosync=(lambda batch: nosync_step(*batch)) if group is not None else None,
        final_params=final_params, describe=describe,
        save=save, restore=restore, barrier=_barrier(group),
    ))


def _split(workload: Any, params0: dict[str, np.ndarray]) -> tuple[Any, list[tuple[str, Any]]]:
    """(the tree that trains, the frozen base as flat (name, array) pairs): everything and
    nothing in full fine-tuning, LoRA's adapters and the rest under LoRA."""
    from mlx.utils import tree_flatten

    from sextant.backends.mlx_backend import model as mm

    train = {k: v for k, v in params0.items() if trainable(workload, k)}
    rest = {k: v for k, v in params0.items() if k not in train}
    return mm.to_tree(train), tree_flatten(mm.to_tree(rest)) if rest else []


def _with_base(frozen: list[tuple[str, Any]]) -> Callable[[Any], Any]:
    """The model's whole tree from the training tree: the frozen base joined back in."""
    from mlx.utils import tree_flatten, tree_unflatten

    if not frozen:
        return lambda tree: tree
    return lambda tree: tree_unflatten(frozen + tree_flatten(tree))


def _assign(tree: Any, new: Any) -> None:
    """Put the updated arrays into the parameter tree in place, as nn.Module.update does:
    the tree keeps its identity and key order, which mx.compile's captured state is keyed by
    (MultiOptimizer returns its groups' parameters in another order)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        if isinstance(value, (dict, list)):
            _assign(value, new[key])
        else:
            tree[key] = new[key]


def _barrier(group: Any) -> Any:
    """All ranks meet: a one-element all_sum, evaluated (a no-op in one process)."""
    import mlx.core as mx

    def barrier() -> None:
        if group is not None:
            mx.eval(mx.distributed.all_sum(mx.ones(1), group=group))

    return barrier


def _checkpointing(ctx: WorkerContext, holder: dict[str, Any], optimizer: Any
                   ) -> tuple[Any, Any]:
    """(save, restore): the parameter tree and the optimizer state as safetensors."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    def save(directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(directory / f"rank{ctx.rank}.params.safetensors"),
                            dict(tree_flatten(holder["params"])))
        mx.save_safetensors(str(directory / f"rank{ctx.rank}.optimizer.safetensors"),
                            dict(tree_flatten(optimizer.state)))

    def restore(directory: Path, step: int) -> None:
        # Every dp replica holds the same state: rank 0's file serves every rank.
        params = mx.load(str(directory / "rank0.params.safetensors"))
        opt = mx.load(str(directory / "rank0.optimizer.safetensors"))
        assert isinstance(params, dict) and isinstance(opt, dict)  # safetensors: name -> array
        _assign(holder["params"], tree_unflatten(list(params.items())))
        # In place: the compiled step captured these dictionaries (its inputs/outputs).
        for inner, saved in zip(optimizer.optimizers, tree_unflatten(list(opt.items()))["states"]):
            inner.state.clear()
            inner.state.update(saved)
        counters = [int(s["step"].item()) for s in optimizer.state["states"]]
        if counters != [step] * len(counters):
            raise RuntimeError(f"{directory}: update counters {counters} saved at step {step}")

    return save, restore
