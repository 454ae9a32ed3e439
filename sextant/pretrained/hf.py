"""Workloads from a Hugging Face `config.json` of a decoder-only model.

Llama 1-3, Mistral (its sliding window no shorter than the sequence, where it never bites),
Qwen2 (the llama family with q/k/v biases) and other `LlamaForCausalLM`-shaped configs map
onto sextant's llama family; GPT-2 (its head tied to the embedding) onto its gpt family. Every field of the config is either
mapped, known not to change the model sextant trains (token ids of special tokens, the
initialiser's range, the dtype the weights were saved in, ...), or refused in one line that
names the field and its value: nothing is approximated silently. The one thing dropped is
dropout (sextant trains without it, on every framework); the workload's description says so.

`--scale S` (0 < S <= 1) gives a shape-faithful smaller model: depth and width each shrink by
S^(1/3), so the per-layer parameters (about layers x width^2) shrink by about S, keeping the
grouped-query ratio (query heads per key/value head), the MLP's ratio to the width and the
vocabulary; `--layers` and `--width` set those two directly. The description names the
source config, its size, and what was scaled.

A spec `hf:path/config.json,scale=0.01,seq_len=64` is accepted wherever a workload is. Its
path may be a model's folder instead (`hf:DIR,seq_len=64`): DIR's config.json, and, when DIR
holds `*.safetensors`, its pretrained weights as the starting point (sextant.pretrained.weights); a
pretrained model keeps its shape, so scale, layers and width do not apply to it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError
from sextant.workloads.spec import (
    HF_PREFIX,
    MAX_GLOBAL_BATCH,
    MAX_LAYERS,
    MAX_STEPS,
    MAX_WIDTH,
    Workload,
    workload_from_dict,
)

LLAMA_TYPES = ("llama", "mistral", "qwen2")
GPT_TYPES = ("gpt2",)

# Fields that do not change the model sextant builds or its training step.
_HARMLESS = {
    "architectures", "model_type", "_name_or_path", "transformers_version", "torch_dtype",
    "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    "tokenizer_class", "is_llama_config", "pretraining_tp", "max_position_embeddings",
    "id2label", "label2id", "return_dict", "output_attentions", "output_hidden_states",
    "torchscript", "use_bfloat16", "_attn_implementation_autoset", "sep_token_id",
    "decoder_start_token_id", "task_specific_params", "n_ctx", "reorder_and_upcast_attn",
    "summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
    "summary_use_proj", "problem_type", "finetuning_task", "prefix", "chunk_size_feed_forward",
}
_DROPOUT = {"attention_dropout", "hidden_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
            "dropout"}
_LLAMA_MAPPED = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                 "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias",
                 "rope_scaling", "head_dim", "sliding_window", "rope_interleaved",
                 "rope_parameters", "use_sliding_window", "max_window_layers", "layer_types"}
_GPT_MAPPED = {"vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions",
               "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
               "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention"}
SPEC_KEYS = ("scale", "layers", "width", "seq_len", "global_batch", "steps")
"""What an hf: spec may set after its path (`hf:config.json,scale=0.01,seq_len=64`)."""


MAX_CONFIG_BYTES = 16 << 20
"""A config.json is a few kilobytes; a larger file is not read whole."""


def read_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file (a FIFO, device or socket)"
        raise UserError(f"Hugging Face config {path} is {what}; give a config.json")
    if not path.is_file():
        raise UserError(f"Hugging Face config not found: {path}")
    try:
        with open(path, "rb") as f:  # a regular file: never a FIFO that would hang
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise UserError(f"{path} is over {MAX_CONFIG_BYTES >> 20} MiB: not a config.json")
        config = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not a JSON config.json: not UTF-8 text (byte "
                        f"{exc.start})") from None
    except RecursionError:
        raise UserError(f"{path} is not a JSON config.json: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise UserError(f"{path} is not a JSON config.json: "
                        f"{one_line_text(str(exc).splitlines()[0])[:200]}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} is not a config.json: expected a JSON object")
    return config


def one_line_text(text: str) -> str:
    """`text` with everything unprintable (line breaks, terminal escape sequences, lone
    surrogates, bidirectional overrides) written as a visible escape: what a config's author
    wrote can neither add a line to a written workload nor reach a terminal raw."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _shown(value: Any, limit: int = 200) -> str:
    """A config value as JSON, on one line and cut at `limit` characters."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = f"a {type(value).__name__} nested too deeply"
    return text if len(text) <= limit else text[:limit] + "..."


def _refuse(path: Path, field: str, value: Any, why: str) -> UserError:
    return UserError(f"{path}: {field} = {_shown(value)} is not supported: {why}")


MAX_CONFIG_INT = 2 ** 53
"""The largest integer a config field may hold (far above any model's)."""


def _int(path: Path, config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None and default is not None:
        value = default
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 1 <= value <= MAX_CONFIG_INT):
        raise UserError(f"{path}: {key} must be an integer from 1 to 2**53. Received: "
                        f"{_shown(value)}")
    return value


def _positive(path: Path, where: str, value: Any) -> None:
    try:  # an integer too large for a float is no finite number here either
        number = float(value) if isinstance(value, (int, float)) else math.nan
    except OverflowError:
        number = math.inf
    if isinstance(value, bool) or not (math.isfinite(number) and number > 0):
        raise UserError(f"{path}: {where} must be a finite number > 0. Received: "
                        f"{_shown(value)}")


def check_values(path: Path, config: dict[str, Any]) -> None:
    """Refuse, in one line, a config whose fields have types the mapping cannot read: a
    non-table rope_parameters, a rope_theta or norm epsilon that is not a positive number,
    a head_dim that is not an integer, more key/value heads than heads."""
    rope = config.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise UserError(f"{path}: rope_parameters must be a table (a JSON object). "
                        f"Received: {_shown(rope)}")
    for where, table, key in (("rope_theta", config, "rope_theta"),
                              ("rope_parameters.rope_theta", rope or {}, "rope_theta"),
                              ("rms_norm_eps", config, "rms_norm_eps"),
                              ("layer_norm_epsilon", config, "layer_norm_epsilon")):
        if key in table:
            _positive(path, where, table[key])
    if config.get("head_dim") is not None:
        _int(path, config, "head_dim")
    if config.get("model_type") in LLAMA_TYPES and "num_key_value_heads" in config:
        heads = _int(path, config, "num_attention_heads")
        kv = _int(path, config, "num_key_value_heads", heads)
        if kv > heads or heads % kv:
            raise UserError(f"{path}: num_attention_heads must be a multiple of "
                            f"num_key_value_heads (each key/value head serves a group of "
                            f"query heads). Received: num_attention_heads={heads}, "
                            f"num_key_value_heads={kv}")


def _check_fields(path: Path, config: dict[str, Any], mapped: set[str]) -> list[str]:
    """Refuse any field sextant cannot tell is harmless; return the dropout fields set."""
    dropped = []
    for key, value in sorted(config.items()):
        if key in mapped or key in _HARMLESS:
            continue
        if key in _DROPOUT:
            if value:
                dropped.append(f"{key}={value}")
            continue
        if key in ("num_local_experts", "num_experts", "n_routed_experts",
                   "num_experts_per_tok", "moe_intermediate_size"):
            raise _refuse(path, key, value, "mixture-of-experts layers are not in sextant's "
                          "llama and gpt families")
        raise _refuse(path, key, value, "sextant cannot tell whether this field changes the "
                      "model, so it does not guess (remove it if it does not)")
    return dropped


def _llama(path: Path, config: dict[str, Any]
           ) -> tuple[dict[str, Any], list[str], int, int | None]:
    dropped = _check_fields(path, config, _LLAMA_MAPPED)
    if config.get("hidden_act", "silu") != "silu":
        raise _refuse(path, "hidden_act", config["hidden_act"],
                      "sextant's llama family uses SwiGLU (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise _refuse(path, key, config[key], "sextant's llama family has biases on the "
                          "query, key and value projections only (Qwen2's), not on the "
                          "output projection or the MLP")
    window = _sliding_window(path, config)
    if config.get("rope_scaling"):
        raise _refuse(path, "rope_scaling", config["rope_scaling"],
                      "sextant's llama family has plain rotary positions (no scaling)")
    rope = config.get("rope_parameters") or {}
    if rope and rope.get("rope_type", "default") != "default":
        raise _refuse(path, "rope_parameters.rope_type", rope.get("rope_type"),
                      "sextant's llama family has plain rotary positions (no scaling)")
    if config.get("rope_interleaved"):
        raise _refuse(path, "rope_interleaved", True, "sextant turns rotate-half pairs "
                      "(x[i], x[i + head_dim/2]), not interleaved ones")
    d = _int(path, config, "hidden_size")
    heads = _int(path, config, "num_attention_heads")
    if "head_dim" in config and config["head_dim"] is not None \
            and config["head_dim"] * heads != d:
        raise _refuse(path, "head_dim", config["head_dim"], f"sextant's heads split the "
                      f"width: head_dim must be hidden_size / num_attention_heads = {d / heads:g}")
    rope_theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    model = {
        "family": "llama",
        "vocab_size": _int(path, config, "vocab_size"),
        "d_model": d,
        "n_layers": _int(path, config, "num_hidden_layers"),
        "n_heads": heads,
        "n_kv_heads": _int(path, config, "num_key_value_heads", heads),
        "d_ff": _int(path, config, "intermediate_size"),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "rope_theta": float(rope_theta),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
    }
    if config.get("model_type") == "qwen2":  # Qwen2's q/k/v projections always have biases
        model["qkv_bias"] = True
    return model, dropped, _int(path, config, "max_position_embeddings", 2048), window


def _sliding_window(path: Path, config: dict[str, Any]) -> int | None:
    """The window a sequence must fit in for sextant's full causal attention to be the
    model's own (None: no window). Qwen2 reads sliding_window only with use_sliding_window."""
    layer_types = config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise _refuse(path, "layer_types", layer_types, "sextant's attention is full causal "
                      "attention in every layer")
    if config.get("model_type") == "qwen2" and not config.get("use_sliding_window"):
        return None
    if config.get("use_sliding_window"):
        raise _refuse(path, "use_sliding_window", True,
                      "sextant's attention is full causal attention")
    window = config.get("sliding_window")
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise _refuse(path, "sliding_window", window, "expected null or a positive integer")
    return window


def _gpt(path: Path, config: dict[str, Any]
         ) -> tuple[dict[str, Any], list[str], int, int | None]:
    dropped = _check_fields(path, config, _GPT_MAPPED)
    if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise _refuse(path, "activation_function", config["activation_function"],
                      "sextant's gpt family uses GELU in its tanh form (gelu_new)")
    if config.get("layer_norm_epsilon", 1e-5) != 1e-5:
        raise _refuse(path, "layer_norm_epsilon", config["layer_norm_epsilon"],
                      "sextant's gpt family's LayerNorm epsilon is 1e-05")
    if not config.get("scale_attn_weights", True):
        raise _refuse(path, "scale_attn_weights", False,
                      "sextant scales attention scores by 1/sqrt(head_dim)")
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if config.get(key):
            raise _refuse(path, key, config[key], "not in sextant's gpt family")
    d = _int(path, config, "n_embd")
    model = {
        "family": "gpt",
        "vocab_size": _int(path, config, "vocab_size"),
        "d_model": d,
        "n_layers": _int(path, config, "n_layer"),
        "n_heads": _int(path, config, "n_head"),
        "d_ff": _int(path, config, "n_inner", 4 * d),
        # GPT-2 ties its head to the embedding unless the config says otherwise.
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
    }
    return model, dropped, _int(path, config, "n_positions", 1024), None


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, multiple * round(value / multiple))


