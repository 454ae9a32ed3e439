"""One PyTorch worker: build, parallelize, train under the shared timed loop.

Written the way PyTorch's own recipes (torchtitan) do it, and applied in their order:
sharding (FSDP2 `fully_shard`, per block then the root) or DDP, then torch.compile around the
result; fused AdamW (foreach where fused is not available), or ZeroRedundancyOptimizer for
ZeRO-1; grads set to None; no .item() in the step (losses are stacked and read back every
`log_every` steps); bf16 by autocast over fp32 master weights; gradient accumulation with
the gradient sync switched off for all but the last micro-batch.

Parallel strategies: single, dp (DDP), zero1 (DDP + ZeroRedundancyOptimizer), zero2 (FSDP2,
reshard_after_forward=False: parameters gathered once per step and kept through backward,
gradients reduce-scattered, optimizer state sharded), fsdp (FSDP2, resharded after forward:
ZeRO-3).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sextant import data
from sextant.backends import harness
from sextant.backends import precision
from sextant.backends.harness import Description, Trainer
from sextant.backends.torch_backend import model as tm
from sextant.backends.torch_backend import parallel as par
from sextant.core.errors import UserError
from sextant.workloads.init import adapter_shapes, decays
from sextant.pretrained.weights import bf16_base_names, initial_params, trainable
from sextant.measure.comm import megatron_tp_payload
from sextant.measure.env import fingerprint
from sextant.workloads.schedule import lr_table
from sextant.workloads.spec import LlamaSpec

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext

DDP_STRATEGIES = ("dp", "zero1")
FSDP_STRATEGIES = ("zero2", "fsdp")
MODEL_PARALLEL = ("tp", "pp")


def select_device(ctx: WorkerContext) -> tuple[torch.device, bool]:
    """This rank's threads and device; (device, cuda). On GPU ranks the worker has left
    this process only its own GPU (sextant.core.devices.pin_rank), so it is cuda:0."""
    torch.set_num_threads(ctx.threads)
    cuda = ctx.strategy.device == "gpu"
    if cuda and not torch.cuda.is_available():
        raise UserError(f"--device gpu: this torch ({torch.__version__}) sees no CUDA "
                        "device; install a CUDA build of torch, or use --device cpu")
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    return device, cuda


def run(ctx: WorkerContext) -> RankResult:
    device, cuda = select_device(ctx)
    applied = precision.apply_torch(ctx.strategy.precision, device)
    if ctx.is_distributed:
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}",
            rank=ctx.rank,
            world_size=ctx.world,
            timeout=datetime.timedelta(seconds=ctx.collective_timeout_s),
        )
    try:
        return _train(ctx, device, cuda, applied)
    finally:
        if ctx.is_distributed and dist.is_initialized():
            dist.destroy_process_group()


# --- gradient communication hooks (DDP) ------------------------------------------------


def _sum_gradients_hook(state, bucket):  # noqa: ANN001 - DDP rejects non-GradBucket annotations
    """The deliberate bug behind SEXTANT_TEST_FAULT=sum-gradients: all-reduce without the
    division by world size. The parity tests must fail on it."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _bf16_compress_hook(state, bucket):  # noqa: ANN001
    """Cast to bf16, all-reduce, average, cast back. (torch's own bf16_compress_hook refuses
    to run without CUDA; this is the same algorithm.)"""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(f):  # noqa: ANN001, ANN202
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)


