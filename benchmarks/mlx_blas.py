"""How fast MLX multiplies matrices on this CPU, beside numpy and torch, in one process.

Why sextant's MLX rows are opt-in in `sextant compare` on Linux: the `mlx[cpu]` wheel bundles
the reference (netlib) BLAS, so every MLX matmul runs the textbook triple loop. Each size is
timed alternately (mlx, numpy, torch, mlx, ...) for `--rounds` rounds; the median GFLOP/s of
each library and the ratios to MLX are printed.

    python benchmarks/mlx_blas.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import mlx.core as mx
    import numpy as np
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print("float32 n x n @ n x n, median GFLOP/s over alternating rounds")
    print(f"{'n':>5} {'mlx':>8} {'numpy':>8} {'torch':>8} {'numpy/mlx':>10} {'torch/mlx':>10}")
    for n in (64, 256, 512):
        a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        am, at = mx.array(a), torch.from_numpy(a)
        runs = {
            "mlx": lambda: mx.eval(am @ am),
            "numpy": lambda: a @ a,
            "torch": lambda: at @ at,
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        for fn in runs.values():
            fn()  # warm-up
        reps = max(1, int(2e8 // n ** 3))
        for _ in range(args.rounds):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[name].append((time.perf_counter() - t0) / reps)
        rate = {k: 2 * n ** 3 / statistics.median(v) / 1e9 for k, v in times.items()}
        print(f"{n:>5} {rate['mlx']:>8.2f} {rate['numpy']:>8.2f} {rate['torch']:>8.2f} "
              f"{rate['numpy'] / rate['mlx']:>10.1f} {rate['torch'] / rate['mlx']:>10.1f}")


if __name__ == "__main__":
    main()
