"""Your own text files as a dataset: tokenized once into a cached, memory-mapped token file.

`[data] files = ["corpus/*.parquet"]` (also *.jsonl and *.txt), `text_field = "text"`,
`tokenizer = "path/to/tokenizer.json"` (the `tokenizers` library) or `"bytes"`.

The token file is named by a digest of the files' contents (in the sorted order of their
paths, which is the order their documents are concatenated), the tokenizer's contents and
the text field: a changed file or tokenizer names a different token file, and an unchanged
corpus is tokenized once whatever its files are called. The content hashes of files seen
before are kept in the cache's hash index with each file's identity (device, inode, size,
modification and change times), read once per process and written once per survey.

The token file and its description (`<digest>.json`, with the token file's own sha256) are
each written to a temporary name and renamed into place, the description last: a token file
is trusted only when its description exists, its size matches and its bytes hash to the
recorded sha256 (checked once per process, on the descriptor that is then memory-mapped).
While a file is tokenized its identity is checked before and after, and the bytes read are
hashed and compared with the hash the digest was made from: a file changed meanwhile, even
changed back, publishes nothing and the run names it. Every cache file is opened without
following a symbolic link and refused unless it is a regular file, and created with O_EXCL
where new, so a link planted in a shared cache points no write elsewhere. Concurrent workers
take a file lock, so one tokenizes (removing the temporary files a killed writer of that
digest left) and the others wait for its result.

Documents are concatenated without separators: each document's token ids, as the tokenizer
encodes them with no special tokens added, then the next document's. A .txt file is one
document; each Parquet row and each JSON Lines line is one. A long document is encoded in
pieces of at most PIECE_CHARS characters, cut before a space that has a non-space on each
side (where a word-level pre-tokenizer starts a word anyway), at most CHUNK_CHARS characters
at a time, and a .txt file is read a block at a time: memory does not grow with a document.

Batches: global batch i draws its B window offsets from the generator keyed by (seed, i),
exactly as for the bundled corpus, so it is a pure function of (data, seed, i). Rank r of N
gathers only its own B/N windows from the memory map (sextant.data.local_batch): nothing is
read whole into memory.
"""

from __future__ import annotations

import codecs
import dataclasses
import errno
import fcntl
import functools
import glob
import hashlib
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_output
from sextant.workloads.spec import Workload

FORMAT_VERSION = 2
"""Part of every digest: a change to how tokens are made or stored names new token files."""
DOCS_PER_CHUNK = 1024
"""Documents read (and tokenized) at a time, at most."""
CHUNK_CHARS = 1 << 20
"""Characters of text read (and tokenized) at a time, at most, beyond one document: the
tokenizer holds about 100 bytes per character it encodes at once (its per-token records)."""
PIECE_CHARS = 1 << 16
"""Characters of one piece a long document is cut into before it is encoded (at a space
between two words, so that most tokenizers make the same tokens as from the whole)."""
READ_BYTES = 1 << 20
"""Bytes read from a file at a time."""
MAX_INDEX_BYTES = 1 << 30
"""Bytes of the hash index or a token file's description (which lists every data file)
read at most: a damaged or planted one cannot exhaust memory."""
FileIdentity = tuple[int, int, int, int, int]
"""(device, inode, size, modification time, change time) in ns: any write to a file, or a
file put in its place, changes it (the change time cannot be set back by its owner)."""


def cache_dir() -> Path:
    """Where token files live: $SEXTANT_CACHE/tokens, else ~/.cache/sextant/tokens."""
    root = os.environ.get("SEXTANT_CACHE") or str(Path.home() / ".cache" / "sextant")
    return Path(root) / "tokens"


# --- cache files: never through a link, never a FIFO -------------------------------------------


