"""JAX's deployment artifacts of the canonical model, through JAX's own exporters.

    jax-export  `jax.export` of the jitted forward with the parameters as constants,
                serialized StableHLO, deserialized and called in a fresh process (batch and
                sequence length symbolic, the latter bounded by the model's seq_len)
    savedmodel  jax2tf (native serialization: the same StableHLO inside an XlaCallModule op)
                saved as a SavedModel with a `serving_default` signature
    litert      the LiteRT converter's flatbuffer of such a SavedModel at a fixed sequence
                length
    onnx        jax2onnx's conversion, served by ONNX Runtime (symbolic batch only)

Tokens are int32 (JAX's default integer width). Imported only in an export process.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sextant.backends.jax_backend.model import gpt_logits, llama_logits
from sextant.workloads.spec import LlamaSpec, ModelSpec

SIGNATURE = "serving_default"


def _forward(spec: ModelSpec, params: dict[str, np.ndarray]) -> Callable[[Any], Any]:
    p = {name: jnp.asarray(value) for name, value in params.items()}
    logits = llama_logits if isinstance(spec, LlamaSpec) else gpt_logits
    return lambda tokens: logits(spec, p, tokens)  # type: ignore[arg-type]


def reference(spec: ModelSpec, params: dict[str, np.ndarray]
              ) -> Callable[[np.ndarray], np.ndarray]:
    """JAX's own forward (jitted, as JAX runs it): tokens (B, T) -> logits (B, T, V)."""
    forward = jax.jit(_forward(spec, params))
    return lambda tokens: np.asarray(forward(tokens.astype(np.int32)))


def _symbolic(spec: ModelSpec) -> tuple[Any, ...]:
    return jax.export.symbolic_shape(
        "batch, seq", constraints=(f"seq <= {getattr(spec, 'seq_len')}",))


def jax_export(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
               out: Path) -> dict[str, Any]:
    exported = jax.export.export(jax.jit(_forward(spec, params)))(
        jax.ShapeDtypeStruct(_symbolic(spec), jnp.int32))
    path = out / "model.jaxexport"
    path.write_bytes(exported.serialize())
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int32"}


def _saved_model(spec: ModelSpec, params: dict[str, np.ndarray], path: Path,
                 dynamic_seq: bool = True) -> None:
    """jax2tf's SavedModel; `dynamic_seq` False fixes the sequence length, as a LiteRT model
    is converted (the LiteRT converter refuses the shape-polymorphic StableHLO of the
    rotary tables' slice)."""
    import tensorflow as tf
    from jax.experimental import jax2tf

    seq_len = getattr(spec, "seq_len")
    converted = jax2tf.convert(
        _forward(spec, params), with_gradient=False,
        polymorphic_shapes=["(b, t)" if dynamic_seq else f"(b, {seq_len})"],
        polymorphic_constraints=(f"t <= {seq_len}",) if dynamic_seq else ())
    module = tf.Module()
    module.serve = tf.function(
        lambda tokens: {"logits": converted(tokens)}, autograph=False,
        input_signature=[tf.TensorSpec([None, None if dynamic_seq else seq_len], tf.int32,
                                       name="tokens")])
    tf.saved_model.save(module, str(path), signatures={SIGNATURE: module.serve})


def savedmodel(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
               out: Path) -> dict[str, Any]:
    _saved_model(spec, params, out / "saved_model")
    return {"file": "saved_model", "dynamic": ["batch", "seq"], "input_dtype": "int32",
            "signature": SIGNATURE}


def litert(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
           out: Path) -> dict[str, Any]:
    import tensorflow as tf

    staging = out / "staging_saved_model"
    _saved_model(spec, params, staging, dynamic_seq=False)
    path = out / "model.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(staging)).convert())
    shutil.rmtree(staging)
    return {"file": path.name, "dynamic": ["batch"], "input_dtype": "int32",
            "signature": SIGNATURE}


def onnx(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
         out: Path) -> dict[str, Any]:
    import jax2onnx

    path = out / "model.onnx"
    jax2onnx.to_onnx(_forward(spec, params),
                     inputs=[jax.ShapeDtypeStruct(("batch", sample.shape[1]), jnp.int32)],
                     return_mode="file", output_path=str(path))
    return {"file": path.name, "dynamic": ["batch"], "input_dtype": "int32"}


EXPORTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "jax-export": jax_export,
    "savedmodel": savedmodel,
    "litert": litert,
    "onnx": onnx,
}
