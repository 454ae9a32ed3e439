"""One DeepSpeed worker: the torch model wrapped by `deepspeed.initialize`, trained under the
shared harness.

The way DeepSpeed's own tutorials do it, with sextant's launcher in place of the `deepspeed`
launcher: `deepspeed.init_distributed` from the worker context (gloo on CPU, nccl on CUDA),
the canonical torch model (sextant.backends.torch_backend.model), torch.optim.AdamW as the
client optimizer (the same parameter groups and kernel as the torch backend, so fp32 losses
are torch's), the generated config of `config.ds_config`, then per micro-batch
`loss = engine(x, y); engine.backward(loss); engine.step()` (the engine divides by the
accumulation steps, reduces and updates at the boundary). The learning rate is set on the
optimizer's groups before the boundary's `engine.step()`, from sextant.workloads.schedule.lr_table.

The global gradient norm: ZeRO stages 1-3 compute it inside their step (over the reduced,
partitioned gradients) and keep it as a tensor (`engine.get_global_grad_norm()`); stage 0
does not compute one without clipping, so it is taken from the reduced gradients before the
update, as the torch backend does. Either way no host transfer in the step.

Just-in-time ops: on CPU, DeepSpeed's communication backend loads a shared-memory
all-reduce op (deepspeed_shm_comm) whenever it starts, building it with ninja the first time
(203 s measured on this project's 2-core machine under load; 25-40 s on an idle one). The op
serves only `inference_all_reduce`, which training never calls (DeepSpeed falls back to
torch.distributed without it), so the worker skips it (`_skip_inference_ops`). Should a
DeepSpeed version move that hook, the op is built before anything else instead, timed, so the
build is reported apart (details.jit_ops) and never lands in a training step; any other op
built during the run is listed there too. The build cache is $TORCH_EXTENSIONS_DIR when set,
else `.deepspeed-ops` beside the run directories (the results store's `runs/`), never the
user's home.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sextant import data
from sextant.backends import harness
from sextant.backends.deepspeed_backend import model as dm
from sextant.backends.deepspeed_backend.config import ds_config
from sextant.backends.harness import Description, Trainer
from sextant.backends.torch_backend.model import canonical_from_state
from sextant.backends.torch_backend.train import (
    adamw,
    adamw_groups,
    device_fingerprint,
    loop_functions,
    select_device,
)
from sextant.backends import precision
from sextant.workloads.init import adapter_shapes
from sextant.pretrained.weights import initial_params, trainable
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext

CHECKPOINT_TAG = "deepspeed"
"""The tag (sub-directory) engine.save_checkpoint writes inside sextant's step directory."""
JIT_OPS = ("ShareMemCommBuilder",)
"""DeepSpeed op builders its start-up loads (and builds on first use) on this backend's path."""


def extensions_dir(ctx: WorkerContext) -> tuple[Path, str]:
    """(the op build cache, where the choice came from); sets TORCH_EXTENSIONS_DIR."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"]), "TORCH_EXTENSIONS_DIR"
    path = ctx.run_dir.parent / ".deepspeed-ops"
    os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    return path, "beside the run directories"


def _skip_inference_ops() -> dict[str, dict[str, Any]] | None:
    """Keep DeepSpeed's communication backend from loading (and on first use building) its
    inference-only shm all-reduce op; None where this DeepSpeed has no such hook."""
    import importlib

    # (`import deepspeed.comm.torch as m` would bind torch itself: deepspeed.comm's star
    # import shadows the submodule's name in the package)
    ds_comm: Any = importlib.import_module("deepspeed.comm.torch")
    if not callable(getattr(ds_comm, "build_shm_op", None)):
        return None
    ds_comm.build_shm_op = lambda: None  # TorchBackend.__init__ looks it up at call time
    return {"deepspeed_shm_comm": {"built": False, "seconds": 0.0,
                                   "skipped": "serves inference_all_reduce only"}}


def _build_ops(cache: Path) -> dict[str, dict[str, Any]]:
    """Load (building on first use) the ops DeepSpeed's start-up needs, each timed."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    out: dict[str, dict[str, Any]] = {}
    for cls in JIT_OPS:
        builder = get_accelerator().create_op_builder(cls)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            continue
        cached = (cache / builder.NAME / f"{builder.NAME}.so").exists()
        t0 = time.perf_counter()
        builder.load(verbose=False)
        # built: absent from the cache at start (built here, or by a peer rank this one
        # waited for: torch's build lock)
        out[builder.NAME] = {"built": not cached, "seconds": time.perf_counter() - t0}
    return out


