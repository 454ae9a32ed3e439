"""Pretrained weights: a Hugging Face checkpoint's tensors as sextant's canonical parameters.

A workload with `weights = "DIR"` starts from the tensors of DIR's `*.safetensors` (one file,
or the shards its `model.safetensors.index.json` names) instead of the seeded ones. They are
read with `safetensors` into numpy, never through pickle, mapped once to the canonical names
and layouts of sextant.workloads.init, and every backend receives them exactly as it receives seeded
parameters (`initial_params`), so the frameworks still start from bit-identical weights.

The mapping, per family (HF dense weights are nn.Linear's (out, in) and are transposed to
the canonical (in, out); GPT-2's Conv1D weights are (in, out) already):

    llama (Llama, Mistral, Qwen2)            gpt (GPT-2)
    model.embed_tokens.weight -> wte         [transformer.]wte.weight -> wte
    model.layers.i.input_layernorm           [transformer.]wpe.weight -> wpe (its first
      -> blocks.i.attn_norm.scale              seq_len rows: the positions a sequence uses)
    ...self_attn.{q,k,v,o}_proj.weight (T)   ...h.i.ln_1 / ln_2 -> blocks.i.ln1 / ln2
    ...self_attn.{q,k,v}_proj.bias (Qwen2)   ...h.i.attn.c_attn -> blocks.i.attn.qkv
    ...post_attention_layernorm              ...h.i.attn.c_proj -> blocks.i.attn.proj
      -> blocks.i.mlp_norm.scale             ...h.i.mlp.c_fc / c_proj -> blocks.i.mlp.fc / proj
    ...mlp.{gate,up,down}_proj.weight (T)    [transformer.]ln_f -> ln_f
    model.norm.weight -> norm_f.scale        lm_head.weight (T) -> head.weight (untied only)
    lm_head.weight (T) -> head.weight (untied only)

A tensor the model needs that the checkpoint lacks, one it holds that the model does not
use, and one of the wrong shape are each refused in one line naming the tensor. Left out
without a word: the buffers older checkpoints saved that are not parameters (GPT-2's causal
mask `attn.bias`/`attn.masked_bias`, Llama's `rotary_emb.inv_freq`), and a tied model's
`lm_head.weight` when it equals the embedding (some checkpoints store both).

Weights saved in bf16, fp16 or fp64 are widened (or rounded) to fp32, the master-weight
dtype of every backend.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from sextant.core.errors import UserError
from sextant.workloads.init import adapter_shapes, init_adapters, init_params, is_adapter, param_shapes
from sextant.workloads.spec import GPTSpec, LlamaSpec, ModelSpec, Workload

INDEX = "model.safetensors.index.json"
"""The file that names a sharded checkpoint's shards (tensor name -> file)."""
_BUFFERS = re.compile(r"(^|\.)(attn\.bias|attn\.masked_bias|rotary_emb\.inv_freq)$")
_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def initial_params(workload: Workload) -> dict[str, np.ndarray]:
    """The parameters every backend starts from: the workload's pretrained weights when it
    names a folder of them, else the seeded ones of sextant.workloads.init (float32, canonical order);
    then, for LoRA, its adapters (sextant.workloads.init.init_adapters)."""
    if workload.weights:
        folder = Path(workload.weights)
        if workload.weights_digest and weights_digest(folder) != workload.weights_digest:
            raise UserError(f"weights: the checkpoint in {folder} is not the one the workload "
                            f"was loaded with (its files' contents changed); give every host "
                            f"the same files")
        base = load_weights(workload.model, folder)
    else:
        base = init_params(workload.model, workload.seed)
    return {**base, **init_adapters(workload.model, workload.finetune, workload.seed)}


def bf16_base_names(workload: Workload) -> frozenset[str]:
    """The parameters a bf16 frozen base (finetune.base_dtype = 'bf16') stores in bfloat16:
    every block's projection matrices, rounded to nearest even once, each upcast to fp32 where
    a matmul uses it (so every backend computes the same fp32 model of the rounded base). The
    embeddings, head, norms and biases stay fp32: a small share of a real model's bytes, and
    the parts mixed-precision recipes keep in fp32 anyway."""
    if workload.finetune.base_dtype != "bf16":
        return frozenset()
    return frozenset(k for k, shape in param_shapes(workload.model).items()
                     if k.startswith("blocks.") and len(shape) == 2)


def trainable(workload: Workload, name: str) -> bool:
    """Whether the optimizer updates canonical parameter `name`: all of them in full
    fine-tuning, only the adapters under LoRA (the base, norms included, is frozen)."""
    return not workload.finetune.lora or is_adapter(name)