def _open_cache_file(path: Path, flags: int, *, create: bool = False) -> int:
    """A descriptor of the cache file `path`, opened without following a symbolic link (a
    link planted in a shared cache would otherwise point a write at any file of this user)
    and refused unless it is a regular file; created (O_EXCL) when `create` and it is new.
    FileNotFoundError when absent and not created; UserError for a link or a non-file."""
    base = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        if create:
            try:
                fd = os.open(path, base | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                fd = os.open(path, base)
        else:
            fd = os.open(path, base)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"the token cache holds a symbolic link {path}, which sextant "
                            f"never makes; it was not followed: remove it (is "
                            f"{path.parent} shared with others?)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"the token cache holds {path}, which is not a regular file (a "
                        f"FIFO, device or socket); remove it")
    os.set_blocking(fd, True)
    return fd


def _read_cache_file(path: Path, limit: int) -> bytes | None:
    """The bytes of a small cache file, None when it is absent or larger than `limit`."""
    try:
        fd = _open_cache_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def _cache_write_error(root: Path, exc: OSError) -> UserError:
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why += " (free some space, or point SEXTANT_CACHE at a larger disk)"
    elif exc.errno == errno.EROFS:
        why += " (point SEXTANT_CACHE at a writable directory)"
    return UserError(f"cannot write the token cache {root}: {why}")


# --- what the data is ------------------------------------------------------------------------


def matched_files(patterns: tuple[str, ...]) -> list[str]:
    """Every regular file the patterns name, by its real path, sorted by path; a pattern
    that names none is refused. Strings, one lstat a file and one realpath a folder: a
    corpus of 100,000 files is listed in about a second."""
    return [path for path, _ in _listed(patterns)]


def _listed(patterns: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
    """matched_files() with each file's status as it was listed."""
    found: dict[str, os.stat_result] = {}
    real_dirs: dict[str, str] = {}
    for pattern in patterns:
        before = len(found)
        for match in glob.glob(pattern, recursive=True):
            try:
                st = os.lstat(match)
                if stat.S_ISLNK(st.st_mode):
                    match = os.path.realpath(match)
                    st = os.stat(match)
                    real = match
                else:
                    folder, name = os.path.split(match)
                    if folder not in real_dirs:
                        real_dirs[folder] = os.path.realpath(folder or ".")
                    real = os.path.join(real_dirs[folder], name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found[real] = st
        if len(found) == before and not any(
                os.path.isfile(m) for m in glob.glob(pattern, recursive=True)):
            raise UserError(f"data.files: no file matches {pattern!r}")
    return sorted(found.items(), key=lambda item: item[0].split(os.sep))


def _identity(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclasses.dataclass(frozen=True)
class Seen:
    """A data file as it was when its content hash was taken."""
    path: str
    identity: FileIdentity
    sha256: str


class _HashIndex:
    """The content hashes of files seen before, by path, with the identity they had: a large
    unchanged corpus is not read again by every command. Read once per process (per cache)
    and written at most once per survey of the files, when it learned a hash."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._entries: dict[str, Any] = {}
        self._dirty = False

    def load(self) -> None:
        """Read the index of the cache in use, unless this process has."""
        root = cache_dir()
        if root == self._root:
            return
        self._root, self._entries, self._dirty = root, {}, False
        try:
            raw = _read_cache_file(root / "hashes.json", MAX_INDEX_BYTES)
            entries = json.loads(raw) if raw is not None else {}
        except (OSError, ValueError, RecursionError, UserError):
            entries = {}  # an unreadable index only costs a re-read of the files
        if isinstance(entries, dict):
            self._entries = entries

    def get(self, path: str, identity: FileIdentity) -> str | None:
        known = self._entries.get(path)
        if (isinstance(known, list) and len(known) == 6 and known[:5] == list(identity)
                and isinstance(known[5], str)):
            return known[5]
        return None

    def put(self, path: str, identity: FileIdentity, sha256: str) -> None:
        self._entries[path] = [*identity, sha256]
        self._dirty = True

    def save(self) -> None:
        if not self._dirty or self._root is None:
            return
        self._dirty = False
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            with atomic_output(self._root / "hashes.json") as f:
                f.write(json.dumps(self._entries, separators=(",", ":")).encode())
        except OSError:
            pass  # a cache that cannot be written only costs a re-read next time

    def forget(self) -> None:
        """As a new process: only the index on disk is known."""
        self._root = None


_INDEX = _HashIndex()


def _hash_open_file(f: IO[bytes], path: Path) -> str:
    digest = hashlib.sha256()
    try:
        for block in iter(lambda: f.read(READ_BYTES), b""):
            digest.update(block)
    except OSError as exc:
        raise UserError(f"cannot read data file {path}: {exc.strerror}") from None
    return digest.hexdigest()


def _open_data_file(path: Path) -> IO[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UserError(f"cannot read data file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"data file {path} is not a regular file (a FIFO, device or socket)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _changed(path: Path, what: str) -> UserError:
    return UserError(f"data file {path} changed while {what} (its size, times, inode or "
                     f"content differ); its tokens were not kept: run again once it no "
                     f"longer changes")


def _survey_one(path: str, st: os.stat_result | None = None) -> Seen:
    try:
        identity = _identity(st if st is not None else os.stat(path))
    except OSError as exc:
        raise UserError(f"cannot read data file {path}: {exc.strerror}") from None
    known = _INDEX.get(path, identity)
    if known is not None:
        return Seen(path, identity, known)
    with _open_data_file(Path(path)) as f:
        before = _identity(os.fstat(f.fileno()))
        sha256 = _hash_open_file(f, Path(path))
        after = _identity(os.fstat(f.fileno()))
    if before != after:
        raise _changed(Path(path), "it was read")
    _INDEX.put(path, after, sha256)
    return Seen(path, after, sha256)


def survey(files: list[str] | list[tuple[str, os.stat_result]]) -> list[Seen]:
    """Each file's identity and content hash (from the index when the file is unchanged);
    `files` are paths, or (path, status as listed) pairs."""
    _INDEX.load()
    try:
        return [_survey_one(*f) if isinstance(f, tuple) else _survey_one(str(f))
                for f in files]
    finally:
        _INDEX.save()


def content_hash(path: Path) -> str:
    return survey([str(path)])[0].sha256


def reset_process_cache() -> None:
    """Forget what this process learned (as a new process would): the hash index read, the
    token files verified and mapped."""
    _INDEX.forget()
    _VERIFIED.clear()
    _memmap.cache_clear()


# --- the tokenizer, on bounded pieces ---------------------------------------------------------


def split_point(text: str, limit: int) -> int:
    """Where to cut `text` (longer than `limit`) into a piece of at most `limit` characters:
    before a space that has a non-space on each side, where a word-level pre-tokenizer starts
    a new word, so the pieces encode as the whole does; failing one in the second half of the
    piece, at `limit` (the tokens at that cut may then differ from the whole's)."""
    low = limit // 2
    at = text.rfind(" ", low, limit + 1)
    while at > low:
        if not text[at - 1].isspace() and at + 1 < len(text) and not text[at + 1].isspace():
            return at
        at = text.rfind(" ", low, at)
    return limit


def pieces(text: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    while len(text) > limit:
        cut = split_point(text, limit)
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def _words(text: str) -> list[str]:
    """`text` cut at every place split_point() may cut it."""
    cuts = [i for i in range(1, len(text) - 1) if text[i] == " "
            and not text[i - 1].isspace() and not text[i + 1].isspace()]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


SPLIT_PROBE = ("The quick brown fox, aged 12, jumped over 3 lazy dogs. Don't stop!\n"
               "Ünïcödé wörds — and 日本語 text; x=1+2  (two  spaces)\n\nA new paragraph  "
               "with\ttabs and trailing spaces   \nend.")


class Tokenizer:
    """'bytes' or a `tokenizers` tokenizer.json: ids for a list of texts, encoded in bounded
    pieces."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._tok: Any = None
        self.splits_exactly = True
        """Whether a text cut at split_point() encodes as the whole does (checked on a probe;
        'bytes' always)."""
        self._warned = False
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
        whole = self._ids([SPLIT_PROBE])
        cut = self._ids(_words(SPLIT_PROBE))
        self.splits_exactly = bool(np.array_equal(whole, cut))

    def _ids(self, texts: list[str]) -> np.ndarray:
        if self._tok is None:
            return np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8)
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings]
                              or [np.zeros(0, np.int64)])

    def encode(self, texts: list[str]) -> Iterator[np.ndarray]:
        """The ids of `texts` concatenated, a bounded batch of pieces at a time (at most
        CHUNK_CHARS characters encoded at once)."""
        batch: list[str] = []
        size = 0
        for text in texts:
            for piece in pieces(text):
                if len(piece) < len(text) and not self.splits_exactly:
                    self._warn_split()
                batch.append(piece)
                size += len(piece)
                if size >= CHUNK_CHARS:
                    yield self._ids(batch)
                    batch, size = [], 0
        if batch:
            yield self._ids(batch)

    def _warn_split(self) -> None:
        if not self._warned:
            self._warned = True
            sys.stderr.write(
                f"sextant: warning: the tokenizer {self.spec} encodes text cut between two "
                f"words differently from the whole text; documents over {PIECE_CHARS} "
                f"characters are encoded in pieces, so their tokens may differ at each cut\n")


def _token_dtype(vocab_size: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise UserError(f"a vocabulary of {vocab_size} tokens does not fit 32-bit token ids")


def data_digest(seen: list[Seen], tokenizer: Tokenizer, text_field: str) -> str:
    key = {"format": FORMAT_VERSION, "tokenizer": tokenizer.identity,
           "text_field": text_field, "files": [s.sha256 for s in seen]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


# --- reading documents ------------------------------------------------------------------------


class _Hashing(io.RawIOBase):
    """A file read through, with the sha256 of every byte read (what the tokens are made
    from is what is compared with the hash the digest was made from)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._f.read(len(buffer))
        buffer[:len(data)] = data
        self.sha256.update(data)
        return len(data)


def _checked(text: str, where: str) -> str:
    """`text`, refused when it holds a lone surrogate (JSON can spell one; it is no text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"{where} holds {ascii(text[exc.start])[1:-1]}, a lone surrogate, "
                        f"which is not text (give UTF-8 text)") from None
    return text


def documents(path: Path, text_field: str, f: IO[bytes] | None = None) -> Iterator[list[str]]:
    """The documents of one file, a bounded chunk at a time (a long .txt document in pieces),
    read from `f` (the file opened) when given; every problem is one UserError line."""
    if f is None:
        with _open_data_file(path) as opened:
            yield from documents(path, text_field, opened)
        return
    suffix = path.suffix
    if suffix == ".txt":
        yield from _text_pieces(path, f)
    elif suffix == ".jsonl":
        yield from _jsonl_documents(path, text_field, f)
    elif suffix == ".parquet":
        yield from _parquet_documents(path, text_field, f)
    else:
        raise UserError(f"data file {path}: expected .parquet, .jsonl or .txt")


def _text_pieces(path: Path, f: IO[bytes]) -> Iterator[list[str]]:
    """A .txt file, one document, as pieces cut where split_point() cuts, read a block at a
    time: memory does not grow with the file."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset, text = 0, ""
    while True:
        block = f.read(READ_BYTES)
        try:
            text += decoder.decode(block, final=not block)
        except UnicodeDecodeError as exc:
            raise UserError(f"data file {path} is not UTF-8 text (byte "
                            f"{offset + exc.start - len(decoder.getstate()[0])})") from None
        offset += len(block)
        out = []
        while len(text) > PIECE_CHARS:
            cut = split_point(text, PIECE_CHARS)
            out.append(text[:cut])
            text = text[cut:]
        if out:
            yield out
        if not block:
            break
    if text:
        yield [text]


def _jsonl_documents(path: Path, text_field: str, f: IO[bytes]) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for number, raw in enumerate(f, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}:{number} is not UTF-8 text (byte {exc.start} of the "
                            f"line)") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except RecursionError:
            raise UserError(f"{path}:{number} is not a JSON object: nested too "
                            f"deeply") from None
        except ValueError as exc:  # also integers past Python's digit limit
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"{path}:{number} is not a JSON object: {why[:200]}") from None
        if not isinstance(record, dict) or text_field not in record:
            keys = sorted(record)[:20] if isinstance(record, dict) else type(record).__name__
            raise UserError(f"{path}:{number} has no field {text_field!r} "
                            f"(data.text_field); it has {ascii(keys)[:300]}")
        text = record[text_field]
        if not isinstance(text, str):
            raise UserError(f"{path}:{number}: field {text_field!r} must be a string. "
                            f"Received: {type(text).__name__}")
        chunk.append(_checked(text, f"{path}:{number}: field {text_field!r}"))
        size += len(text)
        if len(chunk) == DOCS_PER_CHUNK or size >= CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _parquet_documents(path: Path, text_field: str, f: IO[bytes]) -> Iterator[list[str]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("Parquet data files need pyarrow: pip install pyarrow") from None
    try:
        table = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"data file {path} is not a readable Parquet file: "
                        f"{str(exc).splitlines()[0]}") from None
    names = table.schema_arrow.names
    if text_field not in names:
        raise UserError(f"{path} has no column {text_field!r} (data.text_field); "
                        f"its columns: {ascii(names)[:300]}")
    column_type = table.schema_arrow.field(text_field).type
    if pa.types.is_dictionary(column_type):  # pandas' `category`: strings, stored once each
        column_type = column_type.value_type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise UserError(f"{path}: column {text_field!r} must hold strings. "
                        f"Received: {column_type}")
    row = 0
    try:
        for batch in table.iter_batches(batch_size=DOCS_PER_CHUNK, columns=[text_field]):
            try:
                texts = batch.column(0).to_pylist()
            except UnicodeDecodeError:
                raise UserError(f"{path}: column {text_field!r} holds a value that is not "
                                f"UTF-8, in rows {row}..{row + batch.num_rows - 1}") from None
            row += batch.num_rows
            yield [t for t in texts if t is not None]
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


_VERIFIED: dict[str, FileIdentity] = {}
"""Token files whose content hash this process checked, with the identity they had then."""


def _description(digest: str) -> dict[str, Any] | None:
    try:
        raw = _read_cache_file(cache_dir() / f"{digest}.json", MAX_INDEX_BYTES)
        info = json.loads(raw) if raw is not None else None
        if not isinstance(info, dict):
            return None
        np.dtype(info["dtype"])
        int(info["tokens"]), int(info["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return info if _is_sha256(info.get("sha256")) else None


def _is_sha256(value: Any) -> bool:
    return (isinstance(value, str) and len(value) == 64
            and all(c in "0123456789abcdef" for c in value))


def _open_entry(digest: str, *, verify: bool = True) -> tuple[TokenFile, IO[bytes]] | None:
    """The token file of `digest` and the file opened, if it is complete and its bytes match
    the hash its description records; else None (with a warning when it does not match).
    Without `verify` (a worker, once the command that started it verified the file), a file
    whose identity is still the one recorded when it was written is not hashed again: any
    write to it, or a file put in its place, changes that identity."""
    info = _description(digest)
    if info is None:
        return None
    path = cache_dir() / f"{digest}.bin"
    try:
        f = os.fdopen(_open_cache_file(path, os.O_RDONLY), "rb")
    except FileNotFoundError:
        return None
    made = TokenFile(path, np.dtype(info["dtype"]), int(info["tokens"]),
                     int(info["vocab_size"]))
    identity = _identity(os.fstat(f.fileno()))
    if identity[2] != made.tokens * made.dtype.itemsize:
        f.close()
        return None
    unchanged = not verify and info.get("identity") == list(identity)
    if _VERIFIED.get(digest) != identity and not unchanged:
        if _hash_open_file(f, path) != info["sha256"]:
            f.close()
            sys.stderr.write(f"sextant: warning: token file {path} does not match the hash "
                             f"its description records (damaged or changed); made again\n")
            return None
        _VERIFIED[digest] = identity
    f.seek(0)
    return made, f


def _read_description(digest: str, *, verify: bool = True) -> TokenFile | None:
    """The token file of `digest` if it is complete and intact, else None."""
    opened = _open_entry(digest, verify=verify)
    if opened is None:
        return None
    opened[1].close()
    return opened[0]


def token_file(seen: list[Seen], tokenizer: Tokenizer, text_field: str,
               digest: str) -> TokenFile:
    """The complete token file of `digest`, made now unless the cache holds it."""
    found = _read_description(digest)
    if found is not None:
        return found
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = os.fdopen(_open_cache_file(root / f"{digest}.lock", os.O_RDWR, create=True),
                         "r+b")
    except OSError as exc:
        raise _cache_write_error(root, exc) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be making it: wait for it
        found = _read_description(digest)
        if found is not None:
            return found
        _remove_stale_temporaries(root, digest)
        try:
            return _tokenize(seen, tokenizer, text_field, digest, root)
        except OSError as exc:
            raise _cache_write_error(root, exc) from None


def _remove_stale_temporaries(root: Path, digest: str) -> None:
    """Temporary files of `digest` left by a killed writer: only the lock holder writes
    them, so any there now are dead."""
    try:
        names = [e.name for e in os.scandir(root)
                 if e.name.startswith(f".{digest}.") and e.name.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        try:
            os.unlink(root / name)  # a link is removed, never followed
        except OSError:
            pass


def _tokenize_file(out: IO[bytes], sha: Any, one: Seen, tokenizer: Tokenizer,
                   text_field: str, dtype: np.dtype) -> int:
    """Write the tokens of one data file; its identity is checked before and after, and
    the bytes read are the ones whose hash the digest was made from."""
    path = Path(one.path)
    with _open_data_file(path) as f:
        if _identity(os.fstat(f.fileno())) != one.identity:
            raise _changed(path, "its hash was taken")
        hashing = _Hashing(f)
        # Parquet is read out of order (its footer first), from the file itself.
        reader: IO[bytes] = f if path.suffix == ".parquet" else io.BufferedReader(
            hashing, READ_BYTES)
        count = 0
        for chunk in documents(path, text_field, reader):
            for ids in tokenizer.encode(chunk):
                if ids.size and int(ids.max()) >= tokenizer.vocab_size:
                    raise UserError(f"{path}: the tokenizer produced id {ids.max()} "
                                    f"beyond its vocabulary {tokenizer.vocab_size}")
                data = ids.astype(dtype).tobytes()
                out.write(data)
                sha.update(data)
                count += int(ids.size)
        after = _identity(os.fstat(f.fileno()))
    try:
        now = _identity(os.stat(path))
    except OSError:
        now = None
    # A Parquet file's identity before and after stands for its content (any write changes
    # its change time); text and JSON Lines are also compared byte for byte.
    read_all = path.suffix == ".parquet" or hashing.sha256.hexdigest() == one.sha256
    if not (after == now == one.identity and read_all):
        raise _changed(path, "it was tokenized")
    if count == 0:
        raise UserError(f"data file {path} holds no text (no tokens): remove it "
                        f"or give it documents")
    return count


def _tokenize(seen: list[Seen], tokenizer: Tokenizer, text_field: str, digest: str,
              root: Path) -> TokenFile:
    dtype = _token_dtype(tokenizer.vocab_size)
    total = 0
    sha = hashlib.sha256()
    with atomic_output(root / f"{digest}.bin") as out:
        for one in seen:
            total += _tokenize_file(out, sha, one, tokenizer, text_field, dtype)
    # The identity the token file has now, as written: a worker finding it unchanged need
    # not hash it again (the command that starts the workers verifies it in full).
    identity = _identity(os.stat(root / f"{digest}.bin"))
    description = json.dumps({
        "dtype": dtype.name, "tokens": total, "vocab_size": tokenizer.vocab_size,
        "sha256": sha.hexdigest(), "identity": list(identity), "tokenizer": tokenizer.spec,
        "text_field": text_field, "files": [s.path for s in seen]}, indent=1) + "\n"
    with atomic_output(root / f"{digest}.json") as f:
        f.write(description.encode("utf-8"))
    _VERIFIED[digest] = identity
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
    files = _listed(spec.files)
    seen = survey(files)
    digest = data_digest(seen, tokenizer, spec.text_field)
    made = token_file(seen, tokenizer, spec.text_field, digest)
    seq_len = getattr(model, "seq_len", 0)
    if seq_len + 1 >= made.tokens:
        raise UserError(f"model.seq_len must be shorter than the data ({made.tokens} tokens "
                        f"in {len(files)} files). Received: {seq_len}")
    return workload.replace(data=dataclasses.replace(spec, digest=digest))


@functools.cache
def _memmap(digest: str) -> np.memmap:
    """The token file mapped from the very descriptor whose bytes were checked against the
    description's hash."""
    opened = _open_entry(digest, verify=False)
    if opened is None:
        raise UserError(f"the token file {cache_dir() / digest}.bin is missing, incomplete "
                        f"or damaged")
    found, f = opened
    with f:
        return np.memmap(f, dtype=found.dtype, mode="r", shape=(found.tokens,))


def tokens(workload: Workload) -> np.memmap:
    """The workload's token file, memory-mapped (read-only; pages load as windows are read).
    A process that does not find it (another host's cache) makes it from the files, and
    refuses files that are not the ones the workload was resolved with."""
    digest = workload.data.digest
    if not digest or _read_description(digest, verify=False) is None:
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
    rank's rows are its slice of the one global batch. Instruction data's rows come from
    sextant.data.instruction."""
    if workload.data.instruction:
        from sextant.data import instruction

        return instruction.batch(workload, step, rows)
    data = tokens(workload)
    window = workload.model.seq_len + 1  # type: ignore[union-attr]
    rng = np.random.default_rng([workload.seed, 0xDA7A, step])
    offsets = rng.integers(0, data.size - window, size=workload.global_batch)[rows]
    picked = np.asarray(data[offsets[:, None] + np.arange(window)], dtype=np.int64)
    return np.ascontiguousarray(picked[:, :-1]), np.ascontiguousarray(picked[:, 1:])