def _quiet() -> None:
    """DeepSpeed logs its configuration at INFO on every rank; keep warnings only."""
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)


def run(ctx: WorkerContext) -> RankResult:
    device, cuda = select_device(ctx)
    applied = precision.apply_torch(ctx.strategy.precision, device)
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    cache, cache_from = extensions_dir(ctx)
    t0 = time.perf_counter()
    import deepspeed

    import_s = time.perf_counter() - t0
    _quiet()
    ops = _skip_inference_ops() or _build_ops(cache)
    before = set(os.listdir(cache)) if cache.is_dir() else set()
    t0 = time.perf_counter()
    # Every run, single included, has a process group: the engine needs one.
    deepspeed.init_distributed(
        dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False,
        init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}", rank=ctx.rank,
        world_size=ctx.world, timeout=datetime.timedelta(seconds=ctx.collective_timeout_s))
    setup = {"import_s": import_s, "init_distributed_s": time.perf_counter() - t0,
             "jit_ops": ops, "jit_cache": f"{cache} ({cache_from})"}
    try:
        return _train(ctx, device, cuda, setup, cache, before, applied)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _nbytes(tensors: Any) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


class _Step:
    """One optimizer step: forward/backward/engine.step per micro-batch, the learning rate
    set before the boundary, the global gradient norm. Returns (loss, norm) as a tensor."""

    def __init__(self, ctx: WorkerContext, engine: Any, device: torch.device) -> None:
        self.ctx, self.engine, self.device = ctx, engine, device
        self.stage = ctx.strategy.dims().zero
        self.lrs = lr_table(ctx.workload.optimizer, ctx.workload.steps).tolist()
        self.updates = 0
        """Optimizer updates so far (the schedule's index; set on resume)."""

    def _norm_before_update(self) -> torch.Tensor | None:
        """Stage 0 without bf16 computes no norm: the reduced gradients' own, as torch's."""
        engine = self.engine
        if self.stage or engine.bfloat16_enabled():
            return None
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads, foreach=True)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor], sync: bool = True
                 ) -> torch.Tensor:
        x, y = batch
        engine, accum = self.engine, self.ctx.strategy.grad_accum
        total = torch.zeros((), device=self.device)
        norm: torch.Tensor | None = None
        for k, (xk, yk) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
            loss = engine(xk, yk)
            if sync:
                engine.backward(loss)
            else:  # the exposed-communication pairs (stage 0): no gradient all-reduce
                with engine.no_sync():
                    engine.backward(loss)
            total += loss.detach().float() / accum
            if k == accum - 1:
                norm = self._norm_before_update()
                lr = self.lrs[min(self.updates, len(self.lrs) - 1)]
                for group in engine.optimizer.param_groups:
                    group["lr"] = lr
            engine.step()
        self.updates += 1
        if norm is None:
            reported = engine.get_global_grad_norm()
            norm = (reported.detach().float().reshape(()) if torch.is_tensor(reported)
                    else torch.tensor(float("nan") if reported is None else reported))
        return torch.stack((total, norm.to(total.device)))


def _inner_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The client torch optimizer under DeepSpeed's ZeRO/bf16 wrapper (itself at stage 0)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def _accounting(engine: Any) -> dict[str, Any]:
    """Bytes this rank holds: its parameters (its partition under ZeRO-3), and the optimizer
    state: the client AdamW's moments plus, under ZeRO, the fp32 master partition it updates
    (DeepSpeed keeps one even in fp32); gradients live in DeepSpeed's buffers (None)."""
    params = [getattr(p, "ds_tensor", p) for p in engine.module.parameters()]
    inner = _inner_optimizer(engine)
    state = _nbytes(v for s in inner.state.values() for v in s.values() if torch.is_tensor(v))
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        state += _nbytes(getattr(engine.optimizer, attr, ()))  # ZeRO 1-2, ZeRO-3
    frozen = [getattr(p, "ds_tensor", p) for p in engine.module.parameters()
              if not p.requires_grad]
    return {"params": _nbytes(params), "frozen_params": _nbytes(frozen), "grads": None,
            "optimizer_state": state}