def _install_hook(ddp: DDP, ctx: WorkerContext) -> dict[str, int]:
    """Register the communication hook for the strategy's compression, wrapped so that it
    counts the gradient bytes DDP hands over (before compression): the measured side of the
    bytes-per-step figure. Returns the counter."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    compress = ctx.strategy.compress
    state: Any = None
    if ctx.fault and "sum-gradients" in ctx.fault.split(","):
        inner = _sum_gradients_hook
    elif compress == "fp16":
        inner = default_hooks.fp16_compress_hook
    elif compress == "bf16":
        inner = _bf16_compress_hook
    elif compress == "powersgd":
        # Rank-1 PowerSGD with error feedback, compressing from the second step on (the
        # first step all-reduces uncompressed gradients to start the error feedback).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=1)
        inner = powerSGD_hook.powerSGD_hook
    else:
        inner = default_hooks.allreduce_hook
    counter = {"bytes": 0}

    def counting_hook(state, bucket):  # noqa: ANN001, ANN202
        buffer = bucket.buffer()
        counter["bytes"] += buffer.numel() * buffer.element_size()
        return inner(state, bucket)

    ddp.register_comm_hook(state, counting_hook)
    return counter


# --- helpers ---------------------------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors: Any) -> int:
    return int(sum(_local(t).numel() * _local(t).element_size() for t in tensors))


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard here
    return _nbytes(v for state in inner.state.values() for v in state.values()
                   if torch.is_tensor(v))


def adamw_groups(net: torch.nn.Module, names: dict[str, str], params: dict[str, np.ndarray],
                 weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: weight decay where `sextant.workloads.init.decays` says, none elsewhere.

    Groups by (decay, DTensor or not): the fused and foreach kernels take one kind of tensor
    per group, and tensor parallelism leaves some parameters (norms, a tied embedding) as
    plain tensors beside the DTensor shards. (The DeepSpeed backend builds the same groups.)"""
    from torch.distributed.tensor import DTensor

    by_kind: dict[tuple[bool, bool], list[torch.Tensor]] = {}
    for key, p in net.named_parameters():
        if not p.requires_grad:  # frozen (LoRA's base): no optimizer state
            continue
        canonical = names[key]
        kind = (decays(canonical, params[canonical].shape), isinstance(p, DTensor))
        by_kind.setdefault(kind, []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0}
            for (decay, _), ps in sorted(by_kind.items(),
                                         key=lambda kv: (not kv[0][0], kv[0][1]))]


def adamw(groups: list[dict[str, Any]], spec: Any) -> tuple[torch.optim.Optimizer, str]:
    """torch.optim.AdamW with the workload's hyper-parameters: fused where this build has
    the kernel, foreach otherwise; returns (optimizer, which)."""
    kwargs: dict[str, Any] = dict(lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "AdamW (fused)"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "AdamW (foreach)"


def _adamw(net: torch.nn.Module, names: dict[str, str], params: dict[str, np.ndarray],
           ctx: WorkerContext) -> tuple[torch.optim.Optimizer, str]:
    spec = ctx.workload.optimizer
    groups = adamw_groups(net, names, params, spec.weight_decay)
    if ctx.strategy.parallel == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW,
                                       foreach=True, lr=spec.lr,
                                       betas=(spec.beta1, spec.beta2), eps=spec.eps,
                                       ), "ZeroRedundancyOptimizer(AdamW)"
    return adamw(groups, spec)


def _apply_activation_checkpointing(net: torch.nn.Module) -> None:
    """Recompute each transformer block in backward (torch.utils.checkpoint, non-reentrant,
    as torchtitan). The block's forward is replaced on the instance, so parameter names, the
    FSDP per-block wrapping (whose hooks stay outside the checkpointed region) and the
    canonical mapping are unchanged."""
    import functools

    from torch.utils.checkpoint import checkpoint

    blocks = getattr(net, "blocks", None)
    if not blocks:
        from sextant.core.errors import UserError

        raise UserError("--activation-checkpointing recomputes transformer blocks; "
                        f"this model ({type(net).__name__}) has none")
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def _apply_ddp(module: torch.nn.Module, ctx: WorkerContext) -> tuple[DDP, dict[str, int]]:
    """DDP over the whole module (one flat set of gradient buckets), with the strategy's
    communication hook; returns the wrapper and the hook's byte counter."""
    ddp = DDP(module, broadcast_buffers=False, gradient_as_bucket_view=True)
    return ddp, _install_hook(ddp, ctx)


def _apply_fsdp(module: torch.nn.Module, net: torch.nn.Module, ctx: WorkerContext) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if ctx.strategy.device == "gpu" else "cpu", (ctx.world,))
    reshard = ctx.strategy.parallel == "fsdp"
    # Per transformer block first (each block's parameters are gathered just in time), then
    # the root for what is left (embeddings, final norm, head).
    for block in getattr(net, "blocks", []):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard)


def _full_canonical(net: torch.nn.Module, names: list[str]) -> dict[str, np.ndarray] | None:
    """The whole model in canonical layout, on rank 0 (gathered from shards if needed)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        net, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return tm.canonical_from_state(state, names)


def loop_functions(device: torch.device, cuda: bool,
                   local_batch: Callable[[int], tuple[np.ndarray, np.ndarray]]
                   ) -> tuple[Any, Any, Any]:
    """(fetch, block, to_floats) of the timed loop for a torch step on `device`: this
    rank's batch copied to the device, a CUDA sync (nothing to wait for on CPU), and one
    stacked host transfer of the (loss, norm) handles."""
    def fetch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = local_batch(i)
        return (torch.from_numpy(x).to(device, non_blocking=True),
                torch.from_numpy(y).to(device, non_blocking=True))

    def block(handle: torch.Tensor) -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def to_floats(handles: list[torch.Tensor]) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in torch.stack(handles).cpu().tolist()]

    return fetch, block, to_floats


def device_fingerprint(framework: str, version: str, device: torch.device, cuda: bool,
                       **extra: Any) -> dict[str, Any]:
    """The run's fingerprint for a framework running torch on `device`."""
    return fingerprint(
        framework=framework,
        framework_version=version,
        **extra,
        threads=torch.get_num_threads(),
        device=str(device),
        cuda=torch.version.cuda if cuda else None,
        gpu=torch.cuda.get_device_name(device) if cuda else None,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    )


