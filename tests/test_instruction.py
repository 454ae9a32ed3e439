"""Instruction data: prompt/response JSON Lines, the loss on the response tokens only, with
and without packing; global batch i the same on every framework and worker count."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sextant import data
from sextant.data import files, instruction
from sextant.core.errors import UserError
from sextant.runner import check_workload_fits, execute
from sextant.sources import resolve_workload
from sextant.strategy import Strategy
from sextant.workloads.spec import IGNORE_TARGET, Workload
from tests.helpers import needs_torch, same_training

PAIRS = [
    ("What does len() return?", "The number of items in a container."),
    ("Name Python's immutable sequence types.", "str, tuple and bytes."),
    ("How is a dict ordered?", "By insertion."),
    ("What does `pass` do?", "Nothing: it is a placeholder statement."),
    ("What is PEP 8?", "The style guide for Python code."),
    ("Which keyword defines a generator?", "yield"),
    ("How do you open a file for appending?", "open(path, 'a')"),
    ("What is the result of 7 // 2?", "3, floor division."),
    ("What does `is` compare?", "Object identity, not equality."),
    ("How do you copy a list?", "lst.copy() or lst[:] for a shallow copy."),
    ("What raises StopIteration?", "A call to next() on an exhausted iterator."),
    ("What are f-strings?", "String literals prefixed with f that format expressions in braces."),
]
SEQ_LEN = 48


@pytest.fixture(autouse=True)
def token_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEXTANT_CACHE", str(tmp_path / "cache"))
    files.reset_process_cache()


def instruction_workload(folder: Path, *, packing: bool = False, fields: tuple[str, str] = (
        "prompt", "response"), extra: str = "", steps: int = 4) -> Path:
    with (folder / "train.jsonl").open("w") as f:
        for prompt, response in PAIRS:
            f.write(json.dumps({fields[0]: prompt, fields[1]: response, "id": 1}) + "\n")
    named = "" if fields == ("prompt", "response") else (
        f'prompt_field = "{fields[0]}"\nresponse_field = "{fields[1]}"\n')
    path = folder / "sft.toml"
    path.write_text(f"""name = "sft"
