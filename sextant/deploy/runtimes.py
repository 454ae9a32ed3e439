"""The serving runtimes: each loads one kind of artifact in the serving process and returns
a call tokens (B, T) int -> logits (B, T, V) float32, with its threads pinned.

Only the runtime's own package is imported (an ONNX model is served by onnxruntime alone, a
LiteRT flatbuffer by the LiteRT interpreter alone), so the serving process's start-up time and
memory are those of that runtime, as in production.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Forward = Callable[[np.ndarray], np.ndarray]


def _torch_call(model: Any, threads: int) -> Forward:
    import torch

    torch.set_num_threads(threads)

    def forward(tokens: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(tokens)).numpy()

    return forward


def _torch(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    import torch

    return _torch_call(torch.export.load(str(path)).module(), threads)


def _aoti(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    import torch

    return _torch_call(torch._inductor.aoti_load_package(str(path)), threads)


def _executorch(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    import torch
    from executorch.runtime import Runtime

    torch.set_num_threads(threads)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    return lambda tokens: method.execute([torch.from_numpy(tokens)])[0].numpy()


def _onnxruntime(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda tokens: session.run(None, {name: tokens})[0]


def _tensorflow(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loaded = tf.saved_model.load(str(path))
    signature = loaded.signatures[meta.get("signature", "serving_default")]
    (name,) = signature.structured_input_signature[1]  # the one keyword input

    def forward(tokens: np.ndarray) -> np.ndarray:
        outputs = signature(**{name: tf.constant(tokens)})
        return next(iter(outputs.values())).numpy()

    return forward


def _litert(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    signatures = interpreter.get_signature_list()
    key = meta.get("signature") if meta.get("signature") in signatures else next(iter(signatures))
    runner = interpreter.get_signature_runner(key)
    (name,) = signatures[key]["inputs"]
    return lambda tokens: next(iter(runner(**{name: tokens}).values()))


def _jax(path: Path, meta: dict[str, Any], threads: int) -> Forward:
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                       f"intra_op_parallelism_threads={threads}")
    import jax

    exported = jax.export.deserialize(bytearray(path.read_bytes()))
    return lambda tokens: np.asarray(exported.call(tokens))


RUNTIMES: dict[str, Callable[[Path, dict[str, Any], int], Forward]] = {
    "torch": _torch,
    "aoti": _aoti,
    "executorch": _executorch,
    "onnxruntime": _onnxruntime,
    "tensorflow": _tensorflow,
    "litert": _litert,
    "jax": _jax,
}


def load(runtime: str, path: Path, meta: dict[str, Any], threads: int) -> Forward:
    """The artifact at `path` as a forward, tokens cast to the dtype it was exported with."""
    forward = RUNTIMES[runtime](path, meta, threads)
    dtype = np.dtype(meta.get("input_dtype", "int64"))
    return lambda tokens: np.asarray(forward(np.ascontiguousarray(tokens, dtype=dtype)),
                                     dtype=np.float32)
