"""`sextant workload from-hf CONFIG`: a workload TOML from a Hugging Face config.json."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "workload", help="make a workload from your model's Hugging Face config.json",
        description="Write a workload TOML to stdout. `--workload hf:CONFIG[,scale=S,...]` "
                    "uses one directly (see docs/your-model-and-data.md).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(p))
    hf = verbs.add_parser(
        "from-hf", help="a workload for a Llama/Mistral/Qwen2/GPT-2-style model",
        description="Map a decoder-only Hugging Face config.json (Llama 1-3, Mistral inside "
                    "its sliding window, Qwen2, GPT-2) onto sextant's llama or gpt family; "
                    "anything those cannot express is refused, naming the field. Given the "
                    "model's folder, training starts from its *.safetensors weights. Trains "
                    "on the bundled byte-level corpus until [data] names your files.")
    hf.add_argument("config", help="path of the config.json, or of the model's folder "
                                   "(config.json and *.safetensors)")
    hf.add_argument("--seq-len", type=int, default=None,
                    help="tokens per sequence (default: the config's context length)")
    hf.add_argument("--global-batch", type=int, default=None,
                    help="sequences per optimizer step (default: 16)")
    hf.add_argument("--steps", type=int, default=None, help="optimizer steps (default: 50)")
    hf.add_argument("--scale", type=float, default=None,
                    help="a shape-faithful smaller model: depth and width each times "
                         "S^(1/3), so about S of the per-layer parameters (0 < S <= 1)")
    hf.add_argument("--layers", type=int, default=None, help="transformer blocks (overrides "
                    "--scale's)")
    hf.add_argument("--width", type=int, default=None, help="d_model (overrides --scale's); "
                    "heads keep the config's grouping")
    hf.add_argument("--lora-rank", type=int, default=None, help="fine-tune with LoRA "
                    "adapters of this rank beside the frozen model ([finetune] method = "
                    "'lora'; default: full fine-tuning)")
    hf.add_argument("--lora-alpha", type=float, default=None,
                    help="LoRA's alpha: adapters scaled by alpha / rank (default: 2 x rank)")
    hf.add_argument("--lora-targets", default=None, help="comma-separated projections that "
                    "get an adapter among q,k,v,o,gate,up,down (default: q,v)")
    hf.add_argument("--fit", action="store_true",
                    help="pick the scale (a config.json alone), sequence length and global "
                         "batch that fit this machine's memory and --target-step-s, largest "
                         "model first (see docs/your-model-and-data.md)")
    hf.add_argument("--target-step-s", type=float, default=1.0, metavar="S",
                    help="with --fit: the step time to stay under, seconds (default: 1)")
    hf.set_defaults(func=cmd_from_hf)


def cmd_from_hf(args: argparse.Namespace) -> int:
    from sextant.pretrained.hf import one_line_text, to_toml, workload_from_hf
    from sextant.workloads.spec import workload_from_dict

    finetune = _finetune(args)
    if args.fit:
        raw = _fitted(args, finetune)
    else:
        raw = workload_from_hf(args.config, seq_len=args.seq_len,
                               global_batch=args.global_batch, scale=args.scale,
                               layers=args.layers, width=args.width, steps=args.steps)
        if finetune:
            raw["finetune"] = finetune
    workload_from_dict(raw)  # what is written loads
    # The comment in printable ASCII, as every string below it: one line whatever the config.
    comment = one_line_text(raw["description"]).encode("ascii", "backslashreplace").decode()
    sys.stdout.write(f"# {comment}\n")
    sys.stdout.write(to_toml(raw))
    return 0


def _finetune(args: argparse.Namespace) -> dict[str, Any] | None:
    """The [finetune] table the LoRA flags ask for, None for full fine-tuning."""
    from sextant.core.errors import UserError

    if args.lora_rank is None:
        if args.lora_alpha is not None or args.lora_targets is not None:
            raise UserError("--lora-alpha and --lora-targets go with --lora-rank")
        return None
    out: dict[str, Any] = {"method": "lora", "rank": args.lora_rank,
                           "alpha": (args.lora_alpha if args.lora_alpha is not None
                                     else 2.0 * args.lora_rank)}
    if args.lora_targets is not None:
        out["targets"] = [t.strip() for t in args.lora_targets.split(",")]
    return out


def _fitted(args: argparse.Namespace, finetune: dict[str, Any] | None) -> dict[str, Any]:
    """The workload --fit picks (sextant.commands.fit.fit), its choice in the description."""
    import math
    from pathlib import Path

    from sextant.commands.fit import MEMORY_SHARE, available_memory, fit
    from sextant.core.errors import UserError
    from sextant.pretrained.hf import _model_folder, workload_from_hf
    from sextant.workloads.spec import workload_from_dict

    given = [f for f in ("seq_len", "global_batch", "scale", "layers", "width")
             if getattr(args, f) is not None]
    if given:
        raise UserError(f"--fit picks the scale, sequence length and batch itself; drop "
                        f"--{given[0].replace('_', '-')}")
    if not (isinstance(args.target_step_s, float) and math.isfinite(args.target_step_s)
            and args.target_step_s > 0):
        raise UserError(f"--target-step-s must be a number of seconds > 0. Received: "
                        f"{args.target_step_s!r}")
    pretrained = _model_folder(Path(args.config))[1] is not None
    context = workload_from_hf(args.config)["model"]["seq_len"]

    def make(scale: float, seq_len: int, batch: int) -> Any:
        raw = workload_from_hf(args.config, seq_len=seq_len, global_batch=batch,
                               scale=None if scale >= 1 else scale, steps=args.steps)
        if finetune:
            raw["finetune"] = finetune
        return workload_from_dict(raw)

    budget = MEMORY_SHARE * available_memory()
    choice, guess = fit(make, context, pretrained=pretrained,
                        target_step_s=args.target_step_s, memory_budget=budget)
    raw = workload_from_hf(args.config, seq_len=choice["seq_len"],
                           global_batch=choice["global_batch"],
                           scale=None if choice["scale"] >= 1 else choice["scale"],
                           steps=args.steps)
    if finetune:
        raw["finetune"] = finetune
    raw["description"] += (f"; fitted to this machine: about {guess.step_s:.2f} s a step "
                           f"(target {args.target_step_s:g} s) and "
                           f"{guess.memory_bytes / 2**30:.2f} GiB (budget "
                           f"{budget / 2**30:.1f} GiB), from {guess.how}")
    return raw
