"""Model shapes from files: a sextant workload TOML (its name, global_batch and [model]), a
bundled workload's name, or a Hugging Face config (`hf:`), held to the planner's own bounds
(models.PLAN_BOUNDS)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.core.errors import UserError
from sextant.planner.catalogue import Table
from sextant.planner.models import PLAN_BOUNDS, MLPShape, TransformerShape

if TYPE_CHECKING:
    from sextant.workloads.spec import FinetuneSpec

# --- workload files --------------------------------------------------------------------------

_GPT_KEYS = ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "d_ff")
_MLP_KEYS = ("input_dim", "hidden", "num_classes")


def shape_from_workload(
    raw: Table, *, where: str = "workload"
) -> TransformerShape | MLPShape:
    """Build a shape from a parsed sextant workload (only name, global_batch and [model] are
    read; [data] and the rest belong to the runner, and may be left out)."""
    from dataclasses import fields

    from sextant.workloads.spec import Workload

    allowed = sorted(f.name for f in fields(Workload))
    unknown = sorted(set(raw) - set(allowed))
    if unknown:  # worded as run words it, so one file gets one answer from both
        raise UserError(f"{where}: unknown key {unknown[0]}; allowed keys: {', '.join(allowed)}")
    model = raw.get("model")
    if not isinstance(model, dict):
        raise UserError(f"{where} has no [model] table")
    family = model.get("family")
    name = str(raw.get("name", "workload"))
    batch = raw.get("global_batch", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UserError(f"{where}: global_batch must be an integer >= 1. Received: {batch!r}")
    if family == "gpt":
        values = _decoder_values(model, "gpt", where)
        # sextant's gpt (sextant/workloads/init.py): pre-LayerNorm, GELU MLP, learned positions,
        # biases on every linear layer except the output head (its own, or the embedding's
        # when tied), no dropout.
        return TransformerShape(
            name=name,
            n_kv_heads=values["n_heads"],
            learned_positions=True,
            biases=True,
            layernorm=True,
            tied_embeddings=model.get("tie_embeddings") is True,
            gated_mlp=False,
            dropout=False,
            global_batch=batch,
            source=where,
            **{k: values[k] for k in _GPT_KEYS},
        )
    if family == "transformer":
        return _transformer_from_workload(model, name=name, batch=batch, where=where)
    if family == "llama":
        return _llama_from_workload(model, name=name, batch=batch, where=where)
    if family == "mlp":
        for key in _MLP_KEYS:
            if key not in model:
                raise UserError(f"{where}: model.{key} is required for an mlp model")
        hidden = model["hidden"]
        if not isinstance(hidden, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in hidden
        ):
            raise UserError(
                f"{where}: model.hidden must be a list of integers. Received: {hidden!r}"
            )
        for key in ("input_dim", "num_classes"):
            v = model[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{where}: model.{key} must be an integer >= 1. Received: {v!r}")
        return MLPShape(
            name=name,
            input_dim=model["input_dim"],
            hidden=tuple(hidden),
            num_classes=model["num_classes"],
            global_batch=batch,
            source=where,
        )
    raise UserError(
        f"{where}: model.family must be 'gpt', 'llama', 'transformer' or 'mlp'. "
        f"Received: {family!r}"
    )


_TRANSFORMER_INTS = ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "seq_len")
_TRANSFORMER_OPTIONAL = {
    "n_kv_heads": int,
    "head_dim": int,
    "gated_mlp": bool,
    "tied_embeddings": bool,
    "learned_positions": bool,
    "biases": bool,
    "layernorm": bool,
    "dropout": bool,
    "n_experts": int,
    "top_k": int,
    "capacity_factor": float,
    "moe_d_ff": int,
    "n_shared_experts": int,
    "n_dense_layers": int,
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "rope_head_dim": int,
    "v_head_dim": int,
}


def _decoder_values(model: Table, family: str, where: str) -> dict[str, Any]:
    """The [model] table of sextant's runnable gpt or llama family, held to the planner's
    bounds (PLAN_BOUNDS), not the training ones: a plan builds no model, so a published
    shape too wide to train on this machine (d_ff 81,920, a 128K context) is still planned.
    Unknown keys are refused as the runner refuses them."""
    from dataclasses import fields

    from sextant.workloads.spec import GPTSpec, LlamaSpec

    spec = GPTSpec if family == "gpt" else LlamaSpec
    allowed = {f.name for f in fields(spec)}
    unknown = sorted(set(model) - allowed)
    if unknown:
        raise UserError(f"{where}: unknown key model.{unknown[0]} for a {family} model; "
                        f"allowed: {', '.join(sorted(allowed - {'family'}))}")
    for key in _GPT_KEYS:  # a plan of a published model states its shape
        if key not in model:
            raise UserError(f"{where}: model.{key} is required for a {family} model")
    defaults = {f.name: f.default for f in fields(spec)}
    values: dict[str, Any] = {k: model.get(k, defaults[k]) for k in allowed - {"family"}}
    ints = [k for k in values if k in PLAN_BOUNDS]
    for key in ints:
        value, most = values[key], PLAN_BOUNDS[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise UserError(f"{where}: model.{key} must be an integer in [1, {most}]. "
                            f"Received: {value!r}")
    for key in ("rope_theta", "norm_eps"):
        value = values.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0):
            raise UserError(f"{where}: model.{key} must be a number > 0. Received: {value!r}")
    if not isinstance(values.get("tie_embeddings", False), bool):
        raise UserError(f"{where}: model.tie_embeddings must be true or false. "
                        f"Received: {values['tie_embeddings']!r}")
    if values["d_model"] % values["n_heads"]:
        raise UserError(f"{where}: model.n_heads must divide model.d_model. Received: "
                        f"d_model={values['d_model']}, n_heads={values['n_heads']}")
    return values


def _llama_from_workload(model: Table, *, name: str, batch: int, where: str
                         ) -> TransformerShape:
    """sextant's runnable llama family (sextant/workloads/init.py): RMSNorm, rotary positions,
    grouped-query attention, SwiGLU, no biases, no dropout."""
    v = _decoder_values(model, "llama", where)
    return TransformerShape(
        name=name, n_layers=v["n_layers"], d_model=v["d_model"], n_heads=v["n_heads"],
        n_kv_heads=v["n_kv_heads"], d_ff=v["d_ff"], vocab_size=v["vocab_size"],
        seq_len=v["seq_len"], gated_mlp=True, tied_embeddings=v["tie_embeddings"],
        learned_positions=False, biases=False, layernorm=False, dropout=False,
        global_batch=batch, source=where,
    )


def _transformer_from_workload(
    model: Table, *, name: str, batch: int, where: str
) -> TransformerShape:
    """A planner-only model family for `plan --workload`: any decoder-only transformer with
    grouped-query attention (n_kv_heads), SwiGLU (gated_mlp), tied embeddings, dropout,
    RMSNorm (layernorm = false), mixture-of-experts (n_experts, top_k, capacity_factor,
    moe_d_ff, n_shared_experts, n_dense_layers) and multi-head latent attention
    (q_lora_rank, kv_lora_rank, rope_head_dim, v_head_dim). Unknown keys are refused."""
    allowed = {"family", *_TRANSFORMER_INTS, *_TRANSFORMER_OPTIONAL}
    unknown = sorted(set(model) - allowed)
    if unknown:
        raise UserError(
            f"{where}: unknown key model.{unknown[0]} for a transformer model; allowed: "
            f"{', '.join(sorted(allowed - {'family'}))}"
        )
    values: dict[str, Any] = {}
    for key in _TRANSFORMER_INTS:
        if key not in model:
            raise UserError(f"{where}: model.{key} is required for a transformer model")
        values[key] = model[key]
    for key, kind in _TRANSFORMER_OPTIONAL.items():
        if key not in model:
            continue
        value = model[key]
        ok = (
            isinstance(value, bool)
            if kind is bool
            else isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, int) and not isinstance(value, bool)
        )
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            raise UserError(
                f"{where}: model.{key} must be {'true/false' if kind is bool else 'a number'}. "
                f"Received: {value!r}"
            )
        values[key] = value
    values.setdefault("n_kv_heads", values["n_heads"])
    return TransformerShape(name=name, global_batch=batch, source=where, **values)


def load_workload_shape(path: str | Path) -> TransformerShape | MLPShape:
    """The shape of `--workload`: a TOML file, a bundled workload's name or an hf: config.
    Only the shape is read (no [data], no tokens made), at the planner's bounds."""
    from sextant.sources import is_hf, workload_file
    from sextant.core.tomlfile import read_toml

    if is_hf(path):
        return _hf_shape(str(path))
    raw = read_toml(workload_file(path), "workload")
    return shape_from_workload(raw, where=str(path))


