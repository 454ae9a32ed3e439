"""Your own text files as a dataset: tokenized once into a cached, memory-mapped token file.

`[data] files = ["corpus/*.parquet"]` (also *.jsonl and *.txt), `text_field = "text"`,
`tokenizer = "path/to/tokenizer.json"` (the `tokenizers` library) or `"bytes"`.

The token file is named by a digest of the files' contents (in the sorted order of their
paths, which is the order their documents are concatenated), the tokenizer's contents and
the text field: a changed file or tokenizer names a different token file, and an unchanged
corpus is tokenized once whatever its files are called. The token file and its description
(`<digest>.json`) are each written to a temporary name and renamed into place, the
description last and recording the token count, so a token file written halfway (a killed
process, a full disk) is never used: a token file is trusted only when its description
exists and its size matches. Concurrent workers take a file lock, so one tokenizes and the
others wait for its result.

Documents are concatenated without separators: each document's token ids, as the tokenizer
encodes them with no special tokens added, then the next document's. A .txt file is one
document; each Parquet row and each JSON Lines line is one.

Batches: global batch i draws its B window offsets from the generator keyed by (seed, i),
exactly as for the bundled corpus, so it is a pure function of (data, seed, i). Rank r of N
gathers only its own B/N windows from the memory map (sextant.data.local_batch): nothing is
read whole into memory.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import glob
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sextant.errors import UserError
from sextant.fsutil import atomic_output, atomic_write_text
from sextant.workload import Workload

FORMAT_VERSION = 1
"""Part of every digest: a change to how tokens are made or stored names new token files."""
DOCS_PER_CHUNK = 1024
"""Documents tokenized (and written) at a time."""


def cache_dir() -> Path:
    """Where token files live: $SEXTANT_CACHE/tokens, else ~/.cache/sextant/tokens."""
    root = os.environ.get("SEXTANT_CACHE") or str(Path.home() / ".cache" / "sextant")
    return Path(root) / "tokens"


# --- what the data is ------------------------------------------------------------------------


def matched_files(patterns: tuple[str, ...]) -> list[Path]:
    """Every file the patterns name, sorted by path; a pattern that names none is refused."""
    found: set[Path] = set()
    for pattern in patterns:
        matches = [Path(m) for m in glob.glob(pattern, recursive=True) if Path(m).is_file()]
        if not matches:
            raise UserError(f"data.files: no file matches {pattern!r}")
        found.update(m.resolve() for m in matches)
    return sorted(found)


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise UserError(f"cannot read data file {path}: {exc.strerror}") from None
    return digest.hexdigest()


@functools.cache
def _cached_hash(path: str, size: int, mtime_ns: int) -> str:
    """One process hashes an unchanged file once (a changed file has a new size or mtime)."""
    known = _hash_index().get(path)
    if known is not None and known[:2] == [size, mtime_ns]:
        return str(known[2])
    digest = _file_hash(Path(path))
    _remember_hash(path, size, mtime_ns, digest)
    return digest


def _hash_index() -> dict[str, list[Any]]:
    """The content hashes of files seen before, by path, with the size and modification time
    they had: a large unchanged corpus is not read again by every command."""
    try:
        index = json.loads((cache_dir() / "hashes.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def _remember_hash(path: str, size: int, mtime_ns: int, digest: str) -> None:
    index = _hash_index()
    index[path] = [size, mtime_ns, digest]
    try:
        atomic_write_text(cache_dir() / "hashes.json", json.dumps(index) + "\n")
    except UserError:
        pass  # a cache that cannot be written only costs a re-read next time


def content_hash(path: Path) -> str:
    st = path.stat()
    return _cached_hash(str(path), st.st_size, st.st_mtime_ns)


class Tokenizer:
    """'bytes' or a `tokenizers` tokenizer.json: ids for a batch of documents."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._tok: Any = None
        if spec == "bytes":
            self.vocab_size, self.identity = 256, "bytes"
            return
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"data.tokenizer must be 'bytes' or an existing tokenizer.json. "
                            f"Received: {spec!r} (no such file)")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise UserError("data.tokenizer names a tokenizer.json, which needs the "
                            "tokenizers library: pip install tokenizers") from None
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception for a bad file
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"data.tokenizer {path} is not a tokenizers tokenizer.json: "
                            f"{first}") from None
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.identity = "tokenizer.json:" + content_hash(path.resolve())

    def encode(self, docs: list[str]) -> list[np.ndarray]:
        if self._tok is None:
            return [np.frombuffer(d.encode("utf-8"), dtype=np.uint8) for d in docs]
        encodings = self._tok.encode_batch(docs, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]


