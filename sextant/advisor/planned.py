"""Time-to-train from a planner result: `sextant plan ... --json > plan.json`, then
`sextant advise --profile P --plan plan.json`.

The plan gives the tokens/s of the best layout of the target model on the target number of
accelerators (memory, FLOPs and communication modelled; docs/planner.md); the advisor turns
it into training hours on the fastest stack, labelled 'planner' (neither measured here nor a
rule of thumb), and each candidate stack takes those hours divided by its relative
throughput, as with any other source of hours.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sextant.advisor.profile import TeamProfile
from sextant.core.errors import UserError

HARDWARE_WORDS = {"nvidia": "nvidia", "amd": "amd", "tpu": "tpu", "ascend": "ascend",
                  "apple": "apple", "cpu": "cpu"}
"""Profile hardware family -> a word the catalogue's accelerator name or key contains."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PlannedTraining:
    hours: float
    tokens: float
    tokens_per_s: float
    devices: int
    accelerator: str
    layout: str
    mfu: float | None
    model: str
    path: str
    notes: tuple[str, ...] = ()

    @property
    def describe(self) -> str:
        mfu = f", MFU {self.mfu:.0%}" if self.mfu is not None else ""
        return (f"{self.model} on {self.devices} x {self.accelerator}, layout {self.layout}, "
                f"{self.tokens_per_s:,.0f} tokens/s{mfu}; {self.tokens:.3g} tokens "
                f"({self.path})")


def _number(doc: Mapping[str, Any], *keys: str) -> float | None:
    value: Any = doc
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def load_plan(path: str | Path, profile: TeamProfile) -> PlannedTraining:
    """Read a `sextant plan --json` document and check it plans the profile's training."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--plan {path}: no such file; write one with "
                        "'sextant plan --model M --gpus N --tokens T --json > plan.json'") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--plan {path} is not a JSON plan ({exc}); write one with "
                        "'sextant plan ... --json > plan.json'") from None
    tps = _number(doc, "throughput", "tokens_per_s") if isinstance(doc, Mapping) else None
    devices = _number(doc, "hardware", "devices") if isinstance(doc, Mapping) else None
    if tps is None or tps <= 0 or devices is None:
        raise UserError(f"--plan {path} has no throughput.tokens_per_s and hardware.devices: "
                        "it is not the output of 'sextant plan ... --json'")
    if int(devices) != profile.devices:
        raise UserError(f"--plan {path} is for {int(devices)} devices but the profile has "
                        f"devices = {profile.devices}: plan with --gpus {profile.devices}, or "
                        f"set devices = {int(devices)} in the profile")
    tokens = _number(doc, "training", "tokens") or profile.training_tokens
    if not tokens:
        raise UserError(f"--plan {path} has no training tokens and the profile no "
                        "training_tokens: plan with --tokens T, or add training_tokens to the "
                        "profile")
    hw = doc.get("hardware") or {}
    accelerator = str(hw.get("accelerator", "?"))
    notes = []
    word = HARDWARE_WORDS[profile.hardware]
    if word not in f"{accelerator} {hw.get('accelerator_name', '')}".lower():
        notes.append(f"The plan's accelerator ({hw.get('accelerator_name') or accelerator}) is "
                     f"not {profile.hardware} hardware, as the profile says: its hours may not "
                     "apply.")
    model = doc.get("model") or {}
    params = _number(model, "params")
    if params and not 0.5 <= params / profile.model_params <= 2.0:
        notes.append(f"The plan's model has {params:.3g} parameters, the profile "
                     f"{profile.model_params:.3g}.")
    return PlannedTraining(
        hours=float(tokens) / tps / 3600.0, tokens=float(tokens), tokens_per_s=tps,
        devices=int(devices), accelerator=accelerator,
        layout=str((doc.get("layout") or {}).get("label", "?")),
        mfu=_number(doc, "throughput", "mfu"), model=str(model.get("name", "?")),
        path=str(path), notes=tuple(notes),
    )
