"""What sextant's torch eager step does besides the expert's forward, backward, AdamW step and
zero_grad (issue #20), each timed alone in one process on the issue's GPT with real
gradients, 2 threads: the batch fetch (sextant.data.local_batch and the backend's fetch), the
gradient norm (the backend's par.grad_norm), the learning-rate assignment and the stacked
(loss, norm) handle.

    .venv/bin/python benchmarks/inprocess/step_extras.py [--reps 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sextant import data  # noqa: E402
from sextant.backends.torch_backend import model as tm  # noqa: E402
from sextant.backends.torch_backend import parallel as par  # noqa: E402
from sextant.backends.torch_backend.train import adamw, adamw_groups, loop_functions  # noqa: E402
from sextant.init import init_params  # noqa: E402
from sextant.workload import resolve_workload  # noqa: E402


def timed(fn, reps: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    w = resolve_workload(str(ROOT / "benchmarks" / "expert" / "gpt-issue20.toml"))
    params = init_params(w.model, w.seed)
    net = tm.build(w.model)
    tm.load_canonical(net, params)
    optimizer, _ = adamw(adamw_groups(net, tm.canonical_names(net, params), params,
                                      w.optimizer.weight_decay), w.optimizer)
    module = tm.WithLoss(net)
    fetch, _, _ = loop_functions(torch.device("cpu"), False,
                                 lambda i: data.local_batch(w, i, 0, 1, None))
    x, y = fetch(0)
    loss = module(x, y)
    loss.backward()
    trainable = list(net.parameters())
    norm = par.grad_norm(trainable)
    rows = {
        "sextant.data.local_batch": timed(lambda: data.local_batch(w, 7, 0, 1, None), a.reps),
        "fetch (local_batch + from_numpy + .to)": timed(lambda: fetch(7), a.reps),
        "gradient norm (par.grad_norm)": timed(lambda: par.grad_norm(trainable), a.reps),
        "learning-rate assignment": timed(
            lambda: [g.__setitem__("lr", 1e-3) for g in optimizer.param_groups], a.reps),
        "stack (loss, norm)": timed(
            lambda: torch.stack((loss.detach().float(), norm)), a.reps),
    }
    for name, seconds in rows.items():
        print(f"{name:<40} {seconds * 1e6:8.1f} us")
    print(f"{'sum':<40} {sum(rows.values()) * 1e6 - rows['sextant.data.local_batch'] * 1e6:8.1f}"
          " us (fetch counted once)")


if __name__ == "__main__":
    main()
