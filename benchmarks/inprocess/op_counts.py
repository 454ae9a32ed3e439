"""Kept as run for docs/benchmarks.md (issue #20); see README.md here.

torch.profiler over 10 eager steps of each side, one process, 2 threads: sextant's step code
(its model, WithLoss, the fetch from sextant.data, get_total_norm + stack, fused AdamW) and
the expert's (benchmarks/expert/torch_gpt.py's model on prepared batches). Prints the aten
operators each side dispatches per step (a count that the machine's load cannot change) and
their self CPU time."""
# ruff: noqa: E401, E402, E501, E701, E702, E731, I001
import sys, types, collections
import torch
from torch.profiler import profile, ProfilerActivity
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
torch.set_num_threads(2)
from sextant.workload import resolve_workload
from sextant import data
from sextant.backends.torch_backend import model as tm
from sextant.init import init_params, decays
import torch_gpt
w = resolve_workload(str(ROOT / "benchmarks" / "expert" / "gpt-issue20.toml"))
m = w.model
p = init_params(m, 0); net = tm.build(m); tm.load_canonical(net, p); names = tm.canonical_names(net, p)
dec = [q for k, q in net.named_parameters() if decays(names[k], p[names[k]].shape)]
nod = [q for k, q in net.named_parameters() if not decays(names[k], p[names[k]].shape)]
kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
opt_s = torch.optim.AdamW([{"params": dec, "weight_decay": 0.1}, {"params": nod, "weight_decay": 0.0}], **kw)
mod = tm.WithLoss(net)
a = types.SimpleNamespace(vocab=m.vocab_size, d_model=m.d_model, seq_len=m.seq_len, n_heads=m.n_heads, d_ff=m.d_ff, n_layers=m.n_layers)
ex = torch_gpt.GPT(a)
opt_e = torch.optim.AdamW([{"params": [q for q in ex.parameters() if q.dim() >= 2], "weight_decay": 0.1},
                           {"params": [q for q in ex.parameters() if q.dim() < 2], "weight_decay": 0.0}], **kw)
prepared = [tuple(torch.from_numpy(v).contiguous() for v in data.global_batch(w, i)) for i in range(10)]

def sextant_step(i):
    x, y = (torch.from_numpy(v) for v in data.global_batch(w, i))
    loss = mod(x, y); loss.backward()
    n = torch.nn.utils.get_total_norm([q.grad for q in net.parameters() if q.grad is not None], foreach=True)
    out = torch.stack((loss.detach().float(), n))
    for g in opt_s.param_groups: g["lr"] = 1e-3
    opt_s.step(); opt_s.zero_grad(set_to_none=True); return out

def expert_step(i):
    x, y = prepared[i]
    loss = ex(x, y); loss.backward()
    for g in opt_e.param_groups: g["lr"] = 1e-3
    opt_e.step(); opt_e.zero_grad(set_to_none=True); return loss.detach()

for name, fn in (("sextant", sextant_step), ("expert", expert_step)):
    for i in range(3): fn(i)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(10): fn(i)
    counts, self_us = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.name.startswith("aten::"):
            counts[e.name] += 1; self_us[e.name] += e.self_cpu_time_total
    print(f"{name}: {sum(counts.values()) / 10:.1f} aten ops per step, self CPU {sum(self_us.values()) / 10 / 1e3:.2f} ms per step")
    globals()[name] = (counts, self_us)
s, e = globals()["sextant"], globals()["expert"]
print(f"{'operator':40s} {'sextant n':>9s} {'expert n':>9s} {'sextant ms':>10s} {'expert ms':>10s}")
for op in sorted(set(s[0]) | set(e[0]), key=lambda o: -abs(s[1][o] - e[1][o])):
    if s[0][op] != e[0][op] or abs(s[1][op] - e[1][op]) > 500:
        print(f"{op:40s} {s[0][op] / 10:9.1f} {e[0][op] / 10:9.1f} {s[1][op] / 1e4:10.3f} {e[1][op] / 1e4:10.3f}")