def _token_dtype(vocab_size: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise UserError(f"a vocabulary of {vocab_size} tokens does not fit 32-bit token ids")


def data_digest(files: list[Path], tokenizer: Tokenizer, text_field: str) -> str:
    key = {"format": FORMAT_VERSION, "tokenizer": tokenizer.identity,
           "text_field": text_field, "files": [content_hash(f) for f in files]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


# --- reading documents ------------------------------------------------------------------------


def documents(path: Path, text_field: str) -> Iterator[list[str]]:
    """The documents of one file, a chunk at a time; every problem is one UserError line."""
    suffix = path.suffix
    if suffix == ".txt":
        try:
            yield [path.read_text(encoding="utf-8")]
        except UnicodeDecodeError as exc:
            raise UserError(f"data file {path} is not UTF-8 text (byte {exc.start})") from None
    elif suffix == ".jsonl":
        yield from _jsonl_documents(path, text_field)
    elif suffix == ".parquet":
        yield from _parquet_documents(path, text_field)
    else:
        raise UserError(f"data file {path}: expected .parquet, .jsonl or .txt")


def _jsonl_documents(path: Path, text_field: str) -> Iterator[list[str]]:
    chunk: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(f"{path}:{number} is not a JSON object: {exc}") from None
            if not isinstance(record, dict) or text_field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise UserError(f"{path}:{number} has no field {text_field!r} "
                                f"(data.text_field); it has {keys}")
            text = record[text_field]
            if not isinstance(text, str):
                raise UserError(f"{path}:{number}: field {text_field!r} must be a string. "
                                f"Received: {type(text).__name__}")
            chunk.append(text)
            if len(chunk) == DOCS_PER_CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _parquet_documents(path: Path, text_field: str) -> Iterator[list[str]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("Parquet data files need pyarrow: pip install pyarrow") from None
    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"data file {path} is not a readable Parquet file: "
                        f"{str(exc).splitlines()[0]}") from None
    names = table.schema_arrow.names
    if text_field not in names:
        raise UserError(f"{path} has no column {text_field!r} (data.text_field); "
                        f"its columns: {names}")
    column_type = table.schema_arrow.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise UserError(f"{path}: column {text_field!r} must hold strings. "
                        f"Received: {column_type}")
    try:
        for batch in table.iter_batches(batch_size=DOCS_PER_CHUNK, columns=[text_field]):
            yield [t for t in batch.column(0).to_pylist() if t is not None]
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"data file {path} is a damaged Parquet file: "
                        f"{str(exc).splitlines()[0]}") from None


# --- the token file ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TokenFile:
    path: Path
    dtype: np.dtype
    tokens: int
    vocab_size: int


def _read_description(digest: str) -> TokenFile | None:
    """The token file of `digest` if it is complete, else None."""
    meta, data = cache_dir() / f"{digest}.json", cache_dir() / f"{digest}.bin"
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
        dtype = np.dtype(info["dtype"])
        tokens, vocab = int(info["tokens"]), int(info["vocab_size"])
        complete = data.stat().st_size == tokens * dtype.itemsize
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return TokenFile(data, dtype, tokens, vocab) if complete else None


def token_file(data_files: list[Path], tokenizer: Tokenizer, text_field: str,
               digest: str) -> TokenFile:
    """The complete token file of `digest`, made now unless the cache holds it."""
    found = _read_description(digest)
    if found is not None:
        return found
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f"{digest}.lock", "w")  # noqa: SIM115 - held until made
    except OSError as exc:
        raise UserError(f"cannot write the token cache {root}: {exc.strerror}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be making it: wait for it
        found = _read_description(digest)
        if found is not None:
            return found
        return _tokenize(data_files, tokenizer, text_field, digest, root)


def _tokenize(data_files: list[Path], tokenizer: Tokenizer, text_field: str, digest: str,
              root: Path) -> TokenFile:
    dtype = _token_dtype(tokenizer.vocab_size)
    total = 0
    with atomic_output(root / f"{digest}.bin") as out:
        for path in data_files:
            in_file = 0
            for chunk in documents(path, text_field):
                for ids in tokenizer.encode(chunk):
                    if ids.size and int(ids.max()) >= tokenizer.vocab_size:
                        raise UserError(f"{path}: the tokenizer produced id {ids.max()} "
                                        f"beyond its vocabulary {tokenizer.vocab_size}")
                    out.write(ids.astype(dtype).tobytes())
                    in_file += int(ids.size)
            if in_file == 0:
                raise UserError(f"data file {path} holds no text (no tokens): remove it "
                                f"or give it documents")
            total += in_file
    atomic_write_text(root / f"{digest}.json", json.dumps({
        "dtype": dtype.name, "tokens": total, "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.spec, "text_field": text_field,
        "files": [str(f) for f in data_files]}, indent=1) + "\n")
    return TokenFile(root / f"{digest}.bin", dtype, total, tokenizer.vocab_size)


# --- the workload's view ----------------------------------------------------------------------


def with_tokens(workload: Workload) -> Workload:
    """The workload with its token file made (or found) and named in data.digest, after
    checking that the model fits the data: vocabulary and context length."""
    spec = workload.data
    tokenizer = Tokenizer(spec.tokenizer)
    model = workload.model
    vocab = getattr(model, "vocab_size", 0)
    if tokenizer.vocab_size > vocab:
        raise UserError(
            f"model.vocab_size must be at least the tokenizer's vocabulary: the data has ids "
            f"up to {tokenizer.vocab_size - 1}. Received: vocab_size={vocab}, "
            f"tokenizer={spec.tokenizer!r} ({tokenizer.vocab_size} tokens)")
    files = matched_files(spec.files)
    digest = data_digest(files, tokenizer, spec.text_field)
    made = token_file(files, tokenizer, spec.text_field, digest)
    seq_len = getattr(model, "seq_len", 0)
    if seq_len + 1 >= made.tokens:
        raise UserError(f"model.seq_len must be shorter than the data ({made.tokens} tokens "
                        f"in {len(files)} files). Received: {seq_len}")
    return workload.replace(data=dataclasses.replace(spec, digest=digest))


@functools.cache
def _memmap(digest: str) -> np.memmap:
    found = _read_description(digest)
    if found is None:
        raise UserError(f"the token file {cache_dir() / digest}.bin is missing or incomplete")
    return np.memmap(found.path, dtype=found.dtype, mode="r", shape=(found.tokens,))


def tokens(workload: Workload) -> np.memmap:
    """The workload's token file, memory-mapped (read-only; pages load as windows are read).
    A process that does not find it (another host's cache) makes it from the files, and
    refuses files that are not the ones the workload was resolved with."""
    digest = workload.data.digest
    if not digest or _read_description(digest) is None:
        made = with_tokens(workload).data.digest
        if digest and made != digest:
            raise UserError(f"the data files here are not the ones the workload was loaded "
                            f"with (digest {made}, expected {digest}): give every host the "
                            f"same files")
        digest = made
    return _memmap(digest)


def windows(workload: Workload, step: int, rows: slice) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` of global batch `step`: (x int64 (b, T), y int64 (b, T)), read from the
    memory map. The offsets of all B rows come from the (seed, step) generator, so every
    rank's rows are its slice of the one global batch."""
    data = tokens(workload)
    window = workload.model.seq_len + 1  # type: ignore[union-attr]
    rng = np.random.default_rng([workload.seed, 0xDA7A, step])
    offsets = rng.integers(0, data.size - window, size=workload.global_batch)[rows]
    picked = np.asarray(data[offsets[:, None] + np.arange(window)], dtype=np.int64)
    return np.ascontiguousarray(picked[:, :-1]), np.ascontiguousarray(picked[:, 1:])
