"""The published architectures `--model` names (presets.toml, each with the paper or model
card it comes from; nothing is downloaded), loaded once into TransformerShapes."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path

from sextant.core.errors import UserError
from sextant.planner.models import TransformerShape

DATA = Path(__file__).with_name("presets.toml")
_FIELDS = {f.name for f in fields(TransformerShape)} - {"name"}


def _load(path: Path = DATA) -> tuple[dict[str, TransformerShape], dict[str, str]]:
    """The presets and aliases of `path`: every table checked by TransformerShape, an
    unknown key refused by name."""
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    if set(raw) != {"schema", "presets", "aliases"} or raw["schema"] != 1:
        raise UserError(f"{path}: expected schema = 1, [presets.*] and [aliases]. "
                        f"Received: {sorted(raw)}")
    presets = {}
    for name, table in raw["presets"].items():
        unknown = sorted(set(table) - _FIELDS)
        if unknown:
            raise UserError(f"{path} [presets.{name}]: unknown keys {unknown}; allowed: "
                            f"{', '.join(sorted(_FIELDS))}")
        presets[name] = TransformerShape(name=name, **table)
    aliases = {str(k): str(v) for k, v in raw["aliases"].items()}
    missing = sorted(v for v in aliases.values() if v not in presets)
    if missing:
        raise UserError(f"{path} [aliases]: names no preset {missing}")
    return presets, aliases


PRESETS, ALIASES = _load()