# --- the worker ------------------------------------------------------------------------


@dataclass(kw_only=True)
class _Parallelized:
    """The model after the strategy's transformations (torchtitan's order)."""

    module: torch.nn.Module
    """What the step calls: the model with its loss, under DDP/FSDP/compile as applied."""
    lay: par.RankMesh | None = None
    """The 2-D mesh of tensor or pipeline parallelism."""
    stage: Any = None
    schedule: Any = None
    ddp: DDP | None = None
    counter: dict[str, int] | None = None
    """Gradient bytes DDP's communication hook handed over."""


def _parallelize(net: torch.nn.Module, ctx: WorkerContext, device: torch.device
                 ) -> _Parallelized:
    """Applied in torchtitan's order: tensor parallelism, activation checkpointing, the
    pipeline split, then DDP or FSDP (compile comes after the optimizer is built)."""
    strategy, parallel = ctx.strategy, ctx.strategy.parallel
    lay = par.rank_mesh(ctx, device.type) if parallel in MODEL_PARALLEL else None
    if parallel == "tp" and lay is not None:
        spec = ctx.workload.model
        par.apply_tp(net, lay.mesh["tp"], strategy.sequence_parallel,
                     isinstance(spec, LlamaSpec) and spec.tie_embeddings, ctx.fault)
    if strategy.activation_checkpointing:
        _apply_activation_checkpointing(net)
    out = _Parallelized(module=tm.WithLoss(net), lay=lay)
    if parallel == "pp" and lay is not None:
        out.stage, out.schedule = par.pipeline(net, lay, ctx, device)
    if parallel in DDP_STRATEGIES:
        out.ddp, out.counter = _apply_ddp(out.module, ctx)
        out.module = out.ddp
    elif parallel in FSDP_STRATEGIES:
        _apply_fsdp(out.module, net, ctx)
    return out