steps = {steps}
global_batch = 4
[model]
family = "llama"
seq_len = {SEQ_LEN}
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
d_ff = 64
[data]
files = ["train.jsonl"]
format = "instruction"
packing = {str(packing).lower()}
{named}{extra}
[measure]
warmup_steps = 1
nosync_steps = 0
log_every = 2
""")
    return path


def _ids(text: str) -> list[int]:
    return list(text.encode())


def test_rows_score_the_response_only_and_batches_are_the_same_for_every_worker_count(
        tmp_path: Path) -> None:
    w = resolve_workload(instruction_workload(tmp_path, fields=("question", "answer")))
    assert w.data.instruction and w.data.digest
    made = instruction.rows(w)
    assert made.tokens.shape == (len(PAIRS), SEQ_LEN + 1)
    for row, (prompt, response) in enumerate(PAIRS):
        sequence = (_ids(prompt) + _ids(response))[: SEQ_LEN + 1]
        assert made.tokens[row, : len(sequence)].tolist() == sequence
        assert made.scored[row].tolist() == ([False] * len(_ids(prompt))
                                             + [True] * len(_ids(response))
                                             + [False] * SEQ_LEN)[: SEQ_LEN + 1]
    x, y = data.global_batch(w, 3)
    again = data.global_batch(w, 3)
    assert np.array_equal(x, again[0]) and np.array_equal(y, again[1])
    # Targets are the next token where it is a response token, IGNORE_TARGET elsewhere
    # (the prompt's own next tokens, and the padding).
    scored = y != IGNORE_TARGET
    assert scored.any() and (~scored).any()
    full = np.concatenate([x[:, :1], np.where(scored, y, 0)], axis=1)
    assert np.array_equal(full[:, 1:][scored], y[scored])
    for world in (2, 4):
        parts = [data.local_batch(w, 3, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate([p[0] for p in parts]), x)
        assert np.array_equal(np.concatenate([p[1] for p in parts]), y)


def test_packing_fills_every_row(tmp_path: Path) -> None:
    w = resolve_workload(instruction_workload(tmp_path, packing=True))
    made = instruction.rows(w)
    stream = [t for p, r in PAIRS for t in _ids(p) + _ids(r)]
    assert made.tokens.shape == (len(stream) // (SEQ_LEN + 1), SEQ_LEN + 1)
    assert made.tokens.reshape(-1).tolist() == stream[: made.tokens.size]
    # Packing on and off are different data, hence different workloads.
    off = resolve_workload(instruction_workload(tmp_path, packing=False))
    assert off.content_hash() != w.content_hash()
    x, y = data.global_batch(w, 0)
    assert x.shape == (4, SEQ_LEN) and (y == IGNORE_TARGET).sum() < y.size


def test_the_loss_is_the_mean_over_response_tokens(tmp_path: Path) -> None:
    """The loss every backend trains on, checked against a hand-computed masked mean over
    logits (JAX's forward; torch's cross_entropy with its default ignore_index is the same
    definition, which the parity run below holds the backends to)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from sextant.backends.jax_backend import model as jm
    from sextant.pretrained.weights import initial_params

    w = resolve_workload(instruction_workload(tmp_path))
    params = {k: jnp.asarray(v) for k, v in initial_params(w).items()}
    x, y = data.global_batch(w, 0)
    logits = np.asarray(jm.model_logits(w.model, params, jnp.asarray(x)), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    kept = y != IGNORE_TARGET
    nll = -np.take_along_axis(logp, np.where(kept, y, 0)[..., None], -1)[..., 0]
    masked = nll[kept].mean()
    loss = float(jm.loss_fn(w.model, params, jnp.asarray(x), jnp.asarray(y)))
    assert loss == pytest.approx(masked, rel=1e-6)
    assert abs(loss - nll.mean()) > 1e-3  # the prompt and padding really are left out
    # A prompt's own next tokens are no targets: changing what they would be changes nothing.
    other = np.where(kept, y, IGNORE_TARGET)
    assert float(jm.loss_fn(w.model, params, jnp.asarray(x), jnp.asarray(other))) == loss


@pytest.mark.parametrize(("extra", "message"), [
    ('packing = "yes"\n', r"data.packing must be true or false"),
    ('format = "chat"\n', r"data.format must be one of \['text', 'instruction'\]"),
])
def test_bad_instruction_tables_are_one_line(tmp_path: Path, extra: str, message: str) -> None:
    path = instruction_workload(tmp_path)
    path.write_text(path.read_text().replace('format = "instruction"\npacking = false\n', extra
                                             + ('format = "instruction"\n'
                                                if "format" not in extra else "")))
    with pytest.raises(UserError, match=message) as caught:
        resolve_workload(path)
    assert "\n" not in str(caught.value)


def test_refusals_name_what_is_wrong(tmp_path: Path) -> None:
    path = instruction_workload(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('format = "instruction"\npacking = false\n', 'packing = true\n'))
    with pytest.raises(UserError, match=r"data.packing is for data.format = 'instruction'"):
        resolve_workload(path)
    path.write_text(text.replace('packing = false\n', 'response_field = "answer"\n'))
    with pytest.raises(UserError, match=r"train.jsonl:1 has no field 'answer' "
                                        r"\(data.response_field\)"):
        resolve_workload(path)
    w: Workload = resolve_workload(instruction_workload(tmp_path))
    with pytest.raises(UserError, match=r"runs with --parallel single and no --grad-accum"):
        check_workload_fits(w, Strategy(framework="torch", parallel="dp", workers=2))
    with pytest.raises(UserError, match=r"paddle's model code has no loss that leaves prompt "
                                        r"tokens out .* Frameworks that have it: torch"):
        check_workload_fits(w, Strategy(framework="paddle"))
    # The rows are checked against the digest the workload was resolved with.
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n")
    instruction._CHECKED.clear()
    with pytest.raises(UserError, match=r"not what the workload was loaded with"):
        instruction.rows(w)


@needs_torch
@pytest.mark.slow
def test_frameworks_train_alike_on_instruction_data(tmp_path: Path) -> None:
    """torch and JAX on packed instruction data: the same losses and gradient norms (the
    masked mean is written once per backend; TensorFlow's, Keras' and MLX's share JAX's
    form, and the loss test above pins its value)."""
    w = resolve_workload(instruction_workload(tmp_path, packing=True))
    runs = {f: execute(w, Strategy(framework=f), runs_dir=Path(tempfile.mkdtemp()))
            for f in ("torch", "jax") if importlib.util.find_spec(f)}
    assert runs["torch"].losses[-1] < runs["torch"].losses[0]
    for f, run in runs.items():
        assert np.isfinite(run.losses).all(), f
        same_training(run, runs["torch"])
