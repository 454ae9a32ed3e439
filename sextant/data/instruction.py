"""Instruction data: prompt/response pairs from JSON Lines, the loss on the response only.

`[data] files = ["train.jsonl"]`, `format = "instruction"`, `prompt_field = "prompt"`,
`response_field = "response"`, `packing = false`, `tokenizer = ...` as for text.

Each record becomes one sequence: the prompt's token ids, then the response's (each encoded
as the tokenizer encodes it, no special tokens added). Position j of a row feeds token j and
is scored on token j + 1; a target that is a prompt token, or padding, is IGNORE_TARGET, which
every backend's loss leaves out: the loss is the mean over the response's tokens.

- packing = false: one record per row of seq_len + 1 tokens, cut there when longer, padded
  (input 0, target IGNORE_TARGET) when shorter.
- packing = true: the records' sequences concatenated in file order and cut into rows of
  seq_len + 1 tokens (the last, partial row dropped), so no position is padding.

Global batch i draws its B row numbers from the generator keyed by (seed, i), as text data
draws its window offsets, so it is a pure function of (data, seed, i) on every framework and
worker count. The rows are made in memory, once per process, from files whose content hashes
must match the digest the workload was resolved with (instruction sets are small: thousands
to hundreds of thousands of records).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from sextant.data import files as text_files
from sextant.core.errors import UserError
from sextant.workloads.spec import IGNORE_TARGET, Workload

FORMAT_VERSION = 1
"""Part of every digest: a change to how rows are made names a new digest."""


@dataclasses.dataclass(frozen=True, slots=True)
class Rows:
    """The rows of an instruction set: tokens (N, T + 1) int64 and, per position, whether it
    is a response token (the loss's targets)."""

    tokens: np.ndarray
    scored: np.ndarray
    records: int
    """Records read (a packed set has fewer or more rows than records)."""


def digest(workload: Workload) -> str:
    """The content hash of the files, the tokenizer, the fields and the packing."""
    spec = workload.data
    tokenizer = text_files.Tokenizer(spec.tokenizer)
    seen = text_files.survey(text_files._listed(spec.files))
    key = {"format": FORMAT_VERSION, "tokenizer": tokenizer.identity,
           "fields": [spec.prompt_field, spec.response_field], "packing": spec.packing,
           "files": [s.sha256 for s in seen]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def with_rows(workload: Workload) -> Workload:
    """The workload with data.digest filled in, after checking that the vocabulary covers the
    tokenizer's and that the set makes at least one row with a scored token."""
    spec = workload.data
    vocab = getattr(workload.model, "vocab_size", 0)
    tokenizer = text_files.Tokenizer(spec.tokenizer)
    if tokenizer.vocab_size > vocab:
        raise UserError(
            f"model.vocab_size must be at least the tokenizer's vocabulary: the data has ids "
            f"up to {tokenizer.vocab_size - 1}. Received: vocab_size={vocab}, "
            f"tokenizer={spec.tokenizer!r} ({tokenizer.vocab_size} tokens)")
    resolved = workload.replace(data=dataclasses.replace(spec, digest=digest(workload)))
    rows(resolved)
    return resolved


def _records(path: Path, prompt_field: str, response_field: str) -> list[tuple[str, str]]:
    out = []
    with text_files._open_data_file(path) as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{number} is not UTF-8 text (byte {exc.start} of "
                                f"the line)") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise UserError(f"{path}:{number} is not a JSON object: {why[:200]}") from None
            pair = []
            for key, table_key in ((prompt_field, "prompt_field"),
                                   (response_field, "response_field")):
                if not isinstance(record, dict) or key not in record:
                    keys = (sorted(record)[:20] if isinstance(record, dict)
                            else type(record).__name__)
                    raise UserError(f"{path}:{number} has no field {key!r} "
                                    f"(data.{table_key}); it has {ascii(keys)[:300]}")
                if not isinstance(record[key], str):
                    raise UserError(f"{path}:{number}: field {key!r} must be a string. "
                                    f"Received: {type(record[key]).__name__}")
                pair.append(text_files._checked(record[key], f"{path}:{number}: field {key!r}"))
            out.append((pair[0], pair[1]))
    return out


def _encode(tokenizer: text_files.Tokenizer, text: str) -> np.ndarray:
    parts = list(tokenizer.encode([text])) if text else []
    return (np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64))


def build_rows(pairs: list[tuple[np.ndarray, np.ndarray]], seq_len: int, packing: bool
               ) -> Rows:
    """Rows of seq_len + 1 tokens from (prompt ids, response ids) pairs (see the module's
    docstring): tokens, and which positions are response tokens."""
    width = seq_len + 1
    sequences = [np.concatenate([p, r]) for p, r in pairs]
    scored = [np.concatenate([np.zeros(p.size, bool), np.ones(r.size, bool)]) for p, r in pairs]
    if packing:
        stream = np.concatenate(sequences) if sequences else np.zeros(0, np.int64)
        marks = np.concatenate(scored) if scored else np.zeros(0, bool)
        n = stream.size // width
        return Rows(stream[: n * width].reshape(n, width),
                    marks[: n * width].reshape(n, width), len(pairs))
    tokens = np.zeros((len(pairs), width), np.int64)
    marks = np.zeros((len(pairs), width), bool)
    for i, (seq, mark) in enumerate(zip(sequences, scored, strict=True)):
        tokens[i, : min(seq.size, width)] = seq[:width]
        marks[i, : min(seq.size, width)] = mark[:width]
    return Rows(tokens, marks, len(pairs))


def rows(workload: Workload) -> Rows:
    """The workload's rows, made once per process from its files; refused when the files or
    the tokenizer are not the ones its digest was made from."""
    spec = workload.data
    key = (spec, workload.model.seq_len)  # type: ignore[union-attr]
    if key in _CHECKED:  # the files were hashed once in this process
        return _CHECKED[key]
    made = digest(workload)
    if spec.digest and made != spec.digest:
        raise UserError(f"the instruction data here is not what the workload was loaded with "
                        f"(digest {made}, expected {spec.digest}): give every host the same "
                        f"files")
    out = _rows(made, spec.files, spec.tokenizer, spec.prompt_field, spec.response_field,
                spec.packing, workload.model.seq_len)  # type: ignore[union-attr]
    if spec.digest:
        _CHECKED[key] = out
    return out


_CHECKED: dict[tuple[object, int], Rows] = {}


@functools.cache
def _rows(made: str, patterns: tuple[str, ...], tokenizer_spec: str, prompt_field: str,
          response_field: str, packing: bool, seq_len: int) -> Rows:
    tokenizer = text_files.Tokenizer(tokenizer_spec)
    pairs = []
    for path in text_files.matched_files(patterns):
        for prompt, response in _records(Path(path), prompt_field, response_field):
            pairs.append((_encode(tokenizer, prompt), _encode(tokenizer, response)))
    out = build_rows(pairs, seq_len, packing)
    if not out.scored[:, 1:].any():
        raise UserError(f"the instruction data ({len(pairs)} records) makes no row with a "
                        f"response token to learn from at seq_len {seq_len}"
                        + ("" if packing else " (are the prompts longer than seq_len?)"))
    return out


def batch(workload: Workload, step: int, rows_: slice) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows_` of global batch `step`: (x int64 (b, T), y int64 (b, T)), y being the
    next token where it is a response token, IGNORE_TARGET elsewhere."""
    made = rows(workload)
    rng = np.random.default_rng([workload.seed, 0xDA7A, step])
    picked = rng.integers(0, made.tokens.shape[0], size=workload.global_batch)[rows_]
    tokens, scored = made.tokens[picked], made.scored[picked]
    targets = np.where(scored[:, 1:], tokens[:, 1:], IGNORE_TARGET)
    return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(targets)
