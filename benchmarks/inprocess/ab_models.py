"""In-process A/B of the two torch models alone (issue #20): sextant's GPT (built and loaded
as the torch backend does) against the expert's nanoGPT-style GPT, same shapes, same batches
(sextant's), forward + backward + fused AdamW + zero_grad, alternating, 2 threads.

    .venv/bin/python benchmarks/inprocess/ab_models.py [--pairs 60] [--threads 2]
"""
# ruff: noqa: E402, I001
import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
p = argparse.ArgumentParser()
p.add_argument("--pairs", type=int, default=60)
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(args.threads)

import torch_gpt  # the expert's model (benchmarks/expert/torch_gpt.py)
from sextant import data
from sextant.backends.torch_backend import model as tm
from sextant.backends.torch_backend.train import adamw, adamw_groups
from sextant.init import init_params
from sextant.workload import resolve_workload

w = resolve_workload(str(ROOT / "benchmarks" / "expert" / "gpt-issue20.toml"))
m = w.model


o = w.optimizer


def sextant_side():
    """The model and optimizer as the torch backend builds them (its own helpers)."""
    params = init_params(m, 0)
    net = tm.build(m)
    tm.load_canonical(net, params)
    names = tm.canonical_names(net, params)
    optimizer, _ = adamw(adamw_groups(net, names, params, o.weight_decay), o)
    return tm.WithLoss(net), optimizer


def expert_side():
    """The expert's model, with its own decay rule (>= 2-D) and the same hyper-parameters."""
    a = SimpleNamespace(vocab=m.vocab_size, seq_len=m.seq_len, d_model=m.d_model,
                        n_layers=m.n_layers, n_heads=m.n_heads, d_ff=m.d_ff)
    net = torch_gpt.GPT(a)
    groups = [{"params": [q for q in net.parameters() if q.dim() >= 2],
               "weight_decay": o.weight_decay},
              {"params": [q for q in net.parameters() if q.dim() < 2], "weight_decay": 0.0}]
    return net, torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                  fused=True)


batches = [tuple(torch.from_numpy(x).contiguous() for x in data.global_batch(w, i)) for i in range(20)]
sides = {"sextant": sextant_side(), "expert": expert_side()}
times: dict[str, list[float]] = {k: [] for k in sides}


def step(name: str, i: int) -> float:
    mod, opt = sides[name]
    x, y = batches[i % 20]
    t0 = time.perf_counter()
    loss = mod(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


for i in range(10):  # warm-up, both
    for name in sides:
        step(name, i)
for i in range(args.pairs):
    order = ("sextant", "expert") if i % 2 == 0 else ("expert", "sextant")
    for name in order:
        times[name].append(step(name, i))
for name, t in times.items():
    s = sorted(t)
    print(f"{name:8s} median {statistics.median(t) * 1e3:7.2f} ms  p10 {s[len(s) // 10] * 1e3:7.2f}"
          f"  min {s[0] * 1e3:7.2f} ms  ({len(t)} steps, {args.threads} threads)")
print(f"ratio of medians {statistics.median(times['sextant']) / statistics.median(times['expert']):.3f}")
