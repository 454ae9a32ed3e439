from __future__ import annotations

from pathlib import Path

import pytest

from sextant.core.errors import UserError
from sextant.workloads.spec import GPTSpec, bundled_workloads, load_workload
from sextant.sources import resolve_workload

GOOD = """
name = "w"
steps = 10
global_batch = 8
[model]
family = "gpt"
d_model = 32
n_heads = 4
[data]
dataset = "python-reference"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(text)
    return path


def test_bundled_workloads_load() -> None:
    assert set(bundled_workloads()) >= {"gpt-tiny", "gpt-small", "digits-mlp"}
    for name in bundled_workloads():
        assert resolve_workload(name).name == name


def test_gpt_small_is_10_to_20m_params() -> None:
    from sextant.workloads.init import count_params

    assert 10e6 <= count_params(resolve_workload("gpt-small").model) <= 20e6


def test_good_file_and_defaults(tmp_path: Path) -> None:
    w = load_workload(write(tmp_path, GOOD))
    assert isinstance(w.model, GPTSpec) and w.model.d_model == 32 and w.model.n_layers == 2
    assert w.optimizer.name == "adamw"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n" + GOOD, "unknown key colour"),
        (GOOD + "colour = 1\n", "unknown key data.colour; allowed keys: dataset"),
        (GOOD.replace("d_model = 32", "d_model = 32\nwidth = 3"), "unknown key model.width"),
        (GOOD + "[optimizer]\nmomentum = 0.9\n", "unknown key optimizer.momentum"),
        (GOOD.replace('"gpt"', '"cnn"'), "model.family must be one of ['mlp', 'gpt', 'llama']"),
        (GOOD.replace("n_heads = 4", "n_heads = 5"), "n_heads must divide model.d_model"),
        (GOOD.replace("steps = 10", "steps = 0"), "steps must be an integer >= 1. Received: 0"),
        (GOOD.replace("steps = 10", 'steps = "ten"'), "steps must be an integer"),
        (GOOD.replace("global_batch = 8", "global_batch = 2.5"), "global_batch must be an integer"),
        (GOOD.replace('"python-reference"', '"digits"'), "data.dataset for a gpt model"),
        (GOOD + "[optimizer]\nlr = -1.0\n", "optimizer.lr must be a number > 0"),
        (GOOD + "[optimizer]\nbeta2 = 1.5\n", "optimizer.beta2 must be in [0, 1)"),
        (GOOD.replace('name = "w"', ""), "missing required key 'name'"),
        ('name = "w"\n[model]\nfamily="gpt"\n', "missing required table [data]"),
        (GOOD + "[measure]\nwarmup_steps = 10\n", "steps must exceed measure.warmup_steps"),
        ("name = \n", "is not valid TOML"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UserError) as info:
        load_workload(write(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_names_bundled(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="workload file not found: nope.toml .bundled"):
        resolve_workload("nope.toml")


def test_content_hash_ignores_formatting_and_description(tmp_path: Path) -> None:
    a = load_workload(write(tmp_path, GOOD))
    reordered = "# comment\n" + GOOD.replace('name = "w"\n', "") + ""
    reordered = 'description = "other words"\nname = "w"\n' + reordered
    b = load_workload(write(tmp_path, reordered))
    assert a.content_hash() == b.content_hash()
    assert a.content_hash() != a.replace(seed=1).content_hash()


def test_dataset_facts_match_the_bundled_files() -> None:
    """workload.DATASET_FACTS (what validation checks against) is what the files hold."""
    from sextant.data import digits, text_tokens
    from sextant.workloads.spec import DATASET_FACTS

    features, labels = digits()
    assert DATASET_FACTS["digits"] == {"samples": labels.size, "input_dim": features.shape[1],
                                       "num_classes": int(labels.max()) + 1}
    assert DATASET_FACTS["python-reference"] == {"tokens": text_tokens("python-reference").size}
