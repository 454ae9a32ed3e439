"""Does the work sextant's loop does *between* steps slow the *next* step? (issue #20)

The expert's torch eager GPT (benchmarks/expert/torch_gpt.py, no sextant code in the step),
2 threads, in one process; blocks of --block steps alternate between variants, and only the
step itself is timed (forward, backward, AdamW, zero_grad on a prepared batch), never the
work between steps:

    bare      nothing between steps (the expert's loop)
    control   the same as bare (what two identical variants differ by: the noise)
    events    after each step, what sextant's loop does after its clock stops: one JSON event
              line written and flushed to a file, the RSS read from /proc, list appends
    sleep     the same wall time as `events` spent idle (time.sleep), to tell cache
              pollution from OpenMP worker threads going to sleep between steps
    sleep:US  US microseconds idle (time.sleep)
    spin:US   US microseconds of the main thread spinning in Python (its core stays busy,
              the OpenMP workers wait)

The first step of every block is dropped (it follows the previous variant). Prints each
variant's median and p10 step time and the per-block-round ratio to `bare`.

    python benchmarks/inprocess/between_steps.py --blocks 30 --block 10
"""
# ruff: noqa: E402
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
import torch

from sextant.measure import memory


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="bare,events,sleep")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.argv = [sys.argv[0]]
    import torch_gpt
    from common import parse

    a = parse("between steps")
    torch.manual_seed(0)
    model = torch_gpt.GPT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=True)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, a.vocab, (32, a.batch, a.seq_len + 1), generator=g)
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    events = open(Path(tempfile.mkdtemp()) / "rank0.events.jsonl", "a")  # noqa: SIM115
    event_s: list[float] = []

    def bookkeeping(k: int, t: float) -> None:
        record = {"schema": 1, "event": "step", "rank": 0, "time": time.time(), "step": k,
                  "loss": None, "step_time_s": t, "data_time_s": 0.0, "rows": a.batch,
                  "rss_bytes": memory.current_rss()}
        events.write(json.dumps(record) + "\n")
        events.flush()

    def sleeper(k: int, t: float) -> None:
        time.sleep(statistics.median(event_s) if event_s else 60e-6)

    def sleep_for(us: float):  # noqa: ANN202
        return lambda k, t: time.sleep(us / 1e6)

    def spin_for(us: float):  # noqa: ANN202
        def spin(k: int, t: float) -> None:
            end = time.perf_counter() + us / 1e6
            while time.perf_counter() < end:
                pass
        return spin

    between = {"bare": None, "control": None, "events": bookkeeping, "sleep": sleeper}
    names = args.variants.split(",")
    for n in names:
        kind, _, us = n.partition(":")
        if kind == "sleep" and us:
            between[n] = sleep_for(float(us))
        elif kind == "spin":
            between[n] = spin_for(float(us))
    times: dict[str, list[list[float]]] = {n: [] for n in names}
    k = 0
    for _ in range(3 * args.block):  # warm-up
        x, y = batches[k % 32]
        model(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        k += 1
    for _ in range(args.blocks):
        for name in names:
            fn, block = between[name], []
            for _ in range(args.block):
                x, y = batches[k % 32]
                t0 = time.perf_counter()
                loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                t = time.perf_counter() - t0
                block.append(t)
                if fn is not None:
                    te = time.perf_counter()
                    fn(k, t)
                    if name == "events":
                        event_s.append(time.perf_counter() - te)
                k += 1
            times[name].append(block[1:])
    flat = {n: sorted(s for b in v for s in b) for n, v in times.items()}
    base = [statistics.median(b) for b in times[names[0]]]
    for n in names:
        v = flat[n]
        per = [statistics.median(b) / r for b, r in zip(times[n], base)]
        print(f"{n:8s} median {statistics.median(v) * 1e3:7.3f} ms  p10 {v[len(v) // 10] * 1e3:7.3f}"
              f" ms  per-round ratio to {names[0]}: median {statistics.median(per):.4f}"
              f" ({len(per)} rounds)")
    if event_s:
        print(f"events between steps: median {statistics.median(event_s) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
