"""One PyTorch worker: build, wrap (DDP, compile), train under the shared timed loop.

Written the way PyTorch's own recipes do it: fused AdamW (foreach where fused is not
available), grads set to None, no .item() in the step (losses are stacked and read back every
`log_every` steps), DDP with gradient-as-bucket-view, torch.compile around the DDP module.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sextant import data
from sextant.backends.torch_backend import model as tm
from sextant.init import decays, init_params
from sextant.measure.env import fingerprint
from sextant.measure.loop import timed_training
from sextant.schedule import lr_table


def _sum_gradients_hook(state, bucket):  # noqa: ANN001 - DDP rejects non-GradBucket annotations
    """The deliberate bug behind SEXTANT_TEST_FAULT=sum-gradients: all-reduce without the
    division by world size. The parity tests must fail on it."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _adamw(net: torch.nn.Module, names: dict[str, str], params: dict[str, np.ndarray],
           ctx: Any) -> tuple[torch.optim.Optimizer, str]:
    spec = ctx.workload.optimizer
    decay, no_decay = [], []
    for key, p in net.named_parameters():
        canonical = names[key]
        (decay if decays(canonical, params[canonical].shape) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": spec.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach"


def run(ctx: Any) -> dict[str, Any]:
    workload, strategy = ctx.workload, ctx.strategy
    torch.set_num_threads(ctx.threads)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{ctx.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)

    if ctx.is_distributed:
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}",
            rank=ctx.rank,
            world_size=ctx.world,
            timeout=datetime.timedelta(seconds=ctx.collective_timeout_s),
        )
    try:
        return _train(ctx, device, cuda)
    finally:
        if ctx.is_distributed and dist.is_initialized():
            dist.destroy_process_group()


def _train(ctx: Any, device: torch.device, cuda: bool) -> dict[str, Any]:
    workload, strategy = ctx.workload, ctx.strategy
    params = init_params(workload.model, workload.seed)
    net = tm.build(workload.model)
    tm.load_canonical(net, params)
    names = tm.canonical_names(net, params)
    net.to(device)
    optimizer, optimizer_impl = _adamw(net, names, params, ctx)
    lrs = lr_table(workload.optimizer, workload.steps).tolist()

    module: torch.nn.Module = tm.WithLoss(net)
    ddp: DDP | None = None
    if strategy.parallel == "dp":
        ddp = DDP(module, broadcast_buffers=False, gradient_as_bucket_view=True)
        if ctx.fault == "sum-gradients":
            ddp.register_comm_hook(None, _sum_gradients_hook)
        module = ddp
    if strategy.mode == "compiled":
        module = torch.compile(module)

    counter = {"k": 0}

    def fetch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data.local_batch(workload, i, ctx.rank, ctx.world, ctx.fault)
        return (torch.from_numpy(x).to(device, non_blocking=True),
                torch.from_numpy(y).to(device, non_blocking=True))

    grads_of = [p for p in net.parameters()]

    def grad_norm() -> torch.Tensor:
        # Global L2 norm of the (already all-reduced) gradients, without a host sync.
        norms = torch._foreach_norm([p.grad for p in grads_of if p.grad is not None])
        return torch.linalg.vector_norm(torch.stack(norms))

    def update() -> torch.Tensor:
        norm = grad_norm()
        k = min(counter["k"], len(lrs) - 1)
        for group in optimizer.param_groups:
            group["lr"] = lrs[k]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        counter["k"] += 1
        return norm

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = module(*batch)
        loss.backward()
        return torch.stack((loss.detach(), update()))

    def step_nosync(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert ddp is not None
        with ddp.no_sync():
            loss = module(*batch)
            loss.backward()
        return torch.stack((loss.detach(), update()))

    def block(loss: torch.Tensor) -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def to_floats(handles: list[torch.Tensor]) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in torch.stack(handles).cpu().tolist()]

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    result = timed_training(
        ctx, fetch=fetch, step=step, block=block, to_floats=to_floats,
        step_nosync=step_nosync if ddp is not None else None,
    )
    if cuda:
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    result["details"] = {
        "optimizer": f"torch.optim.AdamW ({optimizer_impl})",
        "wrapping": " + ".join(
            w for w, on in (("DDP", ddp is not None), ("torch.compile", strategy.mode == "compiled"))
            if on
        ) or "none",
        "collectives": ("nccl" if cuda else "gloo") if ddp is not None else None,
    }
    result["fingerprint"] = fingerprint(
        framework="torch",
        framework_version=torch.__version__,
        threads=torch.get_num_threads(),
        device=str(device),
        cuda=torch.version.cuda if cuda else None,
        gpu=torch.cuda.get_device_name(device) if cuda else None,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    )
    return result
