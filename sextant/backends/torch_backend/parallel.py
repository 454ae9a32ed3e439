"""Tensor and pipeline parallelism with PyTorch's own distributed APIs, on the Llama family.

- tp: `torch.distributed.tensor.parallel.parallelize_module` over a DeviceMesh, torchtitan's
  plan: q/k/v and the SwiGLU gate/up column-parallel, attention output and down projection
  row-parallel (one all-reduce after each in forward, one before each in backward); the
  token embedding row-parallel over the vocabulary, the head column-parallel with its output
  gathered. `--sequence-parallel`: norms run on a sequence shard (SequenceParallel), the
  attention and MLP inputs are all-gathered along the sequence once each (PrepareModuleInput)
  and their outputs reduce-scattered back to it.
- pp: `torch.distributed.pipelining`: the blocks cut into equal stages (the first also holds
  the embedding, the last the final norm, head and loss), each batch into micro-batches run
  by ScheduleGPipe or Schedule1F1B; gradients scaled by 1/microbatches by the schedule, so
  they equal the whole batch's.
- dp x tp, dp x pp: a 2-D DeviceMesh ('dp', 'tp' or 'pp'); data-parallel peers average their
  gradients with one all-reduce of a flat buffer over the 'dp' group (DDP's algorithm,
  written out, because DDP does not wrap DTensor parameters or pipeline stages).

Rank r sits at mesh coordinate (r // degree, r % degree): model-parallel peers are
neighbours, as on a GPU node where they share the fastest links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from sextant.contracts import WorkerContext


@dataclass
class RankMesh:
    """Where this rank sits on the 2-D device mesh (data parallel x tensor or pipeline)."""

    degree: int
    """Model-parallel degree (tp or pp)."""
    dp: int
    dp_rank: int
    mp_rank: int
    mesh: Any
    """DeviceMesh ('dp', 'tp' | 'pp')."""

    @property
    def mp_group(self) -> Any:
        return self.mesh.get_group(1)

    @property
    def dp_group(self) -> Any:
        return self.mesh.get_group(0)


def rank_mesh(ctx: WorkerContext, device_type: str) -> RankMesh:
    from torch.distributed.device_mesh import init_device_mesh

    strategy = ctx.strategy
    degree = strategy.tp * strategy.pp
    dp = ctx.world // degree
    axis = "tp" if strategy.tp > 1 else "pp"
    mesh = init_device_mesh(device_type, (dp, degree), mesh_dim_names=("dp", axis))
    return RankMesh(degree=degree, dp=dp, dp_rank=ctx.rank // degree, mp_rank=ctx.rank % degree,
                  mesh=mesh)


# --- tensor parallelism ----------------------------------------------------------------


def apply_tp(net: nn.Module, mesh: Any, sequence_parallel: bool, tied: bool,
             fault: str | None = None) -> None:
    """Parallelize a torch_backend.model.Llama in place over the 1-D mesh `mesh`.
    SEXTANT_TEST_FAULT=skip-tp-allreduce leaves the attention output's partial sums
    unreduced (each rank keeps its own heads' share): the parity tests must fail."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, Any] = {}
    if not tied:  # a tied matrix cannot be split two ways (rows for one, columns for other)
        top["wte"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        top["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if sequence_parallel:
        top["norm_f"] = SequenceParallel()
    if top:
        parallelize_module(net, mesh, top)
    skip = bool(fault and "skip-tp-allreduce" in fault.split(","))
    for block in net.blocks:
        plan: dict[str, Any] = {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=Partial() if skip else seq),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=seq),
        }
        # The attention and MLP inputs become one DTensor each (gathered along the sequence
        # with sequence parallelism), shared by q/k/v (gate/up): their partial input
        # gradients are summed first and reduced once, Megatron's f operator. Without it each
        # column-parallel projection reduces its own (measured: 5 backward all-reduces per
        # block instead of 2).
        plan.update({
            "attn": PrepareModuleInput(input_layouts=(seq, None, None),
                                       desired_input_layouts=(Replicate(), None, None)),
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        })
        if sequence_parallel:
            plan.update({"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel()})
        parallelize_module(block, mesh, plan)


def grad_norm(params: list[torch.Tensor], pp_group: Any = None) -> torch.Tensor:
    """Global L2 norm of the (already reduced) gradients of every strategy, without a host
    sync: DTensor shards (FSDP, tensor parallel) and plain tensors alike; `pp_group`: the
    pipeline stages' squared norms are summed over it. One kind of tensor and no pipeline:
    the framework's norm as it is."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    sharded = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    norms = ([torch.nn.utils.get_total_norm(sharded, foreach=True).full_tensor()]
             if sharded else [])
    if plain or not norms:
        norms.append(torch.nn.utils.get_total_norm(plain, foreach=True))
    if len(norms) == 1 and pp_group is None:
        return norms[0]
    squared = sum(n**2 for n in norms)
    if pp_group is not None:
        dist.all_reduce(squared, group=pp_group)
    return squared.sqrt()


def average_over_dp(params: list[torch.Tensor], lay: RankMesh, fault: str | None) -> None:
    """Mean of the data-parallel peers' gradients: one all-reduce of a flat buffer.
    SEXTANT_TEST_FAULT=sum-gradients leaves out the division (the parity tests must fail)."""
    from torch.distributed.tensor import DTensor

    if lay.dp == 1:
        return
    local = [(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)
             for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=lay.dp_group)
    if not (fault and "sum-gradients" in fault.split(",")):
        flat /= lay.dp
    offset = 0
    for g in local:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


# --- pipeline parallelism --------------------------------------------------------------


class Stage(nn.Module):
    """Blocks [lo, hi) of a Llama, with the embedding on the first stage and the final norm
    and head on the last. Parameter names keep the whole model's (`blocks.<i>.` with the
    global i), so the canonical mapping and the optimizer's decay groups apply unchanged."""

    def __init__(self, net: nn.Module, lo: int, hi: int, first: bool, last: bool,
                 fault: str | None = None) -> None:
        super().__init__()
        # SEXTANT_TEST_FAULT=pp-misrouted-handoff: a later stage receives the activations of
        # the wrong rows (rolled by one), a mis-routed hand-off the parity tests must catch.
        self.misrouted = bool(fault and "pp-misrouted-handoff" in fault.split(",")
                              and not first)
        self.wte = net.wte if first else None
        self.blocks = nn.ModuleDict({str(i): net.blocks[i] for i in range(lo, hi)})
        self.norm_f = net.norm_f if last else None
        self.head = net.head if last else None
        self.register_buffer("cos", net.cos, persistent=False)
        self.register_buffer("sin", net.sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:
            x = self.wte(x)
        if self.misrouted:
            x = x.roll(1, dims=0)
        T = x.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        for block in self.blocks.values():
            x = block(x, cos, sin)
        if self.head is not None and self.norm_f is not None:
            x = self.head(self.norm_f(x))
        return x


def pipeline_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def pipeline(net: nn.Module, lay: RankMesh, ctx: WorkerContext, device: torch.device
             ) -> tuple[Stage, Any]:
    """This rank's stage and the schedule that runs it."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    strategy = ctx.strategy
    n_layers = len(net.blocks)
    per = n_layers // lay.degree
    s = lay.mp_rank
    stage = Stage(net, s * per, (s + 1) * per, first=s == 0, last=s == lay.degree - 1,
                  fault=ctx.fault)
    handle = PipelineStage(stage, s, lay.degree, device, group=lay.mp_group)
    cls = Schedule1F1B if strategy.schedule == "1f1b" else ScheduleGPipe
    schedule = cls(handle, n_microbatches=strategy.microbatches, loss_fn=pipeline_loss)
    return stage, schedule


def gather_stages(stage: Stage, names: dict[str, str], lay: RankMesh, rank: int
                  ) -> dict[str, Any] | None:
    """The whole model in canonical layout on rank 0, from the stages of its pipeline."""
    import numpy as np

    from sextant.backends.torch_backend.model import _torch_name

    own = {}
    for key, value in stage.state_dict().items():
        if key in names:
            transpose = _torch_name(names[key])[1]
            array = value.detach().cpu().float().numpy()
            own[names[key]] = np.ascontiguousarray(array.T if transpose else array)
    parts: list[Any] = [None] * lay.mesh.size()
    dist.all_gather_object(parts, own)
    if rank != 0:
        return None
    merged = {k: v for part in parts[:lay.degree] for k, v in part.items()}
    return {name: merged[name] for name in sorted(merged, key=list(names.values()).index)}


# --- what a model-parallel step communicates, and how long each stage idles -----------

COUNTED_COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                       "all_to_all_single", "broadcast")


def count_collectives(step: Any, batch: Any) -> dict[str, int]:
    """Payload bytes of each collective one step issues through DTensor (functional
    collectives, seen by a TorchDispatchMode as CommDebugMode sees them), forward and
    backward: {'all_reduce': bytes, ...}. Run on an extra step after the timed ones."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counted: dict[str, int] = {}

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            name = func._overloadpacket.__name__
            if func.namespace == "_c10d_functional" and name in COUNTED_COLLECTIVES:
                t = args[0]
                counted[name] = counted.get(name, 0) + t.numel() * t.element_size()
            return func(*args, **(kwargs or {}))

    with Counter():
        step(batch)
    return counted


def stage_probe(stage: Stage, schedule_step: Any, batch: Any, microbatches: int,
                repeats: int = 3) -> dict[str, float | int]:
    """This stage's hand-off bytes and idle share, from extra steps after the timed ones.

    bytes: the activations it sends forward (counted at its output) and, by the pipeline's
    construction, gradients of the same shape sent back, per step. Idle share: 1 - (its own
    compute for the step) / (the step's wall time), its compute timed alone as `microbatches`
    forward+backward passes of one micro-batch with no pipeline around them; the planner's
    bubble is (p - 1) / (m + p - 1)."""
    import time

    sent = {"bytes": 0}
    last = stage.head is not None

    def hook(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        if not last:
            sent["bytes"] += output.numel() * output.element_size()

    handle = stage.register_forward_hook(hook)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        schedule_step(batch)
        walls.append(time.perf_counter() - t0)
    handle.remove()
    x, y = batch
    rows = x.shape[0] // microbatches
    xm, ym = x[:rows], y[:rows]
    if stage.wte is None:  # a later stage receives activations
        width = next(iter(stage.blocks.values())).attn.o.out_features  # d_model
        xm = torch.randn(rows, x.shape[1], width, requires_grad=True)
    busy = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(microbatches):
            out = stage(xm)
            if last:
                pipeline_loss(out, ym).backward()
            else:
                out.backward(torch.ones_like(out))
        busy.append(time.perf_counter() - t0)
    stage.zero_grad(set_to_none=True)
    wall, compute = sorted(walls)[len(walls) // 2], sorted(busy)[len(busy) // 2]
    return {"handoff_bytes_per_step": 2 * sent["bytes"] // repeats,
            "step_s": wall, "compute_s": compute,
            "idle_share": max(0.0, 1.0 - compute / wall)}


def without_collectives(step: Any) -> Any:
    """`step` with DTensor's collectives replaced by local stand-ins of the right shape
    (all-reduce: the input; all-gather: the input repeated; reduce-scatter: its first
    slice): the same compute without communication, for timing only. The measured loop
    alternates it with the real step after training; the difference is the exposed
    communication, as data parallelism's no-sync step gives it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoCollectives(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if func.namespace == "_c10d_functional":
                name = func._overloadpacket.__name__
                if name == "wait_tensor":
                    return args[0]
                if name == "all_reduce":
                    return args[0].clone()
                if name == "all_gather_into_tensor":
                    return torch.cat([args[0]] * args[1], dim=0)
                if name == "reduce_scatter_tensor":
                    return args[0].chunk(args[2], dim=0)[0].clone()
            return func(*args, **(kwargs or {}))

    def run(batch: Any) -> Any:
        with NoCollectives():
            return step(batch)

    return run
