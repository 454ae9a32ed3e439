"""DeepSpeed's pipeline TrainSchedule, simulated: how long a step takes with blocking sends.

    .venv/bin/python benchmarks/pipeline_schedule.py [--stages 35] [--micro-batches 240]
        [--forward 1] [--backward 3] [--send-activation 0] [--send-gradient 0]

The schedule and the rendezvous rule: sextant/measure/pipeline_schedule.py.
"""

from __future__ import annotations

import argparse

from sextant.measure.pipeline_schedule import simulate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=35)
    p.add_argument("--micro-batches", type=int, default=240)
    p.add_argument("--forward", type=float, default=1.0)
    p.add_argument("--backward", type=float, default=3.0)
    p.add_argument("--send-activation", type=float, default=0.0)
    p.add_argument("--send-gradient", type=float, default=0.0)
    a = p.parse_args()
    if a.stages < 1 or a.micro_batches < 1:
        p.error("--stages and --micro-batches must be at least 1")
    step = simulate(a.stages, a.micro_batches, a.forward, a.backward, a.send_activation,
                    a.send_gradient)
    unit = a.forward + a.backward
    print(f"{a.stages} stages, {a.micro_batches} micro-batches: step {step:g} = "
          f"({a.micro_batches} + {step / unit - a.micro_batches:.2f}) micro-batch times "
          f"(1F1B's bubble: p - 1 = {a.stages - 1})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
