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
    hf.set_defaults(func=cmd_from_hf)


def cmd_from_hf(args: argparse.Namespace) -> int:
    from sextant.errors import UserError
    from sextant.hf import one_line_text, to_toml, workload_from_hf
    from sextant.workload import workload_from_dict

    raw = workload_from_hf(args.config, seq_len=args.seq_len, global_batch=args.global_batch,
                           scale=args.scale, layers=args.layers, width=args.width,
                           steps=args.steps)
    if args.lora_rank is not None:
        raw["finetune"] = {"method": "lora", "rank": args.lora_rank,
                           "alpha": (args.lora_alpha if args.lora_alpha is not None
                                     else 2.0 * args.lora_rank)}
        if args.lora_targets is not None:
            raw["finetune"]["targets"] = [t.strip() for t in args.lora_targets.split(",")]
    elif args.lora_alpha is not None or args.lora_targets is not None:
        raise UserError("--lora-alpha and --lora-targets go with --lora-rank")
    workload_from_dict(raw)  # what is written loads
    # The comment in printable ASCII, as every string below it: one line whatever the config.
    comment = one_line_text(raw["description"]).encode("ascii", "backslashreplace").decode()
    sys.stdout.write(f"# {comment}\n")
    sys.stdout.write(to_toml(raw))
    return 0
