"""Probe: the peak bytes PyTorch holds per logit in torchtitan's loss, forward and backward.

    .venv/bin/python benchmarks/loss_memory.py [--tokens 1024] [--vocab 8192]

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
"""

from __future__ import annotations

import argparse
import weakref


def measure(precision: str = "bf16", tokens: int = 1024, vocab: int = 8192, hidden: int = 64):
    """(forward peak, whole peak, the operator at the whole peak), bytes per logit."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    threshold = tokens * vocab // 4
    live: dict[int, int] = {}
    state = {"now": 0, "peak": 0, "at": ""}

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    args = p.parse_args()
    import torch

    print(f"torch {torch.__version__}, {args.tokens} tokens x {args.vocab} vocabulary entries")
    for precision in ("bf16", "fp32"):
        fwd, peak, at = measure(precision, args.tokens, args.vocab)
        print(f"{precision} logits: forward peak {fwd:.1f} bytes per logit, whole peak "
              f"{peak:.1f} (at {at})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
