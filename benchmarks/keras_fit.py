"""What does Keras' high-level API cost? `model.fit` against sextant's own loop, per backend.

Pairs, each the same workload, parameters, batches, schedule and AdamW math (parity within
1e-5, tests/test_keras.py), measured by the same rules (median step time after the
workload's warm-up steps):

    keras-jax compiled         vs  jax compiled          (jax.jit step)
    keras-torch eager          vs  torch eager
    keras-tensorflow compiled  vs  tensorflow compiled   (XLA)
    (--with-torch-compile adds keras-torch compiled vs torch compiled: torch.compile)

Every run is `sextant.runner.execute`, so every run is a fresh worker process. In each round
the pairs run in turn, and within a pair the order alternates between rounds (A B, then
B A), so that a noisy machine's drifts hit both sides. We print, per pair, the median over
rounds of each side's median step time and their ratio (keras / sextant: > 1 means fit is
slower).

    python benchmarks/keras_fit.py --workload gpt-tiny --steps 40 --rounds 3 [--threads 1]

What fit adds per step, besides the step itself: Keras' epoch iterator and PyDataset
adapter, its callback list (our measuring callback's `on_train_batch_end` makes Keras
convert the logs to Python floats every step: a host read-back per step, where sextant's
loops read back every `log_every` steps), and on JAX the state tuple it threads through the
jitted step. The model code differs too: Keras layers (Dense, LayerNormalization,
dot_product_attention) against each backend's hand-written canonical model, and the AdamW
update through Keras' optimizer (on torch, sextant's AdamW subclass runs Keras' per-variable
update loop, not its fused foreach path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PAIRS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("jax", {"framework": "keras", "mode": "compiled", "keras_backend": "jax"},
     {"framework": "jax", "mode": "compiled"}),
    ("torch eager", {"framework": "keras", "mode": "eager", "keras_backend": "torch"},
     {"framework": "torch", "mode": "eager"}),
    ("tensorflow", {"framework": "keras", "mode": "compiled", "keras_backend": "tensorflow"},
     {"framework": "tensorflow", "mode": "compiled"}),
]
TORCH_COMPILE = ("torch compiled",
                 {"framework": "keras", "mode": "compiled", "keras_backend": "torch"},
                 {"framework": "torch", "mode": "compiled"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="gpt-tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", default=None,
                        help="comma-separated pair names (default: all)")
    parser.add_argument("--with-torch-compile", action="store_true")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads of every run (default: sextant's, cores / workers)")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = parser.parse_args()

    from sextant.runner import execute
    from sextant.strategy import Strategy
    from sextant.sources import resolve_workload

    w = resolve_workload(args.workload).replace(steps=args.steps)
    w = w.replace(measure=w.measure.__class__(warmup_steps=w.measure.warmup_steps,
                                              nosync_steps=0, log_every=w.measure.log_every))
    pairs = PAIRS + ([TORCH_COMPILE] if args.with_torch_compile else [])
    if args.pairs:
        wanted = args.pairs.split(",")
        pairs = [p for p in pairs if p[0] in wanted]
    times: dict[str, dict[str, list[float]]] = {name: {"keras": [], "sextant": []}
                                                for name, _, _ in pairs}
    losses: dict[str, float] = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, keras_fields, own_fields in pairs:
                order = [("keras", keras_fields), ("sextant", own_fields)]
                if r % 2:
                    order.reverse()
                for side, fields in order:
                    record = execute(w, Strategy(**fields, threads=args.threads),
                                     runs_dir=Path(tmp))
                    times[name][side].append(record.metrics.step_time_median_s)
                    loss = record.losses[-1]
                    losses.setdefault(name, loss)
                    print(f"round {r + 1} {name:<15} {side:<8} "
                          f"{times[name][side][-1] * 1e3:8.2f} ms/step  final loss "
                          f"{loss:.6f}", flush=True)
    print(f"\n{args.workload}, {args.steps} steps (median after "
          f"{w.measure.warmup_steps} warm-up), threads {args.threads or 'default'}, "
          f"{args.rounds} rounds, fresh process per run, "
          f"{time.time() - started:.0f} s")
    print(f"{'backend':<16}{'keras fit ms':>14}{'sextant ms':>12}{'keras/sextant':>15}")
    summary = {}
    for name, sides in times.items():
        k, s = statistics.median(sides["keras"]), statistics.median(sides["sextant"])
        summary[name] = {"keras_ms": k * 1e3, "sextant_ms": s * 1e3, "ratio": k / s,
                         "rounds_keras_ms": [x * 1e3 for x in sides["keras"]],
                         "rounds_sextant_ms": [x * 1e3 for x in sides["sextant"]]}
        print(f"{name:<16}{k * 1e3:>14.2f}{s * 1e3:>12.2f}{k / s:>15.2f}")
    if args.out:
        args.out.write_text(json.dumps({"workload": args.workload, "steps": args.steps,
                                        "threads": args.threads,
                                        "rounds": args.rounds, "pairs": summary}, indent=2))


if __name__ == "__main__":
    main()
