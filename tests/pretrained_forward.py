"""sextant's own forward pass on a pretrained checkpoint, in one framework per process:
`python -m tests.pretrained_forward FRAMEWORK OUT_DIR SPEC...` writes OUT_DIR/<i>.npy, the
fp32 logits (B, T, V) of SPEC number i (an `hf:DIR,seq_len=T` workload) on the tokens in
DIR/tokens.npy. The parameters come from sextant.pretrained.weights.initial_params, the function every
backend's worker starts from; the logits from each backend's model code."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _logits(framework: str, spec: Any, params: dict[str, np.ndarray], tokens: np.ndarray
            ) -> np.ndarray:
    B, T = tokens.shape
    if framework == "torch":  # DeepSpeed trains these same modules
        import torch

        from sextant.backends.torch_backend.model import build, load_canonical

        net = build(spec)
        load_canonical(net, params)
        with torch.no_grad():
            return net(torch.from_numpy(tokens)).numpy()
    if framework == "jax":
        import jax.numpy as jnp

        from sextant.backends.jax_backend.model import model_logits

        p = {k: jnp.asarray(v) for k, v in params.items()}
        return np.asarray(model_logits(spec, p, jnp.asarray(tokens)))
    if framework == "tensorflow":
        import tensorflow as tf

        from sextant.backends.tf_backend.model import logits as tf_logits

        p = {k: tf.constant(v) for k, v in params.items()}
        return tf_logits(spec, p, tf.constant(tokens)).numpy().reshape(B, T, -1)
    if framework == "mlx":
        import mlx.core as mx

        from sextant.backends.mlx_backend.model import model_logits as mlx_logits, to_tree

        return np.array(mlx_logits(spec, to_tree(params), mx.array(tokens)))
    if framework == "keras":
        os.environ.setdefault("KERAS_BACKEND", "jax")
        from sextant.backends.keras_backend.model import build as keras_build

        model, _ = keras_build(spec, params)
        return np.asarray(model(tokens))
    raise SystemExit(f"unknown framework {framework}")


def main(argv: list[str]) -> None:
    from sextant.sources import resolve_workload
    from sextant.pretrained.weights import initial_params

    framework, out_dir, *specs = argv
    for i, spec in enumerate(specs):
        workload = resolve_workload(spec)
        folder = Path(workload.weights)
        tokens = np.load(folder / "tokens.npy")
        logits = _logits(framework, workload.model, initial_params(workload), tokens)
        np.save(Path(out_dir) / f"{i}.npy", np.asarray(logits, np.float32))


if __name__ == "__main__":
    main(sys.argv[1:])
