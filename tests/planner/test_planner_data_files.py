"""The planner's presets and stack profiles are data files (presets.toml, profiles.toml),
loaded once and checked by their typed records."""

from __future__ import annotations

import pytest

from sextant.core.errors import UserError
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


def test_the_memory_model_is_data_not_a_name():
    """A record with another model's fields under a new name allocates exactly as that model:
    the figures come from the profile's data, never from a branch on the name."""
    from dataclasses import replace

    import numpy as np

    from sextant.planner import memory

    for name in memory.MEMORY_MODELS:
        twin = replace(memory.MODELS[name], name="twin")
        for precision in ("bf16", "fp16", "fp32"):
            assert memory.state_bytes(precision, "adam", twin) == memory.state_bytes(
                precision, "adam", name)
            assert memory.comm_bytes(precision, twin) == memory.comm_bytes(precision, name)
        zero, dp = np.array([0, 1, 2, 3]), np.array([8.0, 8.0, 8.0, 8.0])
        for off in (0, 1, 2):
            a = memory.state_coefficients(dp, zero, offload=off, memory_model=twin)
            b = memory.state_coefficients(dp, zero, offload=off, memory_model=name)
            assert all(np.array_equal(a[k], b[k]) for k in a)
        kw = {"largest_module_params": 1e6}
        assert np.array_equal(
            memory.transient_param_bytes(1e7, 4.0, zero, memory_model=twin, **kw),
            memory.transient_param_bytes(1e7, 4.0, zero, memory_model=name, **kw))
        assert np.array_equal(memory.buffer_bytes(1e7, zero, dp=2, memory_model=twin),
                              memory.buffer_bytes(1e7, zero, dp=2, memory_model=name))
        assert memory.loss_bytes_factor(twin, tp=2) == memory.loss_bytes_factor(name, tp=2)


def test_an_unknown_memory_model_key_is_refused(tmp_path):
    from sextant.planner import memory

    path = _write(tmp_path, '[memory_models.mine]\nsource = "s"\nbf16 = [2, 2, 0]\n'
                            'fp16 = [2, 2, 0]\ncomm_bytes = [2, 2]\nshard = 3\n')
    with pytest.raises(UserError, match="unknown keys \\['shard'\\]"):
        memory._load(path)
    with pytest.raises(UserError, match="unknown memory model 'mine'"):
        memory.model_of("mine")
