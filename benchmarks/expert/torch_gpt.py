"""An expert's PyTorch GPT training loop (nanoGPT style), sharing no code with sextant.

    python benchmarks/expert/torch_gpt.py --mode eager|compiled [--workers 2] [shape flags]

Model: nn.Modules, pre-LayerNorm blocks, fused qkv projection, F.scaled_dot_product_attention
(causal), GELU (tanh), learned positions, untied head without bias. Optimizer: AdamW with
weight decay on the >= 2-D parameters only (nanoGPT's configure_optimizers), fused kernel,
learning rate set per step from warm-up + cosine, gradients clipped to --clip. --device gpu:
the first GPU, synchronized before each step's clock stops; --precision fp32 turns TF32 off
(matmul precision 'highest'), tf32 on, bf16 trains under torch.autocast. Compiled mode: torch.compile on the model
and a compiled optimizer step with the learning rate held in a tensor (PyTorch's "Compiling
the optimizer" recipe: one generated kernel for the whole update, no recompiles when the lr
changes). Batches: random byte tokens, made before the loop (or, with --inputs, the
weights and batches of a data file: to tell what the inputs do from what the code does). --workers N: DDP over gloo,
N processes (mp.spawn), each with --threads threads and its 1/N of the batch.

Prints one JSON object: per-step wall times (perf_counter around forward, backward,
optimizer step and zero_grad), losses, parameter count.
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import lr_at, parse, report  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_heads)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d_ff)
        self.fc_proj = nn.Linear(d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a) -> None:  # noqa: ANN001
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.d_model)
        self.wpe = nn.Embedding(a.seq_len, a.d_model)
        self.h = nn.ModuleList(Block(a.d_model, a.n_heads, a.d_ff) for _ in range(a.n_layers))
        self.ln_f = nn.LayerNorm(a.d_model)
        self.lm_head = nn.Linear(a.d_model, a.vocab, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "fc_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * a.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# --inputs: parameter names in the file -> this model's names (prefix renames, in order).
RENAMES = (("blocks.", "h."), (".ln1.", ".ln_1."), (".ln2.", ".ln_2."), (".mlp.fc.", ".fc."),
           (".mlp.proj.", ".fc_proj."), ("head.", "lm_head."))


def given_inputs(a, model: nn.Module, rank: int, rows: int) -> list:  # noqa: ANN001
    """Load the weights and batches of --inputs (an .npz: weights under "w/<name>", batches
    under "x" and "y"); this rank's rows of each batch, contiguous."""
    import numpy as np

    z = np.load(a.inputs)
    state = {}
    for key in z.files:
        if key.startswith("w/"):
            name = key[2:]
            for old, new in RENAMES:
                name = name.replace(old, new)
            state[name] = torch.from_numpy(z[key])
    model.load_state_dict(state, strict=True)
    x, y = z["x"], z["y"]
    sl = slice(rank * rows, (rank + 1) * rows)
    return [(torch.from_numpy(np.ascontiguousarray(x[k, sl])),
             torch.from_numpy(np.ascontiguousarray(y[k, sl]))) for k in range(a.steps)]


def train(rank: int, a, out) -> None:  # noqa: ANN001
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device("cuda" if a.device == "gpu" else "cpu")
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                              enabled=a.precision == "bf16")
    if a.workers > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}",
                                rank=rank, world_size=a.workers)
    model = GPT(a).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    compiled = a.mode == "compiled"
    # Compiled: the lr lives in a tensor so that changing it does not recompile the step.
    lr0 = torch.tensor(lr_at(a, 0)) if compiled else lr_at(a, 0)
    opt = torch.optim.AdamW(groups, lr=lr0, betas=(a.beta1, a.beta2), eps=a.eps,
                            fused=not compiled)
    net: nn.Module = model
    if a.workers > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, gradient_as_bucket_view=True)
    if compiled:
        net = torch.compile(net)

        @torch.compile(fullgraph=False)
        def opt_step() -> None:
            opt.step()
    else:
        opt_step = opt.step

    rows = a.batch // a.workers
    if a.inputs:
        batches = given_inputs(a, model, rank, rows)
    else:
        g = torch.Generator().manual_seed(a.seed + 1 + rank)
        data = torch.randint(0, a.vocab, (a.steps, rows, a.seq_len + 1), generator=g)
        batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    batches = [(x.to(device), y.to(device)) for x, y in batches]

    times, losses, ends = [], [], []
    for k, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        with autocast:
            loss = net(x, y)
        loss.backward()
        if a.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        for group in opt.param_groups:
            if compiled:
                group["lr"].fill_(lr_at(a, k))
            else:
                group["lr"] = lr_at(a, k)
        opt_step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        ends.append(time.time())  # wall clock, to align with a run beside it (--concurrent)
        losses.append(loss.detach())
    losses = [float(v) for v in losses]
    if out is not None:
        out.put((rank, n_params, times, losses))
    else:
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
        report(a, "torch", n_params, times, losses, mode=a.mode, workers=1,
               step_end_unix=ends, precision=a.precision, device=a.device,
               device_peak_bytes=peak)
    if a.workers > 1:
        dist.destroy_process_group()


def main() -> None:
    a = parse(__doc__.splitlines()[0], modes=("eager", "compiled"))
    if a.workers == 1:
        train(0, a, None)
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        a.port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(train, args=(a, out), nprocs=a.workers, join=True)
    ranks = sorted(out.get() for _ in range(a.workers))
    # The job's step time is the slowest rank's, step by step.
    times = [max(r[2][k] for r in ranks) for k in range(a.steps)]
    losses = [sum(r[3][k] for r in ranks) / a.workers for k in range(a.steps)]
    report(a, "torch", ranks[0][1], times, losses, mode=a.mode, workers=a.workers)


if __name__ == "__main__":
    main()
