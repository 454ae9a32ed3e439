"""The planner's presets and stack profiles are data files (presets.toml, profiles.toml),
loaded once and checked by their typed records."""

from __future__ import annotations

import pytest

from sextant.errors import UserError
from sextant.planner import presets, profiles
from sextant.planner.models import TransformerShape
from sextant.planner.profiles import StackProfile


def test_every_record_is_typed_and_every_alias_names_a_preset():
    assert presets.PRESETS and all(isinstance(s, TransformerShape)
                                   for s in presets.PRESETS.values())
    assert all(name == s.name for name, s in presets.PRESETS.items())
    assert set(presets.ALIASES.values()) <= set(presets.PRESETS)
    assert profiles.PROFILES and all(isinstance(p, StackProfile)
                                     for p in profiles.PROFILES.values())
    assert profiles.DEFAULT_STACK in profiles.PROFILES
    assert profiles.TORUS_STACK in profiles.PROFILES


def _write(tmp_path, text):
    path = tmp_path / "data.toml"
    path.write_text(text)
    return path


def test_an_unknown_key_is_refused_by_name(tmp_path):
    shape = ('schema = 1\n[presets.tiny]\nn_layers = 2\nd_model = 64\nn_heads = 4\n'
             'n_kv_heads = 4\nd_ff = 128\nvocab_size = 256\nseq_len = 32\n')
    assert presets._load(_write(tmp_path, shape + "[aliases]\n"))[0]["tiny"].n_layers == 2
    with pytest.raises(UserError, match="unknown keys \\['widht'\\]"):
        presets._load(_write(tmp_path, shape + "widht = 3\n[aliases]\n"))
    with pytest.raises(UserError, match="names no preset"):
        presets._load(_write(tmp_path, shape + '[aliases]\nbig = "huge"\n'))
    stack = ('schema = 1\n[profiles.mine]\nrelease = "r"\nmemory_model = "zero"\n'
             'dp_schedule = "zero"\nzero3_gather = "layer"\nbalanced_stages = true\n'
             'cp_method = "ring"\nload = "sharded"\n')
    assert profiles._load(_write(tmp_path, stack))["mine"].dp_bucket_bytes is None
    with pytest.raises(UserError, match="unknown keys \\['overlap'\\]"):
        profiles._load(_write(tmp_path, stack + "overlap = 0.5\n"))
    with pytest.raises(UserError, match="memory_model must be one of"):
        profiles._load(_write(tmp_path, stack.replace('"zero"\ndp', '"mine"\ndp')))
