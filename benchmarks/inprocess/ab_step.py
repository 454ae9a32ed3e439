"""Kept as run for docs/benchmarks.md (issue #20); see README.md here."""
# ruff: noqa: E401, E402, E501, E701, E702, E731, F401, I001
import sys
import time
import statistics
import torch
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
torch.set_num_threads(1)
from sextant.workload import resolve_workload
from sextant import data
from sextant.backends.torch_backend import model as tm
from sextant.init import init_params, decays
w = resolve_workload(str(ROOT / "benchmarks" / "expert" / "gpt-issue20.toml"))
def build():
    p = init_params(w.model, 0); net = tm.build(w.model); tm.load_canonical(net, p)
    names = tm.canonical_names(net, p)
    dec = [q for k, q in net.named_parameters() if decays(names[k], p[names[k]].shape)]
    nod = [q for k, q in net.named_parameters() if not decays(names[k], p[names[k]].shape)]
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": 0.1}, {"params": nod, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    return net, tm.WithLoss(net), opt
A = build(); B = build()
batches = [tuple(torch.from_numpy(a) for a in data.global_batch(w, i)) for i in range(20)]
def sextant_step(i):
    net, mod, opt = A
    x, y = (torch.from_numpy(a) for a in data.global_batch(w, i))
    loss = mod(x, y); loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in net.parameters() if p.grad is not None], foreach=True)
    out = torch.stack((loss.detach().float(), norm))
    for g in opt.param_groups: g["lr"] = 1e-3
    opt.step(); opt.zero_grad(set_to_none=True); return out
def expert_step(i):
    net, mod, opt = B
    x, y = batches[i % 20]
    loss = mod(x, y); loss.backward()
    for g in opt.param_groups: g["lr"] = 1e-3
    opt.step(); opt.zero_grad(set_to_none=True); return loss
res = {"sextant": [], "expert": []}
for i in range(60):
    for k, f in (("sextant", sextant_step), ("expert", expert_step)):
        t0 = time.perf_counter(); f(i); res[k].append(time.perf_counter() - t0)
for k, v in res.items(): print(f"{k:10s} med {statistics.median(v[5:])*1e3:7.2f} ms  p10 {sorted(v[5:])[5]*1e3:7.2f}")