def _final_params(engine: Any, names: list[str]) -> dict[str, np.ndarray] | None:
    """The canonical parameters on rank 0: the fp32 master weights (gathered from the
    partitions under ZeRO; every rank takes part), else the module's own."""
    from deepspeed.utils import safe_get_full_fp32_param

    full: dict[str, torch.Tensor] = {}
    for key, p in engine.module.named_parameters():
        master = safe_get_full_fp32_param(p)
        full[key] = (master if master is not None else p).detach().cpu().float()
    if torch.distributed.get_rank() != 0:
        return None
    return canonical_from_state(full, names, prefix="net.")


def _train(ctx: WorkerContext, device: torch.device, cuda: bool, setup: dict[str, Any],
           cache: Path, ops_before: set[str], applied: precision.Precision) -> RankResult:
    import deepspeed

    workload, strategy = ctx.workload, ctx.strategy
    params = initial_params(workload)
    net = dm.build(workload.model)
    if workload.finetune.lora:
        dm.add_adapters(net, adapter_shapes(workload.model, workload.finetune),
                        workload.finetune.scale)
    dm.load_canonical(net, params)
    names = dm.canonical_names(net, params)
    for key, tensor in net.named_parameters():  # LoRA: the base is frozen
        tensor.requires_grad_(trainable(workload, names[key]))
    net.to(device)
    groups = adamw_groups(net, names, params, workload.optimizer.weight_decay)
    optimizer, optimizer_impl = adamw(groups, workload.optimizer)
    config = ds_config(workload, strategy)
    t0 = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=dm.WithLoss(net), optimizer=optimizer,
                                           config=config)
    setup["initialize_s"] = time.perf_counter() - t0
    step = _Step(ctx, engine, device)

    fetch, block, to_floats = loop_functions(
        device, cuda, lambda i: data.local_batch(workload, i, ctx.rank, ctx.world, ctx.fault))

    def save(directory: Path) -> None:
        engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, save_latest=False)

    def restore(directory: Path, step_found: int) -> None:
        engine.load_checkpoint(str(directory), tag=CHECKPOINT_TAG,
                               load_optimizer_states=True, load_lr_scheduler_states=False)
        step.updates = step_found

    def barrier() -> None:
        torch.distributed.barrier()

    def describe() -> Description:
        after = set(os.listdir(cache)) if cache.is_dir() else set()
        jit = dict(setup["jit_ops"])
        for name in sorted(after - ops_before - set(jit)):  # loaded later, inside training
            jit[name] = {"built": True, "seconds": None, "during": "training"}
        return Description(
            memory=_accounting(engine),
            details={
                "optimizer": f"torch.optim.{optimizer_impl} as DeepSpeed's client optimizer"
                             + (f" under {type(engine.optimizer).__name__}"
                                if engine.optimizer is not optimizer else ""),
                "wrapping": f"deepspeed.initialize, ZeRO stage {strategy.dims().zero}"
                            + (", bf16" if strategy.precision == "bf16" else ""),
                "collectives": "nccl" if cuda else "gloo",
                "compression": strategy.compress,
                "deepspeed_config": config,
                "setup_s": {k: setup[k] for k in ("import_s", "init_distributed_s",
                                                  "initialize_s")},
                "jit_ops": jit,
                "jit_cache": setup["jit_cache"],
            },
            fingerprint=device_fingerprint("deepspeed", deepspeed.__version__, device, cuda,
                                           torch=torch.__version__),
            device_peak_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
            precision=applied,
        )

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    # The no-sync variant exists at stage 0 only (DeepSpeed's engine.no_sync refuses
    # partitioned gradients) and with more than one rank.
    nosync = (lambda batch: step(batch, sync=False)) if (
        strategy.dims().zero == 0 and ctx.world > 1) else None
    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in params.values()),
        n_trainable=sum(t.numel() for t in net.parameters() if t.requires_grad),
        fetch=fetch, step=step, block=block, to_floats=to_floats, step_nosync=nosync,
        final_params=lambda: _final_params(engine, list(params)), describe=describe,
        save=save, restore=restore, barrier=barrier,
    ))
