"""The framework-neutral workload: model, data, optimizer, seed, steps, global batch.

A workload is a TOML file. It is validated completely before anything runs: unknown keys are
rejected, every value is checked against what is allowed, and the error says what was
received. The workload's content hash (of its canonical JSON form, not of the file's bytes)
identifies it in the results store, so comments and key order do not split results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError
from sextant.core.tomlfile import read_toml

MODEL_FAMILIES = ("mlp", "gpt", "llama")
DATASETS = {"mlp": ("digits",), "gpt": ("python-reference",), "llama": ("python-reference",)}
DATASET_FACTS: dict[str, dict[str, int]] = {
    "digits": {"samples": 1797, "input_dim": 64, "num_classes": 10},
    "python-reference": {"tokens": 466_273},
}
"""What the bundled datasets hold (tests/test_workload.py checks it against the files), so a
workload that does not fit its data is refused here, not inside a worker."""
# Upper bounds: far above anything sextant measures, low enough that no value overflows a
# framework's integer types or fails late inside a worker.
MAX_STEPS = 10_000_000
MAX_GLOBAL_BATCH = 1 << 20
MAX_DESCRIPTION = 4000
"""Characters of a workload's free-text description (it is stored with every run)."""
MAX_WIDTH = 1 << 16
"""Any layer width, d_model, d_ff or seq_len."""
MAX_LAYERS = 1024
MAX_VOCAB = 1 << 22
"""Any vocabulary (the largest published ones hold about 256K tokens)."""
DATA_SUFFIXES = (".parquet", ".jsonl", ".txt")
"""The kinds of file `data.files` may name."""
DATA_FORMATS = ("text", "instruction")
"""What `data.files` hold: running text, or prompt/response pairs (JSON Lines)."""
IGNORE_TARGET = -100
"""The target id of a position the loss leaves out (a prompt or padding token of instruction
data): every backend's loss is the mean over the targets that are not IGNORE_TARGET, the
value torch's and Paddle's cross_entropy ignore by default."""


@dataclass(kw_only=True, slots=True, frozen=True)
class MLPSpec:
    """A multi-layer perceptron classifier (ReLU between layers, softmax cross-entropy)."""

    family: str = "mlp"
    input_dim: int = 64
    """Features per sample; must equal the dataset's (64 for digits)."""
    hidden: tuple[int, ...] = (128, 128)
    """Width of each hidden layer."""
    num_classes: int = 10
    """Output classes; must equal the dataset's (10 for digits)."""

    def __post_init__(self) -> None:
        _positive_int("model.input_dim", self.input_dim, MAX_WIDTH)
        _positive_int("model.num_classes", self.num_classes, MAX_WIDTH)
        if not self.hidden:
            raise UserError("model.hidden must list at least one layer width. Received: []")
        if len(self.hidden) > MAX_LAYERS:
            raise UserError(f"model.hidden must list at most {MAX_LAYERS} layers. "
                            f"Received: {len(self.hidden)}")
        for width in self.hidden:
            _positive_int("model.hidden[]", width, MAX_WIDTH)


