"""`plan --workload` takes every published shape: the planner's own bounds, not training's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner.models import MAX_PLAN_WIDTH
from sextant.planner.workload_shapes import load_workload_shape
from sextant.workloads.spec import MAX_WIDTH, load_workload

# MT-NLG 530B (Smith et al. 2022, Table 1): 105 layers, hidden 20480, 128 heads, d_ff 4h.
MT_NLG = """name = "mt-nlg-530b"
global_batch = 1920
[model]
family = "gpt"
n_layers = 105
d_model = 20480
n_heads = 128
d_ff = 81920
vocab_size = 51200
seq_len = 2048
"""

# Llama 3.1 8B's shape at its 131,072-token context (the Llama 3.1 model card), no [data].
LONG_CONTEXT = """name = "llama3-8b-128k"
global_batch = 64
[model]
family = "llama"
n_layers = 32
d_model = 4096
n_heads = 32
n_kv_heads = 8
d_ff = 14336
vocab_size = 128256
seq_len = 131072
"""

HF_CONFIG = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": False,
}


def _plan_json(capsys, *argv: str) -> dict:
    rc = main(["plan", *argv, "--no-curve", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_530b_model_with_d_ff_81920_is_planned(capsys, tmp_path):
    path = _write(tmp_path, "mtnlg.toml", MT_NLG)
    doc = _plan_json(capsys, "--workload", str(path), "--gpus", "2240",
                     "--accelerator", "a100-80gb", "--network", "ib-hdr")
    assert load_workload_shape(path).d_ff == 81920 > MAX_WIDTH
    assert 525e9 < doc["model"]["params"] < 535e9
    # run keeps its own bounds: the same file is refused for training, in one line.
    trainable = _write(tmp_path, "train.toml", MT_NLG + '[data]\ndataset = "python-reference"\n')
    with pytest.raises(UserError, match=f"at most {MAX_WIDTH}"):
        load_workload(trainable)


def test_a_128k_context_without_data_is_planned(capsys, tmp_path):
    path = _write(tmp_path, "long.toml", LONG_CONTEXT)
    doc = _plan_json(capsys, "--workload", str(path), "--gpus", "256", "--cp", "16")
    assert load_workload_shape(path).seq_len == 131072
    assert "seq 131072" in doc["model"]["shape"]
    assert doc["layout"]["cp"] == 16


def test_an_hf_config_is_planned_at_its_full_context(capsys, tmp_path):
    path = _write(tmp_path, "config.json", json.dumps(HF_CONFIG))
    shape = load_workload_shape(f"hf:{path}")
    assert shape.seq_len == 131072 and shape.d_ff == 14336
    assert load_workload_shape(f"hf:{path},seq_len=8192").seq_len == 8192
    with pytest.raises(UserError, match=f"in \\[1, {MAX_PLAN_WIDTH}\\]"):
        load_workload_shape(f"hf:{path},seq_len={MAX_PLAN_WIDTH + 1}")


def test_a_bundled_workload_is_planned_by_name():
    assert load_workload_shape("gpt-tiny").name == "gpt-tiny"


@pytest.mark.parametrize("key, value", [("d_ff", MAX_PLAN_WIDTH + 1), ("seq_len", 0),
                                        ("n_heads", 3), ("bogus", 1)])
def test_the_planner_bounds_are_one_line_errors(capsys, tmp_path, key, value):
    text = LONG_CONTEXT.replace("[model]\n", f"[model]\n{key} = {value}\n")
    text = "\n".join(line for line in text.splitlines()
                     if not line.startswith(f"{key} =") or line == f"{key} = {value}")
    path = _write(tmp_path, "bad.toml", text + "\n")
    assert main(["plan", "--workload", str(path), "--gpus", "8", "--no-curve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err


def test_mfu_1_is_accepted_as_the_bound(capsys):
    doc = _plan_json(capsys, "--model", "llama2-13b", "--gpus", "64", "--mfu", "1.0")
    goal = doc["mfu_target"]
    assert goal["requested"] == 1.0 and goal["reachable"] is False
    assert goal["reached"] < goal["ceiling"] <= 1.0
    for bad in ("1.01", "0"):
        assert main(["plan", "--model", "llama2-13b", "--gpus", "64", "--mfu", bad]) == 2
        assert "(0, 1]" in capsys.readouterr().err
