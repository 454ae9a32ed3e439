"""Keras 3's deployment artifacts of the canonical model, through `Model.export`.

    savedmodel  format="tf_saved_model"
    onnx        format="onnx"
    litert      format="litert"

Keras exports from its TensorFlow backend (KERAS_BACKEND=tensorflow, set by the export
process before Keras is imported): that is where all three formats exist (on the JAX
backend Keras 3 offers no LiteRT export, and its ONNX export of this model fails). The
layers and the canonical parameters are the same as in training on any Keras backend.
Imported only in an export process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402 - after KERAS_BACKEND

from sextant.backends.keras_backend.model import build  # noqa: E402
from sextant.workloads.spec import ModelSpec  # noqa: E402

KERAS_EXPORT_BACKEND = "tensorflow"
SIGNATURE = "serving_default"


def reference(spec: ModelSpec, params: dict[str, np.ndarray]
              ) -> Callable[[np.ndarray], np.ndarray]:
    """The Keras model's own forward: tokens (B, T) -> logits (B, T, V)."""
    model, _ = build(spec, params)
    return lambda tokens: np.asarray(model(tokens.astype(np.int32), training=False))


def _export(fmt: str, name: str, spec: ModelSpec, params: dict[str, np.ndarray],
            sample: np.ndarray, out: Path) -> dict[str, Any]:
    if keras.backend.backend() != KERAS_EXPORT_BACKEND:
        raise RuntimeError(f"Keras exports from its {KERAS_EXPORT_BACKEND} backend; this "
                           f"process runs {keras.backend.backend()}")
    model, _ = build(spec, params)
    path = out / name
    signature = [keras.InputSpec(shape=(None, sample.shape[1]), dtype="int32")]
    model.export(str(path), format=fmt, verbose=False, input_signature=signature)
    return {"file": name, "dynamic": ["batch"], "input_dtype": "int32",
            "signature": SIGNATURE, "keras_backend": KERAS_EXPORT_BACKEND}


def savedmodel(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
               out: Path) -> dict[str, Any]:
    return _export("tf_saved_model", "saved_model", spec, params, sample, out)


def onnx(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
         out: Path) -> dict[str, Any]:
    return _export("onnx", "model.onnx", spec, params, sample, out)


def litert(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
           out: Path) -> dict[str, Any]:
    return _export("litert", "model.tflite", spec, params, sample, out)


EXPORTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "savedmodel": savedmodel,
    "onnx": onnx,
    "litert": litert,
}