def load_workload_finetune(path: str | Path) -> FinetuneSpec | None:
    """The [finetune] table of `--workload` (a TOML file or a bundled workload), checked as
    `run` checks it; None without one (and for an hf: config, which has none)."""
    from sextant.sources import is_hf, workload_file
    from sextant.core.tomlfile import read_toml
    from sextant.workloads.spec import FinetuneSpec

    if is_hf(path):
        return None
    table = read_toml(workload_file(path), "workload").get("finetune")
    if table is None:
        return None
    allowed = set(FinetuneSpec.__dataclass_fields__)
    if not isinstance(table, dict) or set(table) - allowed:
        raise UserError(f"{path}: [finetune] takes {', '.join(sorted(allowed))}. "
                        f"Received: {table!r}")
    values = dict(table)
    if isinstance(values.get("targets"), list):
        values["targets"] = tuple(values["targets"])
    return FinetuneSpec(**values)


def _hf_shape(spec: str) -> TransformerShape | MLPShape:
    """A Hugging Face config's model at its full context (max_position_embeddings), mapped
    and refused as `run` maps and refuses it (sextant.pretrained.hf), without the training bounds."""
    from sextant.pretrained import hf

    path, options = hf.parse_spec(spec)
    path, _ = hf._model_folder(path)  # a model's folder plans the model of its config.json
    config = hf.read_config(path)
    hf.check_values(path, config)  # the same one-line refusals as a training workload's
    kind = config.get("model_type")
    if kind in hf.LLAMA_TYPES:
        model, _, context, window = hf._llama(path, config)
    elif kind in hf.GPT_TYPES:
        model, _, context, window = hf._gpt(path, config)
    else:  # its one-line refusal, with the reason
        return shape_from_workload(hf.workload_from_hf(path, **options), where=spec)
    model["seq_len"] = options.get("seq_len", context if window is None
                                   else min(context, window))
    model = hf.scaled(model, scale=options.get("scale"), layers=options.get("layers"),
                      width=options.get("width"))
    name = "hf-" + (str(config.get("_name_or_path") or path.parent.name or path.stem)
                    .split("/")[-1].lower())
    raw = {"name": name, "global_batch": options.get("global_batch", 16), "model": model}
    return shape_from_workload(raw, where=spec)
