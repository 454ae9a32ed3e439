"""PyTorch's deployment artifacts of the canonical model, through PyTorch's own exporters.

    torch-export  an ExportedProgram (`torch.export.export`, saved as .pt2), served by
                  `torch.export.load(...).module()`
    onnx          `torch.onnx.export(..., dynamo=True)`, served by ONNX Runtime
    aoti          an AOTInductor package (`aoti_compile_and_package`), compiled with the host's
                  C++ compiler, served by `aoti_load_package`
    executorch    an ExecuTorch program (.pte, `to_edge_transform_and_lower` with the XNNPACK
                  partitioner), served by ExecuTorch's Python runtime: the on-device row

Every artifact is exported from the eval-mode module holding the canonical parameters, with a
dynamic batch and, where the exporter takes one, a dynamic sequence length (at most the
model's seq_len: its position table is that long). Imported only in an export process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sextant.backends.torch_backend.model import build, load_canonical
from sextant.workloads.spec import ModelSpec


def eager(spec: ModelSpec, params: dict[str, np.ndarray]) -> torch.nn.Module:
    net = build(spec)
    load_canonical(net, params)
    return net.eval()


def reference(spec: ModelSpec, params: dict[str, np.ndarray]
              ) -> Callable[[np.ndarray], np.ndarray]:
    """The training framework's own eager forward: tokens (B, T) -> logits (B, T, V)."""
    net = eager(spec, params)

    def forward(tokens: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(tokens.astype(np.int64))).numpy()

    return forward


def _dims(spec: ModelSpec) -> tuple[Any, Any]:
    seq_len = getattr(spec, "seq_len")
    # torch.export specialises a dimension whose example size is 1; min=1 keeps batch 1 legal.
    return (torch.export.Dim("batch", min=1, max=4096),
            torch.export.Dim("seq", min=2, max=seq_len))


def _exported(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
              dynamic_seq: bool = True) -> Any:
    batch, seq = _dims(spec)
    shapes = {0: batch, 1: seq} if dynamic_seq else {0: batch}
    return torch.export.export(eager(spec, params), (torch.from_numpy(sample),),
                               dynamic_shapes=(shapes,))


def torch_export(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
                 out: Path) -> dict[str, Any]:
    path = out / "model.pt2"
    torch.export.save(_exported(spec, params, sample), str(path))
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int64"}


def onnx(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
         out: Path) -> dict[str, Any]:
    path = out / "model.onnx"
    program = torch.onnx.export(eager(spec, params), (torch.from_numpy(sample),),
                                input_names=["tokens"], output_names=["logits"],
                                dynamic_shapes=({0: "batch", 1: "seq"},), dynamo=True,
                                verbose=False)
    program.save(str(path))
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int64"}


def aoti(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
         out: Path) -> dict[str, Any]:
    path = out / "model.aoti.pt2"
    torch._inductor.aoti_compile_and_package(_exported(spec, params, sample),
                                             package_path=str(path))
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int64"}


def executorch(spec: ModelSpec, params: dict[str, np.ndarray], sample: np.ndarray,
               out: Path) -> dict[str, Any]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = to_edge_transform_and_lower(_exported(spec, params, sample),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    path = out / "model.pte"
    path.write_bytes(program.buffer)
    return {"file": path.name, "dynamic": ["batch", "seq"], "input_dtype": "int64"}


EXPORTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "torch-export": torch_export,
    "onnx": onnx,
    "aoti": aoti,
    "executorch": executorch,
}