def trainable_count(workload: Workload) -> tuple[int, int]:
    """(trainable parameters, all parameters), the figures PEFT prints."""
    shapes = {**param_shapes(workload.model),
              **adapter_shapes(workload.model, workload.finetune)}
    total = sum(math.prod(s) for s in shapes.values())
    return sum(math.prod(s) for n, s in shapes.items() if trainable(workload, n)), total


def weights_digest(folder: Path) -> str:
    """The content hash of the checkpoint in `folder`: each weight file's name and streamed
    sha256, kept in the data cache's hash index by the file's identity (device, inode, size,
    modification and change times), so an unchanged checkpoint is read once. The same weights
    in another folder hash the same; changed weights in the same folder do not."""
    from sextant.data.files import survey

    files = weight_files(folder)
    seen = survey([str(f) for f in files])
    key = [[f.name, one.sha256] for f, one in zip(files, seen, strict=True)]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def has_weights(folder: Path) -> bool:
    """Whether `folder` holds a safetensors checkpoint (one file or an index of shards)."""
    return (folder / INDEX).is_file() or any(folder.glob("*.safetensors"))


def hf_names(model: ModelSpec) -> dict[str, tuple[str, bool]]:
    """Canonical name -> (the tensor's name in a Hugging Face checkpoint, whether it is
    transposed on the way in), for every parameter of `model`, in canonical order."""
    if isinstance(model, LlamaSpec):
        rename = _llama_name
    elif isinstance(model, GPTSpec):
        rename = _gpt_name
    else:
        raise UserError(f"pretrained weights are for the gpt and llama families, not "
                        f"{model.family}")
    return {name: rename(name) for name in param_shapes(model)}


_LLAMA_PARTS = {"attn_norm.scale": "input_layernorm.weight",
                "mlp_norm.scale": "post_attention_layernorm.weight"}


def _llama_name(name: str) -> tuple[str, bool]:
    if name == "wte":
        return "model.embed_tokens.weight", False
    if name == "norm_f.scale":
        return "model.norm.weight", False
    if name == "head.weight":
        return "lm_head.weight", True
    _, i, part = name.split(".", 2)
    if part in _LLAMA_PARTS:
        return f"model.layers.{i}.{_LLAMA_PARTS[part]}", False
    module, proj, kind = part.split(".")  # attn.q.weight, mlp.gate.weight, attn.k.bias
    where = "self_attn" if module == "attn" else "mlp"
    return f"model.layers.{i}.{where}.{proj}_proj.{kind}", kind == "weight"


