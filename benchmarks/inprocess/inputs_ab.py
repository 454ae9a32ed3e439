"""Do sextant's inputs (its initial weights, its text batches) make the same step slower than
the expert's own (normal(0, 0.02) init, random byte tokens)? (issue #20)

The expert's torch eager GPT and step (benchmarks/expert/torch_gpt.py), 2 threads, one
process, four models trained side by side in alternating blocks of --block steps:
own weights + random tokens (the expert loop), own weights + sextant's batches, sextant's
weights + random tokens, sextant's weights + sextant's batches (the inputs file of
benchmarks/expert_ratio.py's NAME+sxinputs configurations). Only the step is timed; the
first step of every block is dropped. Prints each variant's pooled median and p10 and its
per-round ratio to the first.

    python benchmarks/inprocess/inputs_ab.py --rounds 40 --block 10
"""
# ruff: noqa: E402
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "expert"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workload", default=str(ROOT / "benchmarks" / "expert" / "gpt-issue20.toml"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import expert_ratio

    steps = args.rounds * args.block
    flags, _, _ = expert_ratio.expert_shape_flags(args.workload, steps)
    inputs = expert_ratio.sextant_inputs(args.workload, steps)
    sys.argv = [sys.argv[0], *flags, "--inputs", str(inputs)]
    import torch_gpt
    from common import parse

    a = parse("inputs A/B")
    rows = a.batch
    g = torch.Generator().manual_seed(a.seed + 1)
    data = torch.randint(0, a.vocab, (steps, rows, a.seq_len + 1), generator=g)
    random_batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]

    def variant(sextant_weights: bool, sextant_data: bool):  # noqa: ANN202
        torch.manual_seed(a.seed)
        model = torch_gpt.GPT(a)
        given = torch_gpt.given_inputs(a, model, 0, rows) if sextant_weights else None
        if sextant_data and given is None:
            given = torch_gpt.given_inputs(a, torch_gpt.GPT(a), 0, rows)
        batches = given if sextant_data else random_batches
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=True)
        return model, opt, batches

    variants = {
        "own weights, random tokens": variant(False, False),
        "own weights, sextant batches": variant(False, True),
        "sextant weights, random tokens": variant(True, False),
        "sextant weights, sextant batches": variant(True, True),
    }
    times: dict[str, list[list[float]]] = {n: [] for n in variants}
    k = 0
    for r in range(args.rounds):
        for name, (model, opt, batches) in variants.items():
            block = []
            for j in range(args.block):
                x, y = batches[(r * args.block + j) % len(batches)]
                t0 = time.perf_counter()
                model(x, y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                block.append(time.perf_counter() - t0)
                k += 1
            times[name].append(block[1:])
    names = list(variants)
    base = [statistics.median(b) for b in times[names[0]]]
    for n in names:
        flat = sorted(s for b in times[n] for s in b)
        per = [statistics.median(b) / x for b, x in zip(times[n], base)]
        print(f"{n:34s} median {statistics.median(flat) * 1e3:7.3f} ms  p10 "
              f"{flat[len(flat) // 10] * 1e3:7.3f} ms  per-round ratio {statistics.median(per):.4f}")


if __name__ == "__main__":
    main()