class _Step:
    """The optimizer step of every strategy: forward/backward over the micro-batches with
    the gradient sync on the last one only, the dp average under model parallelism, the
    global gradient norm, the learning-rate schedule, AdamW. Returns the (loss, norm) pair
    as a tensor: no host transfer."""

    def __init__(self, ctx: WorkerContext, p: _Parallelized, optimizer: torch.optim.Optimizer,
                 trainable: list[torch.Tensor], device: torch.device,
                 frozen: list[torch.Tensor] | None = None) -> None:
        self.ctx, self.p, self.optimizer, self.trainable, self.device = (
            ctx, p, optimizer, trainable, device)
        self.frozen = frozen or []
        """Parameters that do not train (LoRA's base)."""
        self.lrs = lr_table(ctx.workload.optimizer, ctx.workload.steps).tolist()
        self.updates = 0
        """Optimizer updates so far (the schedule's index; set on resume)."""
        self.accounting: dict[str, int] = {}
        dtype = precision.half_dtype(torch, ctx.strategy.precision)
        self.autocast = (torch.autocast(device.type, dtype=dtype) if dtype is not None
                         else contextlib.nullcontext())
        # fp16 needs dynamic loss scaling (its range underflows small gradients); the step
        # unscales before the norm and skips an update whose gradients overflowed.
        self.scaler = (torch.amp.GradScaler(device.type) if ctx.strategy.precision == "fp16"
                       else None)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def update(self) -> torch.Tensor:
        p, trainable, accounting = self.p, self.trainable, self.accounting
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # the norm and the update see true gradients
        if p.lay is not None:
            par.average_over_dp(trainable, p.lay, self.ctx.fault)
        norm = par.grad_norm(trainable, p.lay.mp_group if p.stage is not None and p.lay
                             else None)
        if not accounting:
            accounting["grads"] = _nbytes(t.grad for t in trainable if t.grad is not None)
        lr = self.lrs[min(self.updates, len(self.lrs) - 1)]
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        if "optimizer_state" not in accounting:
            accounting["params"] = _nbytes(trainable) + _nbytes(self.frozen)
            accounting["frozen_params"] = _nbytes(self.frozen)
            accounting["optimizer_state"] = _optimizer_state_bytes(self.optimizer)
        return norm

    def sync_context(self, last: bool, sync: bool) -> Any:
        """Whether this micro-batch's backward communicates gradients."""
        if self.p.ddp is not None and not (last and sync):
            return self.p.ddp.no_sync()
        if self.ctx.strategy.parallel in FSDP_STRATEGIES:
            _root(self.p.module).set_requires_gradient_sync(last and sync)
        return contextlib.nullcontext()

    def pipeline(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        stage, schedule, lay = self.p.stage, self.p.schedule, self.p.lay
        assert lay is not None  # a pipeline always has its layout
        first, last = stage.wte is not None, stage.head is not None
        losses: list[torch.Tensor] = []
        if first and last:
            schedule.step(x, target=y, losses=losses)
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        # Every stage reports the loss: the last stage's mean over micro-batches, sent along
        # the pipeline group (the run's loss is the mean of all ranks' reports).
        loss = (torch.stack(losses).mean().detach() if last
                else torch.zeros((), device=self.device))
        dist.broadcast(loss, src=self.ctx.rank - lay.mp_rank + lay.degree - 1,
                       group=lay.mp_group)
        return torch.stack((loss, self.update()))

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor], sync: bool = True
                 ) -> torch.Tensor:
        if self.p.stage is not None:
            return self.pipeline(batch)
        x, y = batch
        accum, module = self.ctx.strategy.grad_accum, self.p.module
        if accum == 1:
            with self.sync_context(True, sync):
                with self.autocast:
                    loss = module(x, y)
                self.backward(loss)
            return torch.stack((loss.detach().float(), self.update()))
        total = torch.zeros((), device=self.device)
        for k, (xk, yk) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
            with self.sync_context(k == accum - 1, sync):
                with self.autocast:
                    loss = module(xk, yk) / accum
                self.backward(loss)
            total += loss.detach().float()
        return torch.stack((total, self.update()))


_METADATA_CLASSES = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("collections", "OrderedDict"),
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
}
"""What a distributed checkpoint's `.metadata` pickle may name: its own dataclasses, shapes,
dtypes and layouts; nothing that runs code."""


