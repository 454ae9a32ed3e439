"""The peak bytes PyTorch holds per logit in torchtitan's loss, forward and backward.

`benchmarks/loss_memory.py` prints these figures; the planner's tests hold its loss factors to
them.

The planner's `--memory-model torch` counts the loss's logits at memory.loss_bytes_factor x
Korthikanti's 4 bytes per logit (4 s b V). This measures what PyTorch really holds, on the CPU
(the autograd graph and its saved tensors are the same on CUDA), for the loss as torchtitan
writes it (train.py at 9dec370):

    pred = model(inputs)                                   # 16-bit logits
    loss = cross_entropy(pred.flatten(0, 1).float(), labels)
    del pred                                               # "need to free to before bwd"
    loss.backward()

Every tensor an operator returns is followed through a TorchDispatchMode, keyed by its storage
and released when the storage is (a weak reference to the storage: PyTorch keeps one Python
object per storage); only tensors of at least a quarter of the logits count, so the figure is
the logits' share of the peak. It prints the forward peak and the whole peak, in bytes per
logit, for 16-bit and fp32 logits.

With tensor parallelism torchtitan runs the same loss inside PyTorch's `loss_parallel()`
(torchtitan/utils.py get_train_context at 9dec370; on whenever tp > 1 unless
--training.disable_loss_parallel): the logits are a DTensor sharded over the vocabulary and
DTensor's own handlers compute the log-softmax and the nll_loss backward
(torch/distributed/tensor/parallel/loss.py). A dispatch mode does not see the operators
inside those handlers, so this case is measured from the allocator's own events instead: the
profiler's memory timeline (profile_memory=True), every CPU allocation and release, on a
one-rank gloo group (the handlers do the same local work on one rank as on eight; their
all-reduces are of one value a token). The plain loss is measured the same way beside it, a
cross-check of the two methods; the timeline counts every allocation, so both carry the same
small non-logit remainder (the weights' and inputs' gradients).
"""

from __future__ import annotations

import weakref
from typing import Any


def measure(precision: str = "bf16", tokens: int = 1024, vocab: int = 8192,
            hidden: int = 64) -> tuple[float, float, str]:
    """(forward peak, whole peak, the operator at the whole peak), bytes per logit."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    threshold = tokens * vocab // 4
    live: dict[int, int] = {}
    state: dict[str, Any] = {"now": 0, "peak": 0, "at": ""}

    def release(key: int) -> None:
        state["now"] -= live.pop(key)

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.numel() >= threshold:
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                    if key not in live:
                        live[key] = storage.nbytes()
                        state["now"] += live[key]
                        weakref.finalize(storage, release, key)
                        if state["now"] > state["peak"]:
                            state["peak"], state["at"] = state["now"], str(func)
            return out

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=gen, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    with Track():
        pred = h.to(dtype) @ w.t()
        loss = F.cross_entropy(pred.float(), labels)
        forward = state["peak"]
        held = state["now"]
        del pred
        if precision == "bf16" and state["now"] != held - tokens * vocab * 2:
            raise RuntimeError("storage release not seen: the probe cannot count this PyTorch")
        loss.backward()
    unit = tokens * vocab
    return forward / unit, state["peak"] / unit, state["at"]


def measure_timeline(loss_parallel: bool, tokens: int = 1024, vocab: int = 8192,
                     hidden: int = 64) -> float:
    """Peak bytes per logit of the bf16 loss, forward and backward, from the profiler's memory
    timeline; with `loss_parallel` the logits are a one-rank DTensor sharded over the
    vocabulary and the loss runs inside torch's loss_parallel()."""
    import socket

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    gen = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    own_group = loss_parallel and not dist.is_initialized()
    if own_group:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=True, with_stack=True) as prof:
            pred = h.to(torch.bfloat16) @ w.t()
            if loss_parallel:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor import DTensor, Shard
                from torch.distributed.tensor.parallel import loss_parallel as parallel

                mesh = init_device_mesh("cpu", (1,))
                pred = DTensor.from_local(pred, mesh, [Shard(1)])
                with parallel():
                    loss = F.cross_entropy(pred.float(), labels)
                    del pred
                    loss.backward()
            else:
                loss = F.cross_entropy(pred.float(), labels)
                del pred
                loss.backward()
    finally:
        if own_group:
            dist.destroy_process_group()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(
        torch.device("cpu")
    )
    return float(np.asarray(sizes).sum(axis=1).max()) / (tokens * vocab)
