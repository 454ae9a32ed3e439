"""TensorFlow's deployment artifacts of the canonical model, through TensorFlow's own
exporters.

    savedmodel   a SavedModel with a `serving_default` signature (tokens -> logits), the
                 format TF Serving loads; served by `tf.saved_model.load` in a fresh process
    litert       the LiteRT (TFLite) converter's flatbuffer of that SavedModel, served by the
                 LiteRT interpreter (ai-edge-litert), without TensorFlow
    litert-int8  the same with dynamic-range quantization (int8 weights): a quantized row,
                 judged by its held-out loss change, never called a match
    onnx         tf2onnx's conversion of that SavedModel, served by ONNX Runtime

The signature takes any batch and any sequence length up to the model's seq_len.
Imported only in an export process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from sextant.backends.tf_backend.model import logits
from sextant.workloads.spec import ModelSpec

SIGNATURE = "serving_default"


def _module(spec: ModelSpec, params: dict[str, np.ndarray]) -> tf.Module:
    """A tf.Module holding the canonical parameters as variables, with the serving function."""
    module = tf.Module()
    # Attribute-safe names: a SavedModel's object graph keys variables by attribute path.
    module.params = [tf.Variable(value, trainable=False, name=name.replace(".", "_"))
                     for name, value in params.items()]
    names = list(params)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64, name="tokens")])
    def serve(tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        rows = logits(spec, dict(zip(names, module.params)), tokens)  # (B*T, V)
        return {"logits": tf.reshape(rows, (tf.shape(tokens)[0], tf.shape(tokens)[1], -1))}

    module.serve = serve
    return module


def reference(spec: ModelSpec, params: dict[str, np.ndarray]
              ) -> Callable[[np.ndarray], np.ndarray]:
    """TensorFlow's eager forward of the same functions: tokens (B, T) -> logits (B, T, V)."""
    p = {name: tf.constant(value) for name, value in params.items()}

    def forward(tokens: np.ndarray) -> np.ndarray:
        rows = logits(spec, p, tf.constant(tokens.astype(np.int64)))
        return rows.numpy().reshape(*tokens.shape, -1)

    return forward


def _saved_model(spec: ModelSpec, params: dict[str, np.ndarray], path: Path) -> None:
    module = _module(spec, params)
    tf.saved_model.save(module, str(path), signatures={SIGNATURE: module.serve})


def savedmodel(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
               out: Path) -> dict[str, Any]:
    _saved_model(spec, params, out / "saved_model")
    return {"file": "saved_model", "dynamic": ["batch", "seq"], "input_dtype": "int64",
            "signature": SIGNATURE}


def _litert(spec: ModelSpec, params: dict[str, np.ndarray], out: Path,
            quantize: bool) -> dict[str, Any]:
    staging = out / "staging_saved_model"
    _saved_model(spec, params, staging)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(staging))
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # dynamic-range: int8 weights
    path = out / "model.tflite"
    path.write_bytes(converter.convert())
    import shutil

    shutil.rmtree(staging)
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int64",
            "signature": SIGNATURE, "quantized": "int8 weights" if quantize else None}


def litert(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
           out: Path) -> dict[str, Any]:
    return _litert(spec, params, out, quantize=False)


def litert_int8(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
                out: Path) -> dict[str, Any]:
    return _litert(spec, params, out, quantize=True)


def onnx(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
         out: Path) -> dict[str, Any]:
    staging = out / "staging_saved_model"
    _saved_model(spec, params, staging)
    path = out / "model.onnx"
    # tf2onnx's documented entry point is its command line; its own process keeps its
    # logging and graph rewrites out of this one.
    done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model",
                           str(staging), "--output", str(path), "--opset", "17"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"tf2onnx: {lines[-1] if lines else done.returncode}")
    import shutil

    shutil.rmtree(staging)
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int64"}


EXPORTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "savedmodel": savedmodel,
    "litert": litert,
    "litert-int8": litert_int8,
    "onnx": onnx,
}