def metadata_only_reader(directory: Any) -> Any:
    """A torch.distributed.checkpoint reader of `directory` whose `.metadata` is unpickled
    with only checkpoint metadata allowed (the tensors themselves torch reads with
    weights_only=True): a crafted pickle is refused, even under --trust-checkpoint."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            allowed = (module, name) in _METADATA_CLASSES or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
            if not allowed:
                raise pickle.UnpicklingError(
                    f"the checkpoint's .metadata names {module}.{name}, which is not "
                    f"checkpoint metadata; refusing to load it")
            return super().find_class(module, name)

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as stream:
                metadata = Unpickler(stream).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(directory)


def _checkpointing(net: torch.nn.Module, optimizer: torch.optim.Optimizer, step: _Step
                   ) -> tuple[Any, Any, Any]:
    """(save, restore, barrier) through torch.distributed.checkpoint (every rank writes its
    shards; the harness seals the directory)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def save(directory: Any) -> None:
        model_sd, optim_sd = get_state_dict(net, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory)

    def restore(directory: Any, step_found: int) -> None:
        model_sd, optim_sd = get_state_dict(net, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=metadata_only_reader(directory))
        set_state_dict(net, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        step.updates = step_found

    def barrier() -> None:
        if dist.is_initialized():
            dist.barrier()

    return save, restore, barrier


def _wrapping(strategy: Any, p: _Parallelized) -> str:
    """The transformations applied, in order, for the run's details."""
    parallel, lay = strategy.parallel, p.lay
    return " + ".join(
        w for w, on in (
            ("activation checkpointing per block", strategy.activation_checkpointing),
            ("DDP", p.ddp is not None), ("FSDP2 fully_shard", parallel in FSDP_STRATEGIES),
            (f"tensor parallel x{strategy.tp} (parallelize_module)", parallel == "tp"),
            ("sequence parallel", strategy.sequence_parallel),
            (f"pipeline x{strategy.pp} ({type(p.schedule).__name__}, "
             f"{strategy.microbatches} micro-batches)", parallel == "pp"),
            (f"gradients averaged over dp{lay.dp if lay else 1}", lay is not None and lay.dp > 1),
            ("torch.compile", strategy.mode == "compiled"),
            (f"autocast {strategy.precision}", strategy.precision in ("bf16", "fp16")),
            ("GradScaler", strategy.precision == "fp16"),
        ) if on
    ) or "none"


def _probe(ctx: WorkerContext, p: _Parallelized, step: _Step, batch: Any) -> dict[str, Any]:
    """Model-parallel figures from one extra step, after the timed ones and the export."""
    strategy = ctx.strategy
    if strategy.parallel == "tp":
        return {"tp_collectives_bytes_per_step": par.count_collectives(step, batch),
                "tp_planned_bytes_per_step": megatron_tp_payload(ctx.workload, strategy)}
    if strategy.parallel == "pp" and p.lay is not None:
        bubble = (strategy.pp - 1) / (strategy.microbatches + strategy.pp - 1)
        return {"pipeline": {**par.stage_probe(p.stage, step, batch, strategy.microbatches),
                             "stage": p.lay.mp_rank, "bubble_planned": bubble}}
    return {}


def _train(ctx: WorkerContext, device: torch.device, cuda: bool,
           applied: precision.Precision) -> RankResult:
    workload, strategy = ctx.workload, ctx.strategy
    params = initial_params(workload)
    net = tm.build(workload.model)
    if workload.finetune.lora:
        tm.add_adapters(net, adapter_shapes(workload.model, workload.finetune),
                        workload.finetune.scale)
    tm.load_canonical(net, params)
    names = tm.canonical_names(net, params)
    for key, tensor in net.named_parameters():  # LoRA: the base is frozen
        tensor.requires_grad_(trainable(workload, names[key]))
    net.to(device)
    stored_bf16 = bf16_base_names(workload)
    for key, tensor in net.named_parameters():  # stored rounded; each matmul upcasts it
        if names[key] in stored_bf16:
            tensor.data = tensor.data.to(torch.bfloat16)
    if "bf16-master-weights" in (ctx.fault or "").split(","):
        net.to(torch.bfloat16)  # test hook: the broken twin mixed-precision agreement catches

    p = _parallelize(net, ctx, device)
    optimizer, optimizer_impl = _adamw(p.stage or net, names, params, ctx)
    if strategy.mode == "compiled":
        p.module = torch.compile(p.module)
    module = p.stage or net
    step = _Step(ctx, p, optimizer, [t for t in module.parameters() if t.requires_grad],
                 device, frozen=[t for t in module.parameters() if not t.requires_grad])
    save, restore, barrier = _checkpointing(net, optimizer, step)

    # Model-parallel peers read the same rows: their data-parallel rank's.
    rank, world = (p.lay.dp_rank, p.lay.dp) if p.lay is not None else (ctx.rank, ctx.world)
    fetch, block, to_floats = loop_functions(
        device, cuda, lambda i: data.local_batch(workload, i, rank, world, ctx.fault))

    def final_params() -> dict[str, np.ndarray] | None:
        if p.stage is not None and p.lay is not None:
            return par.gather_stages(p.stage, names, p.lay, ctx.rank)
        return _full_canonical(net, list(params))

    def describe() -> Description:
        peak = torch.cuda.max_memory_allocated(device) if cuda else None  # before the probes
        return Description(
            memory=step.accounting,
            details={
                "optimizer": f"torch.optim.{optimizer_impl}",
                "wrapping": _wrapping(strategy, p),
                "collectives": ("nccl" if cuda else "gloo") if dist.is_initialized() else None,
                "compression": strategy.compress,
                **_probe(ctx, p, step, fetch(0)),
            },
            fingerprint=device_fingerprint("torch", torch.__version__, device, cuda),
            device_peak_bytes=peak,
            precision=applied,
        )

    if p.ddp is not None:
        step_nosync: Any = functools.partial(step, sync=False)
    else:
        step_nosync = par.without_collectives(step) if strategy.parallel == "tp" else None
    counter = p.counter
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in params.values()),
        n_trainable=sum(t.numel() for t in net.parameters() if t.requires_grad),
        fetch=fetch, step=step, block=block, to_floats=to_floats, step_nosync=step_nosync,
        final_params=final_params, describe=describe,
        save=save, restore=restore, barrier=barrier,
        grad_payload_bytes=(lambda: counter["bytes"]) if counter is not None else None,
    ))


def _root(module: torch.nn.Module) -> torch.nn.Module:
    """The FSDP root under an optional torch.compile wrapper."""
    return getattr(module, "_orig_mod", module)