_GPT_PARTS = {"ln1": "ln_1", "ln2": "ln_2", "attn.qkv": "attn.c_attn",
              "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}


def _gpt_name(name: str) -> tuple[str, bool]:
    if name in ("wte", "wpe"):
        return f"transformer.{name}.weight", False
    if name == "head.weight":
        return "lm_head.weight", True
    module, kind = name.rsplit(".", 1)
    kind = "weight" if kind == "scale" else kind  # LayerNorm's scale is torch's weight
    if module == "ln_f":
        return f"transformer.ln_f.{kind}", False
    _, i, part = module.split(".", 2)
    return f"transformer.h.{i}.{_GPT_PARTS[part]}.{kind}", False  # Conv1D: (in, out)


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's files: the shards its index names, else every *.safetensors."""
    if not folder.is_dir():
        raise UserError(f"weights: {folder} is not a folder")
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({str(v) for v in weight_map.values()})
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{index} is not a safetensors index (a JSON object with a "
                            "weight_map of tensor name -> shard file)") from None
        for name in files:
            if Path(name).name != name or not (folder / name).is_file():
                raise UserError(f"{index} names shard {name!r}, which is not a file in "
                                f"{folder}")
        return [folder / name for name in files]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise UserError(f"weights: {folder} holds no *.safetensors file (sextant reads "
                        "safetensors only, never pickled .bin checkpoints)")
    return found


def _headers(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Tensor name -> (file, shape, dtype), from the files' headers alone."""
    from safetensors import safe_open

    found: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for key in f.keys():
                    if key in found:
                        raise UserError(f"weights: tensor {key} is in both {found[key][0]} "
                                        f"and {path}")
                    part = f.get_slice(key)
                    found[key] = (path, tuple(part.get_shape()), part.get_dtype())
        except UserError:
            raise
        except Exception as exc:  # safetensors raises its own error types for a bad file
            raise UserError(f"weights: {path} is not a safetensors file: {exc}") from None
    return found


def _read(path: Path, name: str, dtype: str) -> np.ndarray:
    """One tensor as float32."""
    if dtype in _NUMPY_DTYPES:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            return np.asarray(f.get_tensor(name), dtype=np.float32)
    return _read_bf16(path, name)  # numpy has no bfloat16: its bits are a float32's upper half


def _read_bf16(path: Path, name: str) -> np.ndarray:
    # The safetensors layout: an 8-byte little-endian header length, the JSON header
    # (name -> dtype, shape, data_offsets into the bytes after it), then the data.
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        entry: dict[str, Any] = json.loads(f.read(length))[name]
        start, end = entry["data_offsets"]
        f.seek(8 + length + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


_Entry = tuple[str, Path, str, bool]
"""Where one canonical parameter comes from: (tensor name, file, dtype, transposed)."""


def check_weights(model: ModelSpec, folder: Path) -> tuple[dict[str, _Entry], _Entry | None]:
    """Match the checkpoint in `folder` to `model` from the files' headers alone (no tensor
    is read): (canonical name -> where its tensor is, a tied model's stored copy of the head
    or None). A missing, unexpected or misshapen tensor is a one-line UserError naming it."""
    names = hf_names(model)
    shapes = param_shapes(model)
    headers = _headers(weight_files(folder))
    if isinstance(model, GPTSpec):  # GPT2Model's own checkpoints have no "transformer." prefix
        headers = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
                   for k, v in headers.items()}
    wanted = {hf for hf, _ in names.values()}
    extra = [k for k in headers if k not in wanted and not _BUFFERS.search(k)]
    if "lm_head.weight" in extra and getattr(model, "tie_embeddings", False):
        extra.remove("lm_head.weight")  # compared with the embedding by load_weights
    if extra:
        raise UserError(f"weights: tensor {extra[0]} in {headers[extra[0]][0]} is not a "
                        f"parameter of this workload's {model.family} model "
                        f"({len(extra)} such tensor{'s' if len(extra) > 1 else ''}); check "
                        "that the workload's model matches the checkpoint's config.json")
    out: dict[str, _Entry] = {}
    for canonical, (hf, transpose) in names.items():
        if hf not in headers:
            raise UserError(f"weights: tensor {hf} (sextant's {canonical}) is missing from "
                            f"the checkpoint in {folder}")
        path, shape, dtype = headers[hf]
        expected = shapes[canonical][::-1] if transpose else shapes[canonical]
        if canonical == "wpe" and len(shape) == 2 and shape[1] == expected[1] \
                and shape[0] >= expected[0]:
            expected = shape  # more positions than the workload's seq_len: the first rows
        if shape != expected:
            raise UserError(f"weights: tensor {hf} in {path} has shape {list(shape)}; this "
                            f"workload's model needs {list(expected)} (sextant's {canonical})")
        if dtype not in _NUMPY_DTYPES and dtype != "BF16":
            raise UserError(f"weights: tensor {hf} in {path} is {dtype}; sextant reads float "
                            "tensors (F32, F16, BF16, F64)")
        out[canonical] = (hf, path, dtype, transpose)
    tied_copy = None
    if "lm_head.weight" in headers and "head.weight" not in out:
        path, _, dtype = headers["lm_head.weight"]
        tied_copy = ("lm_head.weight", path, dtype, False)
    return out, tied_copy


def load_weights(model: ModelSpec, folder: Path) -> dict[str, np.ndarray]:
    """The canonical float32 parameters of `model` from the checkpoint in `folder` (checked
    first by check_weights)."""
    entries, tied_copy = check_weights(model, folder)
    out: dict[str, np.ndarray] = {}
    for canonical, (hf, path, dtype, transpose) in entries.items():
        value = _read(path, hf, dtype)
        if canonical == "wpe":
            value = value[: param_shapes(model)["wpe"][0]]
        out[canonical] = np.ascontiguousarray(value.T if transpose else value)
    if tied_copy is not None:
        hf, path, dtype, _ = tied_copy
        head = _read(path, hf, dtype)
        if head.shape != out["wte"].shape or not np.array_equal(head, out["wte"]):
            raise UserError(f"weights: tensor lm_head.weight in {path} differs from the "
                            "embedding, but the model ties them (tie_embeddings = true)")
    return out


def merge_adapters(params: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """The fine-tuned model as plain base parameters: each adapted W becomes
    W + A B * scale (scale = alpha / rank), the adapters dropped; what exports and serves
    like the base model (a model without adapters comes back unchanged)."""
    out = {k: v for k, v in params.items() if not is_adapter(k)}
    for name in params:
        if name.endswith(".lora_a"):
            prefix = name[: -len("lora_a")]
            a = params[name].astype(np.float64)
            b = params[prefix + "lora_b"].astype(np.float64)
            out[prefix + "weight"] = (out[prefix + "weight"] + (a @ b) * scale
                                      ).astype(np.float32)
    return out