def scaled(model: dict[str, Any], *, scale: float | None, layers: int | None,
           width: int | None) -> dict[str, Any]:
    """The model shrunk in depth and width, shape-faithfully (see the module docstring)."""
    if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale <= 1):
        raise UserError(f"--scale must be a number in (0, 1]. Received: {scale!r}")
    for name, value, most in (("--layers", layers, MAX_LAYERS), ("--width", width, MAX_WIDTH)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= most):
            raise UserError(f"{name} must be an integer in [1, {most}]. Received: {value!r}")
    factor = scale ** (1 / 3) if scale is not None else 1.0
    out = dict(model)
    out["n_layers"] = layers if layers is not None else max(1, round(model["n_layers"] * factor))
    d, heads = model["d_model"], model["n_heads"]
    target = width if width is not None else model["d_model"] * factor
    if width is None and scale is None:
        return out
    group = heads // model.get("n_kv_heads", heads)  # query heads per key/value head
    new_heads = min(heads, _round_to(heads * target / d, group))
    pair = 2 if model["family"] == "llama" else 1  # rotary turns pairs of dimensions
    if width is not None:
        if width % new_heads or (width // new_heads) % pair:
            unit = new_heads * pair
            raise UserError(
                f"--width {width} does not split into {new_heads} heads"
                f"{' of even width' if pair == 2 else ''} (the config's {heads} heads scaled, "
                f"in groups of {group}): use a multiple of {unit}, e.g. "
                f"{max(unit, unit * round(width / unit))}")
        new_width = width
    else:
        new_width = new_heads * _round_to(target / new_heads, pair)
    out["d_model"], out["n_heads"] = new_width, new_heads
    if "n_kv_heads" in model:
        out["n_kv_heads"] = new_heads // group
    out["d_ff"] = max(1, round(model["d_ff"] * new_width / d))
    return out


def _family(path: Path, config: dict[str, Any]
            ) -> tuple[dict[str, Any], list[str], int, int | None]:
    """(sextant's model table, the dropout fields dropped, the context length, the sliding
    window or None) of a config, or a one-line refusal."""
    model_type = config.get("model_type")
    if model_type in LLAMA_TYPES:
        return _llama(path, config)
    if model_type in GPT_TYPES:
        return _gpt(path, config)
    if model_type == "gpt_neox":
        raise _refuse(path, "model_type", model_type, "GPT-NeoX puts attention and MLP in "
                      "parallel (use_parallel_residual) with partial rotary positions; "
                      "neither is in sextant's llama or gpt family")
    raise _refuse(path, "model_type", model_type,
                  f"supported: {', '.join(LLAMA_TYPES + GPT_TYPES)}")


def _model_folder(path: Path) -> tuple[Path, Path | None]:
    """(the config.json, the folder of pretrained weights or None) of an hf: path, which
    names a config.json or a model's folder."""
    from sextant.pretrained.weights import has_weights

    if not path.is_dir():
        return path, None
    return path / "config.json", (path.resolve() if has_weights(path) else None)


def workload_from_hf(path: str | Path, *, seq_len: int | None = None,
                     global_batch: int | None = None, scale: float | None = None,
                     layers: int | None = None, width: int | None = None,
                     steps: int | None = None) -> dict[str, Any]:
    """A workload (the TOML document, as a dict) for the model of `path`, trained on the
    bundled byte-level corpus until its [data] is pointed at your own files."""
    from sextant.workloads.init import count_params
    from sextant.core.display import human_count
    from sextant.workloads.spec import GPTSpec, LlamaSpec

    path, weights = _model_folder(Path(path))
    if weights is not None and (scale, layers, width) != (None, None, None):
        raise UserError(f"{weights} holds pretrained weights, whose shape is fixed: scale, "
                        "layers and width apply to a config.json alone (name the config.json "
                        "to train a smaller model from scratch)")
    config = read_config(path)
    check_values(path, config)
    model_type = config.get("model_type")
    model, dropped, context, window = _family(path, config)
    for name, value, most in (("--seq-len", seq_len, MAX_WIDTH),
                              ("--global-batch", global_batch, MAX_GLOBAL_BATCH),
                              ("--steps", steps, MAX_STEPS)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= most):
            raise UserError(f"{name} must be an integer in [1, {most}]. Received: {value!r}")
    if window is not None:
        if seq_len is not None and seq_len > window:
            raise _refuse(path, "sliding_window", window, f"--seq-len {seq_len} is longer than "
                          "the window, and sextant's attention is full causal attention (a "
                          f"sequence of at most {window} tokens never leaves the window)")
        context = min(context, window)
    model["seq_len"] = seq_len if seq_len is not None else min(context, MAX_WIDTH)
    full = dict(model)
    small = scaled(model, scale=scale, layers=layers, width=width)
    spec_cls = LlamaSpec if small["family"] == "llama" else GPTSpec
    spec = {k: v for k, v in small.items() if k != "family"}
    full_spec = {k: v for k, v in full.items() if k != "family"}
    try:
        full_count = count_params(spec_cls(**full_spec))
        count = count_params(spec_cls(**spec))
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    source = one_line_text(str(config.get("_name_or_path") or path.parent.name or path.stem))
    text = (f"{source} from {one_line_text(str(path))} ({model_type}, "
            f"{human_count(full_count)} parameters "
            f"at seq_len {model['seq_len']})")
    if small != full:
        text += (f"; scaled{f' by {scale:g}' if scale is not None else ''} to "
                 f"{small['n_layers']} layers x width {small['d_model']} "
                 f"({small['n_heads']} heads, d_ff {small['d_ff']}; "
                 f"{human_count(count)} parameters) from {full['n_layers']} x "
                 f"{full['d_model']}")
    if dropped:
        text += f"; without dropout ({one_line_text(', '.join(dropped))[:500]})"
    if weights is not None:
        text += f"; starting from its pretrained weights in {one_line_text(str(weights))}"
    name = "hf-" + "".join(c if c.isalnum() or c in "-_." else "-"
                           for c in str(source).split("/")[-1].lower())
    if small != full:
        name += "-scaled"
    out = {
        "name": name,
        "description": text,
        "steps": steps if steps is not None else 50,
        "global_batch": global_batch if global_batch is not None else 16,
        "model": small,
        "data": {"dataset": "python-reference"},
    }
    if weights is not None:
        out["weights"] = str(weights)
    return out


def parse_spec(spec: str) -> tuple[Path, dict[str, Any]]:
    """`hf:PATH[,key=value...]` -> (PATH, options)."""
    body = spec[len(HF_PREFIX):]
    path_text, *pairs = body.split(",")
    if not path_text:
        raise UserError(f"--workload {spec!r}: expected hf:path/to/config.json")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in SPEC_KEYS:
            raise UserError(f"--workload {spec!r}: options after the path are key=value with "
                            f"key one of {', '.join(SPEC_KEYS)}. Received: {pair!r}")
        try:
            options[key] = float(value) if key == "scale" else int(value)
        except ValueError:
            raise UserError(f"--workload {spec!r}: {key} must be a number. "
                            f"Received: {value!r}") from None
    return Path(path_text), options


def normalise_spec(spec: str) -> str:
    """The spec with its config's absolute path (a command that reproduces a run)."""
    path, options = parse_spec(spec)
    return HF_PREFIX + ",".join([str(path.resolve())]
                                + [f"{k}={v:g}" if k == "scale" else f"{k}={v}"
                                   for k, v in options.items()])


def workload_from_spec(spec: str) -> Workload:
    path, options = parse_spec(spec)
    return workload_from_dict(workload_from_hf(path, **options))


def toml_string(text: str) -> str:
    """`text` as a TOML basic string in printable ASCII: quotes, backslashes, control and
    non-ASCII characters escaped (a lone surrogate, which TOML cannot hold, as the visible
    text of its escape), so a value cannot end its line or reach a terminal raw."""
    out = ['"']
    for c in text:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= o < 0x7F:
            out.append(c)
        elif 0xD800 <= o <= 0xDFFF:
            out.append(f"\\\\u{o:04x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out) + '"'


def to_toml(workload: dict[str, Any]) -> str:
    """A workload dict as a TOML document (strings, numbers, booleans and flat tables)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return toml_string(v)
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else "nan"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return str(v)

    lines = [f"{k} = {value(v)}" for k, v in workload.items() if not isinstance(v, dict)]
    for table, body in workload.items():
        if isinstance(body, dict):
            lines += ["", f"[{table}]"] + [f"{k} = {value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"