@dataclass(kw_only=True, slots=True, frozen=True)
class GPTSpec:
    """A decoder-only transformer: pre-LayerNorm, GELU (tanh form), learned positions,
    causal attention, an output head of its own or tied to the embedding."""

    family: str = "gpt"
    vocab_size: int = 256
    """Token ids the model embeds; at least the data's vocabulary (256 for the byte-level
    bundled corpus, the tokenizer's for your own files)."""
    seq_len: int = 64
    """Tokens per sequence (the context length)."""
    d_model: int = 64
    """Residual stream width."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    d_ff: int = 256
    """Hidden width of each block's MLP."""
    tie_embeddings: bool = False
    """The output head reuses the token embedding (transposed) instead of its own matrix, as
    GPT-2 does."""

    def __post_init__(self) -> None:
        _check_decoder(self, ("seq_len", "d_model", "n_heads", "d_ff"))
        _check_bool("model.tie_embeddings", self.tie_embeddings)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _check_decoder(spec: GPTSpec | LlamaSpec, widths: tuple[str, ...]) -> None:
    """What every decoder shares: positive widths, whole heads. (Whether the vocabulary
    covers the data's is the workload's check: it depends on the data.)"""
    for name in widths:
        _positive_int(f"model.{name}", getattr(spec, name), MAX_WIDTH)
    _positive_int("model.vocab_size", spec.vocab_size, MAX_VOCAB)
    _positive_int("model.n_layers", spec.n_layers, MAX_LAYERS)
    if spec.d_model % spec.n_heads:
        raise UserError(
            "model.n_heads must divide model.d_model. "
            f"Received: d_model={spec.d_model}, n_heads={spec.n_heads}"
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class LlamaSpec:
    """A Llama-shaped decoder: pre-RMSNorm, rotary position embeddings (rotate-half form),
    grouped-query causal attention, SwiGLU MLP, biases on the query, key and value projections
    or none (Qwen2 has them); embeddings tied or not."""

    family: str = "llama"
    vocab_size: int = 256
    """Token ids the model embeds; at least the data's vocabulary."""
    seq_len: int = 64
    """Tokens per sequence (the context length)."""
    d_model: int = 64
    """Residual stream width."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Query heads; must divide d_model, and d_model / n_heads must be even (rotary pairs)."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide n_heads. n_heads: multi-head
    attention; 1: multi-query attention."""
    d_ff: int = 176
    """Hidden width of each block's SwiGLU MLP (three matrices: gate, up, down)."""
    tie_embeddings: bool = False
    """The output head reuses the token embedding (transposed) instead of its own matrix."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies: pair i of a head turns at rope_theta^(-2i/head_dim)."""
    norm_eps: float = 1e-5
    """RMSNorm's epsilon, inside the root."""
    qkv_bias: bool = False
    """The query, key and value projections add a bias (Qwen2); the output projection and
    the MLP have none either way."""

    def __post_init__(self) -> None:
        _check_decoder(self, ("seq_len", "d_model", "n_heads", "n_kv_heads", "d_ff"))
        if (self.d_model // self.n_heads) % 2:
            raise UserError(
                "model.d_model / model.n_heads (the head width) must be even: rotary "
                f"embeddings turn pairs of dimensions. Received: d_model={self.d_model}, "
                f"n_heads={self.n_heads} (head width {self.d_model // self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise UserError(
                "model.n_kv_heads must divide model.n_heads (each key/value head serves a "
                f"group of query heads). Received: n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}"
            )
        _check_bool("model.tie_embeddings", self.tie_embeddings)
        _check_bool("model.qkv_bias", self.qkv_bias)
        _positive_float("model.rope_theta", self.rope_theta)
        _positive_float("model.norm_eps", self.norm_eps)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def model_features(model: MLPSpec | GPTSpec | LlamaSpec, lora: bool = False,
                   masked: bool = False, bf16_base: bool = False) -> tuple[str, ...]:
    """The optional parts a model uses, which a backend's model code must have (its
    Capabilities.model_features): 'qkv_bias' (Qwen2's), 'tied_gpt_head' (GPT-2's), 'lora'
    (adapters beside frozen projections, finetune.method = 'lora'; 'lora_gpt' on the gpt
    family), 'masked_loss' (a loss
    that leaves IGNORE_TARGET targets out: instruction data), 'bf16_base' (LoRA's frozen
    projections stored in bfloat16)."""
    out = (["lora_gpt" if isinstance(model, GPTSpec) else "lora"] if lora else [])
    if masked:
        out.append("masked_loss")
    if bf16_base:
        out.append("bf16_base")
    if isinstance(model, LlamaSpec) and model.qkv_bias:
        out.append("qkv_bias")
    if isinstance(model, GPTSpec) and model.tie_embeddings:
        out.append("tied_gpt_head")
    return tuple(out)


ModelSpec = MLPSpec | GPTSpec | LlamaSpec
TransformerSpec = GPTSpec | LlamaSpec
"""The families that read token sequences."""


@dataclass(kw_only=True, slots=True, frozen=True)
class DataSpec:
    """Where batches come from: a bundled dataset, or your own text files. Global batch i is
    a pure function of (data, seed, i)."""

    dataset: str = ""
    """'digits' (8x8 handwritten digits, 1,797 samples) for mlp; 'python-reference' (the
    Python language reference, byte-level) for gpt and llama. Empty when `files` is set."""
    files: tuple[str, ...] = ()
    """Your own text (gpt and llama): glob patterns of *.parquet, *.jsonl or *.txt files,
    relative to the workload file. Tokenized once into a cached memory-mapped token file
    (sextant.data.files)."""
    text_field: str = "text"
    """The column (Parquet) or key (JSON Lines) that holds each document's text."""
    tokenizer: str = "bytes"
    """'bytes' (byte-level, vocabulary 256) or the path of a `tokenizers` tokenizer.json."""
    digest: str = ""
    """The content hash of the files and the tokenizer: what names the token file. Filled in
    when the workload is resolved, so a changed file makes a different workload."""
    format: str = "text"
    """'text': documents concatenated, the loss on every token. 'instruction': each JSON
    Lines record holds a prompt and a response; a sequence is the prompt's tokens then the
    response's, and the loss is the mean over the response's tokens only (sextant.data.
    instruction)."""
    prompt_field: str = "prompt"
    """The key (instruction data) that holds each record's prompt."""
    response_field: str = "response"
    """The key (instruction data) that holds each record's response."""
    packing: bool = False
    """Instruction data: false puts one record per row (cut to the context length, padded
    with ignored targets); true concatenates the records and cuts the stream into full rows,
    so no position is padding (attention then crosses a record's boundary within a row, as
    TRL's packing does)."""

    def __post_init__(self) -> None:
        if not isinstance(self.files, tuple) or not all(
                isinstance(f, str) and f for f in self.files):
            raise UserError("data.files must be a list of file patterns. "
                            f"Received: {_short(self.files)}")
        if bool(self.dataset) == bool(self.files):
            raise UserError("[data] takes either dataset (a bundled one) or files (your own). "
                            f"Received: dataset={self.dataset!r}, files={list(self.files)}")
        for pattern in self.files:
            if not pattern.endswith(DATA_SUFFIXES):
                raise UserError(f"data.files patterns must end in one of {list(DATA_SUFFIXES)}. "
                                f"Received: {pattern!r}")
        if not (isinstance(self.text_field, str) and self.text_field):
            raise UserError("data.text_field must be a non-empty string. "
                            f"Received: {_short(self.text_field)}")
        if not (isinstance(self.tokenizer, str) and self.tokenizer):
            raise UserError("data.tokenizer must be 'bytes' or the path of a tokenizer.json. "
                            f"Received: {_short(self.tokenizer)}")
        if not (isinstance(self.digest, str) and all(c in "0123456789abcdef"
                                                      for c in self.digest)):
            raise UserError(f"data.digest must be a hex digest. Received: {_short(self.digest)}")
        self._check_instruction()

    def _check_instruction(self) -> None:
        if self.format not in DATA_FORMATS:
            raise UserError(f"data.format must be one of {list(DATA_FORMATS)}. "
                            f"Received: {_short(self.format)}")
        _check_bool("data.packing", self.packing)
        for key in ("prompt_field", "response_field"):
            value = getattr(self, key)
            if not (isinstance(value, str) and value):
                raise UserError(f"data.{key} must be a non-empty string. "
                                f"Received: {_short(value)}")
        if self.format == "text":
            changed = [k for k, v in (("prompt_field", "prompt"), ("response_field", "response"),
                                      ("packing", False)) if getattr(self, k) != v]
            if changed:
                raise UserError(f"data.{changed[0]} is for data.format = 'instruction'. "
                                f"Received: format={self.format!r}")
            return
        if self.prompt_field == self.response_field:
            raise UserError(f"data.prompt_field and data.response_field must differ. "
                            f"Received: both {self.prompt_field!r}")
        odd = [p for p in self.files if not p.endswith(".jsonl")]
        if not self.files or odd:
            raise UserError("data.format = 'instruction' reads JSON Lines files "
                            "(data.files = [\"*.jsonl\"]). Received: "
                            + (repr(odd[0]) if odd else "no files"))

    @property
    def instruction(self) -> bool:
        return self.format == "instruction"


@dataclass(kw_only=True, slots=True, frozen=True)
class OptimizerSpec:
    """AdamW with decoupled weight decay on matrices (ndim >= 2), linear warm-up from 0 to
    `lr` over `warmup_steps`, then cosine decay to `lr * min_lr_ratio` at the last step."""

    name: str = "adamw"
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.name != "adamw":
            raise UserError(f"optimizer.name must be 'adamw'. Received: {self.name!r}")
        _positive_float("optimizer.lr", self.lr)
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise UserError(f"optimizer.{name} must be in [0, 1). Received: {value!r}")
        _positive_float("optimizer.eps", self.eps)
        if not (_finite_number(self.weight_decay) and self.weight_decay >= 0):
            raise UserError(
                f"optimizer.weight_decay must be a number >= 0. Received: {self.weight_decay!r}"
            )
        if not (isinstance(self.warmup_steps, int) and 0 <= self.warmup_steps <= MAX_STEPS):
            raise UserError(
                f"optimizer.warmup_steps must be an integer in [0, {MAX_STEPS}]. "
                f"Received: {self.warmup_steps!r}"
            )
        if not (isinstance(self.min_lr_ratio, (int, float)) and 0 <= self.min_lr_ratio <= 1):
            raise UserError(
                f"optimizer.min_lr_ratio must be in [0, 1]. Received: {self.min_lr_ratio!r}"
            )


@dataclass(kw_only=True, slots=True, frozen=True)
class MeasureSpec:
    """How a run is timed."""

    warmup_steps: int = 3
    """Steps excluded from the steady-state statistics (the first includes compilation)."""
    nosync_steps: int = 10
    """Extra steps, after training, with gradient synchronisation disabled: the baseline of
    the exposed-communication figure for data-parallel runs."""
    log_every: int = 10
    """Live progress interval in steps (losses are read back only then: no sync per step)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 1):
            raise UserError(
                f"measure.warmup_steps must be an integer >= 1. Received: {self.warmup_steps!r}"
            )
        if not (isinstance(self.nosync_steps, int) and 0 <= self.nosync_steps <= MAX_STEPS):
            raise UserError(
                f"measure.nosync_steps must be an integer in [0, {MAX_STEPS}]. "
                f"Received: {self.nosync_steps!r}"
            )
        _positive_int("measure.log_every", self.log_every, MAX_STEPS)


FINETUNE_METHODS = ("full", "lora")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The llama family's projections a LoRA adapter may sit on (attention q, k, v, o; SwiGLU's
gate, up, down)."""
GPT_LORA_TARGETS = ("qkv", "o", "up", "down")
"""The gpt family's: the fused attention input (GPT-2's c_attn, PEFT's default for GPT-2),
its output (attn.c_proj), the MLP's first and second matrices (mlp.c_fc, mlp.c_proj)."""
FAMILY_LORA_TARGETS = {"llama": LORA_TARGETS, "gpt": GPT_LORA_TARGETS}
BASE_DTYPES = ("fp32", "bf16")


@dataclass(kw_only=True, slots=True, frozen=True)
class FinetuneSpec:
    """What trains. 'full': every parameter. 'lora': only low-rank adapters beside the
    `targets` projections of every block, y = x W + (x A) B * alpha / rank, the base frozen;
    A drawn from the canonical generator, B = 0 (so step 0 is the base model), as PEFT's
    LoRA defines them (sextant.workloads.init.adapter_shapes)."""

    method: str = "full"
    """'full' or 'lora'."""
    rank: int = 8
    """LoRA's rank r (A is (in, r), B is (r, out))."""
    alpha: float = 16.0
    """LoRA's alpha: the adapter's output is scaled by alpha / rank (PEFT's meaning)."""
    targets: tuple[str, ...] = ("q", "v")
    """Projections that get an adapter: any of q, k, v, o, gate, up, down (PEFT's default
    for Llama is q and v)."""
    base_dtype: str = "fp32"
    """The frozen base's storage dtype under LoRA: 'fp32', or 'bf16' (its values rounded to
    bfloat16 once, half the memory; every matmul still in fp32, the adapters and their
    optimizer state in fp32)."""

    def __post_init__(self) -> None:
        if self.method not in FINETUNE_METHODS:
            raise UserError(f"finetune.method must be one of {list(FINETUNE_METHODS)}. "
                            f"Received: {_short(self.method)}")
        _positive_int("finetune.rank", self.rank, MAX_WIDTH)
        _positive_float("finetune.alpha", self.alpha)
        known = (*LORA_TARGETS, *GPT_LORA_TARGETS)
        if not (isinstance(self.targets, tuple) and self.targets
                and all(t in known for t in self.targets)
                and len(set(self.targets)) == len(self.targets)):
            raise UserError(f"finetune.targets must list distinct projections among "
                            f"{list(LORA_TARGETS)} (llama) or {list(GPT_LORA_TARGETS)} (gpt). "
                            f"Received: {_short(list(self.targets))}")
        if self.base_dtype not in BASE_DTYPES:
            raise UserError(f"finetune.base_dtype must be one of {list(BASE_DTYPES)}. "
                            f"Received: {_short(self.base_dtype)}")
        if self.base_dtype != "fp32" and not self.lora:
            raise UserError("finetune.base_dtype = 'bf16' is for method = 'lora' (full "
                            "fine-tuning trains the base, in the run's precision)")

    @property
    def lora(self) -> bool:
        return self.method == "lora"

    @property
    def scale(self) -> float:
        """alpha / rank: what the adapter's output is multiplied by."""
        return self.alpha / self.rank


@dataclass(kw_only=True, slots=True, frozen=True)
class Workload:
    """One framework-neutral training job."""

    name: str
    description: str = ""
    seed: int = 0
    steps: int = 50
    """Optimizer steps."""
    global_batch: int = 16
    """Samples (mlp) or sequences (gpt) per optimizer step, summed over all workers."""
    model: ModelSpec
    data: DataSpec
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    finetune: FinetuneSpec = field(default_factory=FinetuneSpec)
    weights: str = ""
    """A folder of pretrained weights (`*.safetensors` as Hugging Face saves them, sharded or
    not) that replace the seeded initial parameters (sextant.pretrained.weights); empty: seeded ones.
    Relative to the workload file, stored absolute."""
    weights_digest: str = ""
    """The content hash of the pretrained weights' files (sextant.pretrained.weights.weights_digest),
    filled in when the workload is resolved. Where it is set, it, not the folder's path,
    identifies the weights in the workload's hashes."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise UserError(f"name must be a non-empty string. Received: {self.name!r}")
        if not isinstance(self.weights, str):
            raise UserError(f"weights must be the path of a folder of *.safetensors files. "
                            f"Received: {_short(self.weights)}")
        if not (isinstance(self.weights_digest, str)
                and all(c in "0123456789abcdef" for c in self.weights_digest)):
            raise UserError(f"weights_digest must be a hex digest. "
                            f"Received: {_short(self.weights_digest)}")
        if self.weights and isinstance(self.model, MLPSpec):
            raise UserError("weights (a pretrained checkpoint) are for the gpt and llama "
                            "families, not mlp")
        if self.finetune.lora:
            self._check_lora_targets()
        if not isinstance(self.description, str) or len(self.description) > MAX_DESCRIPTION:
            raise UserError(f"description must be a string of at most {MAX_DESCRIPTION} "
                            f"characters. Received: {str(self.description)[:40]!r}... "
                            f"({len(str(self.description))} characters)")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            raise UserError(f"seed must be an integer in [0, 2**32). Received: {self.seed!r}")
        _positive_int("steps", self.steps, MAX_STEPS)
        _positive_int("global_batch", self.global_batch, MAX_GLOBAL_BATCH)
        if self.steps <= self.measure.warmup_steps:
            raise UserError(
                "steps must exceed measure.warmup_steps so that some steps are timed. "
                f"Received: steps={self.steps}, measure.warmup_steps={self.measure.warmup_steps}"
            )
        allowed = DATASETS[self.model.family]
        if self.data.files and isinstance(self.model, MLPSpec):
            raise UserError("data.files (text) is for the gpt and llama families; an mlp "
                            f"model reads {list(allowed)}")
        if not self.data.files and self.data.dataset not in allowed:
            raise UserError(
                f"data.dataset for a {self.model.family} model must be one of {list(allowed)}. "
                f"Received: {self.data.dataset!r}"
            )
        _fits_data(self)

    def _check_lora_targets(self) -> None:
        allowed = FAMILY_LORA_TARGETS.get(self.model.family)
        if allowed is None:
            raise UserError(f"finetune.method = 'lora' adapts the llama and gpt families' "
                            f"projections; this is a {self.model.family} model")
        odd = [t for t in self.finetune.targets if t not in allowed]
        if odd:
            raise UserError(f"finetune.targets for a {self.model.family} model must list "
                            f"distinct projections among {list(allowed)}. Received: "
                            f"{_short(list(self.finetune.targets))}")

    @property
    def tokens_per_sample(self) -> int:
        return 1 if isinstance(self.model, MLPSpec) else self.model.seq_len

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if isinstance(self.model, MLPSpec):
            out["model"]["hidden"] = list(self.model.hidden)
        out["data"]["files"] = list(self.data.files)
        if not self.data.files:  # a bundled dataset is named by its name alone
            out["data"] = {"dataset": self.data.dataset}
        elif not self.data.instruction:  # text data's hash stays what it was stored with
            for key in ("format", "prompt_field", "response_field", "packing"):
                del out["data"][key]
        # Fields added after results were stored appear only when set, so the content hash
        # of every workload that does not use them stays what it was.
        for key in _SET_ONLY.get(self.model.family, ()):
            if out["model"][key] is False:
                del out["model"][key]
        if not self.weights:
            del out["weights"]
        if not self.weights_digest:
            del out["weights_digest"]
        if self.finetune == FinetuneSpec():
            del out["finetune"]
        else:
            out["finetune"]["targets"] = list(self.finetune.targets)
        return out

    def content_hash(self) -> str:
        """Hash of everything that changes the numbers (the description does not)."""
        return _hash(self.to_dict(), drop=("description",))

    def state_hash(self) -> str:
        """Hash of what shapes the training state a checkpoint holds: model, data, optimizer
        and seed. Not the name, the step count (a run may be resumed to train longer) or the
        measurement settings."""
        return _hash(self.to_dict(), drop=("description", "name", "steps", "measure"))

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)


_SET_ONLY = {"gpt": ("tie_embeddings",), "llama": ("qkv_bias",)}
"""Model switches added after results were stored: written only when on (see to_dict)."""


def _hash(payload: dict[str, Any], drop: tuple[str, ...]) -> str:
    if payload.get("weights_digest"):  # the weights' content names them, not their folder
        drop = (*drop, "weights")
    kept = {k: v for k, v in payload.items() if k not in drop}
    blob = json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --- loading ---------------------------------------------------------------------------


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload TOML file; every problem is a one-line UserError."""
    path = Path(path)
    raw = read_toml(path, "workload")
    try:
        return workload_from_dict(raw, base=path.resolve().parent)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None


def workload_from_dict(raw: dict[str, Any], base: Path | None = None) -> Workload:
    """Validate a parsed workload. Relative paths in [data] are taken from `base` (the
    workload file's folder; default: the current one) and stored absolute, so the workload
    means the same thing in every worker."""
    raw = dict(raw)
    _reject_unknown("", raw, _field_names(Workload))
    for table in ("model", "data"):
        if table not in raw:
            raise UserError(f"missing required table [{table}]")
    model_raw = _table("model", raw.pop("model"))
    family = model_raw.get("family")
    if family not in MODEL_FAMILIES:
        raise UserError(
            f"model.family must be one of {list(MODEL_FAMILIES)}. Received: {family!r}"
        )
    model_cls = {"mlp": MLPSpec, "gpt": GPTSpec, "llama": LlamaSpec}[family]
    _reject_unknown("model.", model_raw, _field_names(model_cls))
    if "hidden" in model_raw:
        hidden = model_raw["hidden"]
        if not isinstance(hidden, list):
            raise UserError(f"model.hidden must be a list of integers. Received: {hidden!r}")
        model_raw["hidden"] = tuple(hidden)
    data_raw = _table("data", raw.pop("data"))
    _reject_unknown("data.", data_raw, _field_names(DataSpec))
    if "dataset" not in data_raw and "files" not in data_raw:
        raise UserError(f"data.dataset is required; one of {DATASETS[family]}"
                        + ("" if family == "mlp" else ", or data.files (your own text)"))
    if "files" in data_raw:
        data_raw["files"] = _file_patterns(data_raw["files"], base)
    weights = raw.get("weights")
    if isinstance(weights, str) and weights and base is not None \
            and not Path(weights).is_absolute():
        raw["weights"] = str(base / weights)
    tokenizer = data_raw.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer not in ("", "bytes") and base is not None \
            and not Path(tokenizer).is_absolute():
        data_raw["tokenizer"] = str(base / tokenizer)
    parts: dict[str, Any] = {"model": _build(model_cls, model_raw), "data": DataSpec(**data_raw)}
    for table, cls in (("optimizer", OptimizerSpec), ("measure", MeasureSpec),
                       ("finetune", FinetuneSpec)):
        if table in raw:
            sub = _table(table, raw.pop(table))
            _reject_unknown(f"{table}.", sub, _field_names(cls))
            if isinstance(sub.get("targets"), list):
                sub["targets"] = tuple(sub["targets"])
            parts[table] = _build(cls, sub)
    if "name" not in raw:
        raise UserError("missing required key 'name'")
    return _build(Workload, {**raw, **parts})


def _build(cls: type, values: dict[str, Any]) -> Any:
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    for key, value in values.items():
        expected = hints.get(key)
        if expected in ("int",) and (isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"{key} must be an integer. Received: {value!r}")
        if expected in ("float",) and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            raise UserError(f"{key} must be a number. Received: {value!r}")
        if expected in ("str",) and not isinstance(value, str):
            raise UserError(f"{key} must be a string. Received: {value!r}")
    return cls(**values)


def _file_patterns(value: Any, base: Path | None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UserError(f"data.files must be a list of file patterns. Received: {_short(value)}")
    where = base if base is not None else Path.cwd()
    return tuple(v if Path(v).is_absolute() else str(where / v) for v in value)


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _table(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"[{name}] must be a table. Received: {value!r}")
    return dict(value)


def _reject_unknown(prefix: str, raw: dict[str, Any], allowed: list[str]) -> None:
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise UserError(
            f"unknown key {prefix}{unknown[0]!s}; allowed keys: {', '.join(sorted(allowed))}"
        )


def _fits_data(w: Workload) -> None:
    """The model's shapes and the batch agree with what the dataset holds (your own files are
    checked when their tokens are made: sextant.data.files)."""
    if w.data.files:
        return
    facts = DATASET_FACTS[w.data.dataset]
    if isinstance(w.model, MLPSpec):
        for key in ("input_dim", "num_classes"):
            if getattr(w.model, key) != facts[key]:
                raise UserError(f"model.{key} must be {facts[key]} for the {w.data.dataset} "
                                f"dataset. Received: {getattr(w.model, key)}")
        if w.global_batch > facts["samples"]:
            raise UserError(f"global_batch must be at most the {facts['samples']} samples of "
                            f"{w.data.dataset}. Received: {w.global_batch}")
    elif w.model.vocab_size < 256:
        raise UserError(f"model.vocab_size must be at least 256 for the byte-level "
                        f"{w.data.dataset} corpus. Received: {w.model.vocab_size}")
    elif w.model.seq_len + 1 >= facts["tokens"]:
        raise UserError(f"model.seq_len must be shorter than the {w.data.dataset} corpus "
                        f"({facts['tokens']} tokens). Received: {w.model.seq_len}")


def _positive_int(name: str, value: Any, most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be an integer >= 1. Received: {_short(value)}")
    if most is not None and value > most:
        raise UserError(f"{name} must be at most {most}. Received: {_short(value)}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false. Received: {_short(value)}")


def _short(value: Any) -> str:
    """repr, cut to 80 characters (a 4,000-digit integer makes a poor error message)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "a huge integer"
    return text if len(text) <= 80 else text[:77] + "..."


def _finite_number(value: Any) -> bool:
    """An int or float that is a finite float (an integer beyond 1.8e308 is not: it cannot
    reach a framework as a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _positive_float(name: str, value: Any) -> None:
    if not _finite_number(value) or value <= 0:
        raise UserError(f"{name} must be a number > 0. Received: {_short(value)}")


BUNDLED_DIR = Path(__file__).parent


def bundled_workloads() -> list[str]:
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.toml"))


HF_PREFIX = "hf:"
"""`--workload hf:path/config.json[,scale=0.01,...]`: a workload made from a Hugging Face
config (sextant.pretrained.hf)."""
