"""Canonical parameters and batches: deterministic, framework-neutral, worker-count-free."""

from __future__ import annotations

import numpy as np

from sextant import data
from sextant.workloads.init import count_params, flops_per_step, init_params, param_shapes
from sextant.workloads.schedule import lr_table
from sextant.sources import resolve_workload


def test_params_deterministic_and_seeded() -> None:
    model = resolve_workload("gpt-tiny").model
    a, b = init_params(model, 0), init_params(model, 0)
    assert list(a) == list(param_shapes(model))
    for name in a:
        assert a[name].dtype == np.float32
        np.testing.assert_array_equal(a[name], b[name])
    c = init_params(model, 1)
    assert not np.array_equal(a["wte"], c["wte"])
    assert sum(v.size for v in a.values()) == count_params(model)


def test_param_values_keyed_by_name_not_order() -> None:
    # A wider MLP has other layers, but a layer with the same name and shape keeps its values.
    w = resolve_workload("digits-mlp")
    small = init_params(w.model, 0)
    bigger = init_params(w.model.__class__(hidden=(128, 128, 32)), 0)
    np.testing.assert_array_equal(small["layers.0.weight"], bigger["layers.0.weight"])


def test_global_batch_is_pure_function_of_seed_and_step() -> None:
    w = resolve_workload("gpt-tiny")
    x1, y1 = data.global_batch(w, 3)
    x2, y2 = data.global_batch(w, 3)
    np.testing.assert_array_equal(x1, x2)
    assert x1.shape == (w.global_batch, w.model.seq_len)
    np.testing.assert_array_equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
    assert x1.flags.c_contiguous and y1.flags.c_contiguous
    assert not np.array_equal(x1, data.global_batch(w, 4)[0])
    assert not np.array_equal(x1, data.global_batch(w.replace(seed=7), 3)[0])


def test_batches_are_the_same_bytes_release_after_release() -> None:
    """Stored runs stay comparable only while batch i keeps its bytes: any change to how a
    batch is drawn (a faster gather, another generator) must fail here."""
    import hashlib

    expected = {
        "gpt-tiny": "fb212e7957d7b8c4317966ecedb44319ab8410bf86f4241ca9e376b3ca1c6e17",
        "digits-mlp": "83ba7c31db46f77f20e3f9f5e65e9de85bdcd56d40a2feecee1e970c2d23748b",
    }
    for name, digest in expected.items():
        x, y = data.global_batch(resolve_workload(name), 0)
        assert hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest() == digest, name


def test_prepared_batches_are_the_batches() -> None:
    """The timed loop makes batches ahead (data.prepare, outside the clock): each is handed
    out once, equal to the one made on the spot, and only for the workload it was made for."""
    w = resolve_workload("gpt-tiny")
    fresh = [data.global_batch(w, i) for i in range(4)]
    data.prepare(w, range(1, 3))
    other = w.replace(seed=7)
    assert not np.array_equal(data.global_batch(other, 1)[0], fresh[1][0])
    for i in range(4):
        x, y = data.global_batch(w, i)
        np.testing.assert_array_equal(x, fresh[i][0])
        np.testing.assert_array_equal(y, fresh[i][1])
    assert data._AHEAD.batches == {}  # each prepared batch was handed out once
    data.prepare_ahead(w, 0)  # what the loops call before each step: made once, ahead
    made = dict(data._AHEAD.batches)
    assert sorted(made) == list(range(min(data.batches_ahead(w), w.steps)))
    data.prepare_ahead(w, 1)
    assert data._AHEAD.batches.keys() == made.keys()  # already made: nothing made again
    assert 1 <= data.batches_ahead(w) <= 64
    assert data.batches_ahead(resolve_workload("digits-mlp")) == 64


def test_shards_reassemble_the_global_batch() -> None:
    w = resolve_workload("digits-mlp")
    x, y = data.global_batch(w, 0)
    for world in (1, 2, 4):
        parts = [data.shard(x, r, world) for r in range(world)]
        np.testing.assert_array_equal(np.concatenate(parts), x)


def test_digits_are_the_real_dataset() -> None:
    features, labels = data.digits()
    assert features.shape == (1797, 64) and labels.shape == (1797,)
    assert features.min() == 0.0 and features.max() == 1.0
    assert np.bincount(labels).tolist()[:3] == [178, 182, 177]


def test_lr_schedule_warmup_then_cosine() -> None:
    w = resolve_workload("gpt-tiny")
    lrs = lr_table(w.optimizer, w.steps)
    opt = w.optimizer
    assert np.isclose(lrs[0], opt.lr / opt.warmup_steps)
    assert np.isclose(lrs[opt.warmup_steps - 1], opt.lr)
    assert np.isclose(lrs[-1], opt.lr * opt.min_lr_ratio)
    assert np.all(np.diff(lrs[opt.warmup_steps - 1:]) <= 0)


def test_flops_formula() -> None:
    model = resolve_workload("gpt-tiny").model
    per_token = 6 * (count_params(model) - 256 * 64 - 64 * 64) + 12 * 2 * 64 * 64
    assert flops_per_step(model, 16) == 16 * 64 * per_token


def test_private_tempdir_is_removed_and_restored(tmp_path) -> None:  # noqa: ANN001
    import tempfile

    from sextant.core.fsutil import private_tempdir, remove_private_tempdirs

    before = tempfile.gettempdir()
    scratch = private_tempdir("rank0.tmp-", parent=tmp_path)
    assert scratch.parent == tmp_path and tempfile.gettempdir() == str(scratch)
    (scratch / "__autograph_generated_file.py").write_text("x = 1\n")
    remove_private_tempdirs()
    assert not scratch.exists() and tempfile.gettempdir() == before
