"""Your own text files as a dataset: real Parquet, JSON Lines and text files and a real
tokenizer.json, made here from the bundled corpus."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sextant import data
from sextant.data import files
from sextant.core.errors import UserError
from sextant.workloads.spec import Workload
from sextant.sources import resolve_workload
from tests.helpers import needs_torch, run_cli, same_training

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 320


@pytest.fixture(autouse=True)
def token_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEXTANT_CACHE", str(cache))
    files.reset_process_cache()
    return cache / "tokens"


def corpus_documents(n: int = 200) -> list[str]:
    text = data.text_tokens().tobytes().decode("utf-8", errors="replace")
    paragraphs = [p for p in text.split("\n\n") if len(p) > 200]
    return paragraphs[:n]


def make_tokenizer(path: Path, docs: list[str], vocab: int = VOCAB) -> Path:
    """A byte-level BPE tokenizer.json trained on `docs` with the tokenizers library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(str(path))
    return path


def write_parquet(path: Path, docs: list[str], field: str = "text") -> Path:
    pq.write_table(pa.table({field: pa.array(docs, pa.string()),
                             "id": pa.array(range(len(docs)), pa.int64())}), path)
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def workload_file(folder: Path, data_table: str, *, vocab: int = VOCAB, seq_len: int = 32,
                  global_batch: int = 8, steps: int = 6) -> Path:
    path = folder / "w.toml"
    path.write_text(f"""name = "own-data"
steps = {steps}
global_batch = {global_batch}
[model]
family = "llama"
vocab_size = {vocab}
seq_len = {seq_len}
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
d_ff = 64
[data]
{data_table}
[measure]
warmup_steps = 1
nosync_steps = 0
log_every = 2
""")
    return path


@pytest.fixture
def parquet_corpus(tmp_path: Path) -> Path:
    docs = corpus_documents()
    (tmp_path / "corpus").mkdir()
    write_parquet(tmp_path / "corpus" / "a.parquet", docs[:120])
    write_parquet(tmp_path / "corpus" / "b.parquet", docs[120:])
    make_tokenizer(tmp_path / "tokenizer.json", docs)
    return workload_file(tmp_path, 'files = ["corpus/*.parquet"]\ntokenizer = "tokenizer.json"')


def test_parquet_jsonl_and_text_make_the_same_tokens(tmp_path: Path) -> None:
    docs = corpus_documents(40)
    write_parquet(tmp_path / "c.parquet", docs)
    write_jsonl(tmp_path / "c.jsonl", docs)
    (tmp_path / "c.txt").write_text("".join(docs))
    make_tokenizer(tmp_path / "tok.json", docs)
    made = {}
    for kind in ("parquet", "jsonl", "txt"):
        for tokenizer in ("bytes", "tok.json"):
            w = resolve_workload(workload_file(
                tmp_path, f'files = ["c.{kind}"]\ntokenizer = "{tokenizer}"'))
            made[kind, tokenizer] = np.array(files.tokens(w))
    # Documents are concatenated without separators: byte-level, the three files hold the
    # same bytes; a BPE tokenizer may merge across a .txt file's document boundaries.
    assert np.array_equal(made["parquet", "bytes"], made["jsonl", "bytes"])
    assert np.array_equal(made["parquet", "bytes"], made["txt", "bytes"])
    assert made["parquet", "bytes"].tobytes() == "".join(docs).encode()
    assert np.array_equal(made["parquet", "tok.json"], made["jsonl", "tok.json"])
    assert made["parquet", "tok.json"].size < made["parquet", "bytes"].size / 1.3
    assert made["parquet", "tok.json"].max() < VOCAB


def test_batches_are_identical_for_every_worker_count(parquet_corpus: Path) -> None:
    w = resolve_workload(parquet_corpus)
    for step in (0, 3, 17):
        x, y = data.global_batch(w, step)
        assert x.shape == y.shape == (8, 32) and x.dtype == np.int64
        assert np.array_equal(x[:, 1:], y[:, :-1])
        for world in (1, 2, 4, 8):
            parts = [data.local_batch(w, step, r, world) for r in range(world)]
            assert np.array_equal(np.concatenate([p[0] for p in parts]), x)
            assert np.array_equal(np.concatenate([p[1] for p in parts]), y)
    # A pure function of (data, seed, step): another seed, other windows.
    other = data.global_batch(w.replace(seed=1), 0)[0]
    assert not np.array_equal(other, data.global_batch(w, 0)[0])


def test_tokenized_once_and_a_changed_file_invalidates(parquet_corpus: Path,
                                                       token_cache: Path) -> None:
    w1 = resolve_workload(parquet_corpus)
    token_path = token_cache / f"{w1.data.digest}.bin"
    made_at = token_path.stat().st_mtime_ns
    assert resolve_workload(parquet_corpus).data.digest == w1.data.digest
    assert token_path.stat().st_mtime_ns == made_at  # reused, not remade
    # Identity of the workload follows the data: a changed file is a different workload.
    b = parquet_corpus.parent / "corpus" / "b.parquet"
    write_parquet(b, corpus_documents()[120:] + ["one more document " * 20])
    w2 = resolve_workload(parquet_corpus)
    assert w2.data.digest != w1.data.digest
    assert w2.content_hash() != w1.content_hash()
    assert files.tokens(w2).size > files.tokens(w1).size
    # So is another tokenizer.
    w3 = resolve_workload(workload_file(
        parquet_corpus.parent, 'files = ["corpus/*.parquet"]\ntokenizer = "bytes"'))
    assert w3.data.digest not in (w1.data.digest, w2.data.digest)


def test_a_half_written_token_file_is_never_used(parquet_corpus: Path,
                                                 token_cache: Path) -> None:
    w = resolve_workload(parquet_corpus)
    good = np.array(files.tokens(w))
    token_path = token_cache / f"{w.data.digest}.bin"
    token_path.write_bytes(token_path.read_bytes()[: good.nbytes // 2])  # cut short
    (token_cache / f".{w.data.digest}.x.tmp").write_bytes(b"\0" * 10)  # a dead writer's
    files._memmap.cache_clear()
    again = resolve_workload(parquet_corpus)
    assert again.data.digest == w.data.digest
    assert np.array_equal(np.array(files.tokens(again)), good)
    # No description, no token file: made again rather than trusted.
    (token_cache / f"{w.data.digest}.json").unlink()
    files._memmap.cache_clear()
    assert np.array_equal(np.array(files.tokens(resolve_workload(parquet_corpus))), good)


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: write_parquet(d / "c.parquet", ["x " * 50], field="body"),
     r"has no column 'text' \(data.text_field\); its columns: \['body', 'id'\]"),
    (lambda d: write_jsonl(d / "c.jsonl", ["x " * 50], field="body"),
     r"c.jsonl:1 has no field 'text' \(data.text_field\); it has \['body', 'id'\]"),
    (lambda d: (d / "c.txt").write_text(""), r"c.txt holds no text \(no tokens\)"),
    (lambda d: write_parquet(d / "c.parquet", []), r"c.parquet holds no text"),
    (lambda d: (d / "c.parquet").write_bytes(b"PAR1 this is not parquet at all PAR1"),
     r"c.parquet is not a readable Parquet file"),
    (lambda d: (d / "c.jsonl").write_text('{"text": "ok"}\nnot json\n'),
     r"c.jsonl:2 is not a JSON object"),
    (lambda d: (d / "c.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n'),
     r"c.jsonl:2 is not UTF-8 text \(byte 10 of the line\)"),
    (lambda d: (d / "c.jsonl").write_text('{"text": "a \\ud800 b"}\n'),
     r"c.jsonl:1: field 'text' holds \\ud800, a lone surrogate, which is not text"),
    (lambda d: (d / "c.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n"),
     r"c.jsonl:1 is not a JSON object: nested too deeply"),
    (lambda d: (d / "c.txt").write_bytes(b"good text " * 10 + b"\xc3\x28"),
     r"c.txt is not UTF-8 text \(byte 100\)"),
    (lambda d: pq.write_table(pa.table({"text": pa.array(
        [b"fine", b"bad \xff"], pa.binary()).view(pa.string())}), d / "c.parquet"),
     r"c.parquet: column 'text' holds a value that is not UTF-8, in rows 0..1"),
])
def test_bad_files_are_refused_in_one_line(tmp_path: Path, make, message: str) -> None:
    made = make(tmp_path)
    name = made.name if isinstance(made, Path) else next(tmp_path.glob("c.*")).name
    path = workload_file(tmp_path, f'files = ["{name}"]')
    with pytest.raises(UserError, match=message) as caught:
        resolve_workload(path)
    assert "\n" not in str(caught.value)
    assert not list((tmp_path / "cache" / "tokens").glob("*.bin"))  # nothing half-made kept


def test_refusals_for_vocabulary_patterns_and_context(tmp_path: Path) -> None:
    docs = corpus_documents(20)
    write_parquet(tmp_path / "c.parquet", docs)
    make_tokenizer(tmp_path / "tok.json", docs, vocab=400)
    with pytest.raises(UserError, match=r"model.vocab_size must be at least the tokenizer's "
                       r"vocabulary.*vocab_size=320, tokenizer=.*tok.json' \(400 tokens\)"):
        resolve_workload(workload_file(tmp_path, 'files = ["c.parquet"]\ntokenizer = '
                                                 '"tok.json"'))
    with pytest.raises(UserError, match=r"model.vocab_size must be at least the tokenizer's"):
        resolve_workload(workload_file(tmp_path, 'files = ["c.parquet"]', vocab=200))
    with pytest.raises(UserError, match=r"no file matches .*nothing\*.parquet"):
        resolve_workload(workload_file(tmp_path, 'files = ["nothing*.parquet"]'))
    with pytest.raises(UserError, match=r"patterns must end in one of"):
        resolve_workload(workload_file(tmp_path, 'files = ["c.csv"]'))
    with pytest.raises(UserError, match=r"either dataset .* or files"):
        resolve_workload(workload_file(tmp_path, 'files = ["c.parquet"]\n'
                                                 'dataset = "python-reference"'))
    with pytest.raises(UserError, match=r"not a tokenizers tokenizer.json"):
        (tmp_path / "bad.json").write_text("{}")
        resolve_workload(workload_file(tmp_path, 'files = ["c.parquet"]\ntokenizer = '
                                                 '"bad.json"'))
    (tmp_path / "short.txt").write_text("tiny")
    with pytest.raises(UserError, match=r"model.seq_len must be shorter than the data "
                                        r"\(4 tokens in 1 files\)"):
        resolve_workload(workload_file(tmp_path, 'files = ["short.txt"]'))


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "c.parquet").write_bytes(b"garbage")
    path = workload_file(tmp_path, 'files = ["c.parquet"]')
    result = run_cli("run", "--workload", str(path), "--framework", "torch",
                     "--db", str(tmp_path / "r.db"),
                     env={"SEXTANT_CACHE": str(tmp_path / "cache")}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "is not a readable Parquet file" in result.stderr


@needs_torch
@pytest.mark.slow
def test_torch_and_jax_train_alike_on_parquet_with_a_tokenizer(parquet_corpus: Path) -> None:
    """A real run from Parquet files through a tokenizer.json: torch, torch dp x2 and JAX
    train the same numbers (losses and global gradient norms at every step)."""
    import importlib.util

    from sextant.runner import execute
    from sextant.strategy import Strategy

    w: Workload = resolve_workload(parquet_corpus)
    run = lambda s: execute(w, s, runs_dir=Path(tempfile.mkdtemp()))  # noqa: E731
    torch_run = run(Strategy(framework="torch", mode="eager"))
    # Starts near ln(vocab) with 0.02-scaled weights, and learns.
    assert torch_run.losses[0] == pytest.approx(np.log(VOCAB), rel=0.03)
    assert torch_run.losses[-1] < torch_run.losses[0]
    same_training(run(Strategy(framework="torch", mode="eager", parallel="dp", workers=2)),
                  torch_run)
    if importlib.util.find_spec("jax") is not None:
        same_training(run(Strategy(framework="jax", mode="compiled")), torch_run)


def test_bundled_workloads_keep_their_identity() -> None:
    """The bundled dataset's workloads hash as they did before [data] took files."""
    w = resolve_workload("llama-tiny")
    assert w.to_dict()["data"] == {"dataset": "python-reference"}
    assert dataclasses.replace(w.data).files == ()


def test_the_pipeline_probe_times_the_reader(parquet_corpus: Path) -> None:
    from sextant.data.probe import pipeline_throughput

    w = resolve_workload(parquet_corpus)
    fast = pipeline_throughput(w, 2, batches=10)
    slow = pipeline_throughput(w, 2, batches=10, fault="slow-reader-20")
    assert fast["tokens_per_batch"] == slow["tokens_per_batch"] == 4 * 32
    assert slow["seconds_per_batch"] >= 0.020
    assert fast["tokens_per_s"] > 2 * slow["tokens_per_s"]


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "slow-reader-40"])
def test_loader_check_fires_on_a_slow_reader_only(parquet_corpus: Path, tmp_path: Path,
                                                  fault: str | None) -> None:
    """`sextant check`'s loader check on a real dp x2 run over Parquet files: quiet with the
    memory-mapped reader, a bottleneck (with the figures) when every read takes 40 ms."""
    from sextant.checks import PASS, WARN
    from sextant.checks.suite import CheckOptions, run_checks

    result, = run_checks(CheckOptions(
        workload=resolve_workload(parquet_corpus), framework="torch", workers=2, threads=1,
        steps=8, only=("loader",), runs_dir=tmp_path / "runs",
        extra_env={"SEXTANT_TEST_FAULT": fault} if fault else {}))
    pipeline = result.details["pipeline"]
    if fault is None:
        assert result.status == PASS, result.summary
        assert pipeline["tokens_per_s"] > pipeline["needed_tokens_per_s"]
    else:
        assert result.status == WARN, result.summary
        assert pipeline["tokens_per_s"] < pipeline["needed_tokens_per_s"]
        assert "the reader alone delivers" in result.summary
        assert result.summary.startswith("data loader bottleneck")


def test_unchanged_files_are_not_read_again(parquet_corpus: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    w = resolve_workload(parquet_corpus)
    files.reset_process_cache()  # a new process: only the cache's hash index is left
    read: list[Path] = []
    real = files._hash_open_file
    monkeypatch.setattr(files, "_hash_open_file",
                        lambda f, p: (p.suffix == ".parquet" and read.append(p)) or real(f, p))
    assert resolve_workload(parquet_corpus).data.digest == w.data.digest
    assert read == []
    a = parquet_corpus.parent / "corpus" / "a.parquet"
    a.write_bytes(a.read_bytes())  # same content, new modification and change times
    files.reset_process_cache()
    assert resolve_workload(parquet_corpus).data.digest == w.data.digest
    assert read == [a.resolve()]


def test_a_worker_without_the_token_file_makes_it_or_refuses_other_files(
        parquet_corpus: Path, token_cache: Path) -> None:
    w = resolve_workload(parquet_corpus)
    good = np.array(files.tokens(w))
    for made in token_cache.glob(f"{w.data.digest}.*"):  # another host's empty cache
        made.unlink()
    files._memmap.cache_clear()
    assert np.array_equal(np.array(files.tokens(w)), good)
    for made in token_cache.glob(f"{w.data.digest}.*"):
        made.unlink()
    files._memmap.cache_clear()
    write_parquet(parquet_corpus.parent / "corpus" / "a.parquet", ["other text " * 40])
    with pytest.raises(UserError, match=r"not the ones the workload was loaded with"):
        files.tokens(w)


# --- the cache under change and attack -------------------------------------------------------

TEXT_WORKLOAD = 'files = ["doc.txt"]\ntokenizer = "bytes"'


def _text_corpus(tmp_path: Path, size: int = 4000) -> tuple[Path, bytes]:
    text = "\n\n".join(corpus_documents())
    body = text.encode("utf-8")[:size].decode("utf-8", errors="ignore").encode("utf-8")
    (tmp_path / "doc.txt").write_bytes(body)
    return workload_file(tmp_path, TEXT_WORKLOAD, vocab=256), body


def test_a_file_changed_and_restored_while_tokenized_is_not_kept(
        tmp_path: Path, token_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer swaps the file's content after its hash is taken and puts it back
    (modification time too) while it is tokenized: the run names the file and publishes
    nothing; the next run makes the tokens of the true content."""
    path, body = _text_corpus(tmp_path)
    doc = tmp_path / "doc.txt"
    stamp = doc.stat().st_mtime_ns
    monkeypatch.setattr(files, "READ_BYTES", 512)
    monkeypatch.setattr(files, "PIECE_CHARS", 200)
    real, calls = files.Tokenizer.encode, []

    def meddling(self: files.Tokenizer, texts: list[str]):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            doc.write_bytes(b"x" * len(body))
            os.utime(doc, ns=(stamp, stamp))
        elif len(calls) == 3:
            doc.write_bytes(body)
            os.utime(doc, ns=(stamp, stamp))
        return real(self, texts)

    monkeypatch.setattr(files.Tokenizer, "encode", meddling)
    with pytest.raises(UserError, match=r"doc.txt changed while it was tokenized") as caught:
        resolve_workload(path)
    assert "\n" not in str(caught.value)
    assert not list(token_cache.glob("*.bin"))
    assert [p.name for p in token_cache.glob("*.json")] == ["hashes.json"]
    assert not list(token_cache.glob(".*.tmp"))
    monkeypatch.setattr(files.Tokenizer, "encode", real)
    files.reset_process_cache()
    w = resolve_workload(path)
    assert np.array(files.tokens(w)).tobytes() == body


def test_a_planted_link_in_the_cache_leaves_its_target_untouched(tmp_path: Path,
                                                                 token_cache: Path) -> None:
    path, body = _text_corpus(tmp_path)
    seen = files.survey(files.matched_files((str(tmp_path / "doc.txt"),)))
    digest = files.data_digest(seen, files.Tokenizer("bytes"), "text")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    token_cache.mkdir(parents=True, exist_ok=True)
    (token_cache / f"{digest}.lock").symlink_to(victim)
    files.reset_process_cache()
    with pytest.raises(UserError, match=r"holds a symbolic link .*\.lock, which sextant never "
                                        r"makes; it was not followed"):
        resolve_workload(path)
    assert victim.read_text() == "precious\n"
    (token_cache / f"{digest}.lock").unlink()
    # The hash index: read through no link, and replaced (never written through) by a file.
    (token_cache / "hashes.json").unlink()
    (token_cache / "hashes.json").symlink_to(victim)
    files.reset_process_cache()
    (tmp_path / "doc.txt").write_bytes(body)  # a new change time: its hash is learned again
    w = resolve_workload(path)
    assert victim.read_text() == "precious\n"
    assert not (token_cache / "hashes.json").is_symlink()
    assert np.array(files.tokens(w)).tobytes() == body
    # A link in place of a token file is refused, not read.
    (token_cache / f"{digest}.bin").unlink()
    (token_cache / f"{digest}.bin").symlink_to(victim)
    files.reset_process_cache()
    with pytest.raises(UserError, match=r"symbolic link .*\.bin"):
        resolve_workload(path)


def test_a_token_file_that_does_not_match_its_hash_is_made_again(
        tmp_path: Path, token_cache: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path, body = _text_corpus(tmp_path)
    w = resolve_workload(path)
    bin_path = token_cache / f"{w.data.digest}.bin"
    poisoned = bytearray(bin_path.read_bytes())
    poisoned[10] ^= 0xFF  # same size: only the content hash can tell
    bin_path.write_bytes(bytes(poisoned))
    files.reset_process_cache()
    w = resolve_workload(path)
    assert "does not match the hash its description records" in capfd.readouterr().err
    assert np.array(files.tokens(w)).tobytes() == body


def test_the_hash_index_is_read_once_and_written_once(tmp_path: Path, token_cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(200):
        (folder / f"{i:03d}.txt").write_text(f"document number {i} " * 5)
    path = workload_file(tmp_path, 'files = ["many/*.txt"]\ntokenizer = "bytes"', vocab=256)
    reads: list[str] = []
    writes: list[str] = []
    real_read, real_output = files._read_cache_file, files.atomic_output
    monkeypatch.setattr(files, "_read_cache_file",
                        lambda p, limit: reads.append(p.name) or real_read(p, limit))
    monkeypatch.setattr(files, "atomic_output",
                        lambda p: writes.append(p.name) or real_output(p))
    files.reset_process_cache()
    resolve_workload(path)  # cold
    assert reads.count("hashes.json") == 1 and writes.count("hashes.json") == 1
    files.reset_process_cache()
    reads.clear(), writes.clear()
    resolve_workload(path)  # warm, as a new process
    assert reads.count("hashes.json") == 1 and writes == []


def test_a_full_cache_disk_is_one_line(tmp_path: Path) -> None:
    """A write refused for want of space (here: a file-size limit, EFBIG, as a full disk's
    ENOSPC is met by the same code) ends in one line, with nothing half-made kept."""
    path, _ = _text_corpus(tmp_path, size=20000)
    limit = ("import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))")
    result = run_cli("run", "--workload", str(path), "--framework", "torch", "--db",
                     str(tmp_path / "r.db"), env={
        "SEXTANT_CACHE": str(tmp_path / "cache")}, timeout=120, prelude=limit)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "cannot write the token cache" in result.stderr
    assert "File too large (free some space" in result.stderr
    assert not list((tmp_path / "cache" / "tokens").glob("*.bin"))
    assert not list((tmp_path / "cache" / "tokens").glob(".*.tmp"))


def test_long_documents_are_cut_where_the_tokens_stay_the_same(tmp_path: Path) -> None:
    """A 300,000-character document is encoded in pieces cut between words: the ids are
    those of the whole document, through a real byte-level BPE tokenizer."""
    docs = corpus_documents()
    tok_path = make_tokenizer(tmp_path / "tokenizer.json", docs)
    text = ("\n\n".join(docs) * 40)[:300_000]
    tokenizer = files.Tokenizer(str(tok_path))
    assert tokenizer.splits_exactly
    assert len(list(files.pieces(text))) > 4
    whole = tokenizers.Tokenizer.from_file(str(tok_path)).encode(
        text, add_special_tokens=False).ids
    assert np.concatenate(list(tokenizer.encode([text]))).tolist() == whole


def test_a_tokenizer_that_cannot_be_cut_exactly_is_named(tmp_path: Path) -> None:
    """A tokenizer that prepends a marker to every text (sentencepiece's style) encodes a
    cut text differently: the probe finds it, and a long document says so once."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, trainers

    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.train_from_iterator(corpus_documents(), trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>"], show_progress=False))
    tok.save(str(tmp_path / "sp.json"))
    assert not files.Tokenizer(str(tmp_path / "sp.json")).splits_exactly
    assert files.Tokenizer("bytes").splits_exactly


def test_a_long_document_tokenizes_in_bounded_memory(tmp_path: Path) -> None:
    """A 4 MB single-document .txt through a real BPE tokenizer: the process grows by far
    less than the about 100 bytes per character the tokenizer holds for what it encodes at
    once (a whole-document encode grew by about 860 MB for 4 MB)."""
    docs = corpus_documents()
    make_tokenizer(tmp_path / "tokenizer.json", docs)
    (tmp_path / "doc.txt").write_text(("\n\n".join(docs) * 200)[:4_000_000])
    path = workload_file(tmp_path, 'files = ["doc.txt"]\ntokenizer = "tokenizer.json"')
    code = ("import resource, sys\nfrom sextant.data import files\n"
            "from sextant.sources import resolve_workload\n"
            "files.Tokenizer('bytes')\n"
            "import tokenizers, pyarrow\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "resolve_workload(sys.argv[1])\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=300,
                         env={**os.environ, "SEXTANT_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 300, out.stdout  # MB


def test_a_dictionary_encoded_string_column_is_read(tmp_path: Path) -> None:
    """pandas' `category` columns are stored dictionary-encoded: strings all the same."""
    docs = corpus_documents(20)
    pq.write_table(pa.table({"text": pa.array(docs).dictionary_encode()}),
                   tmp_path / "c.parquet")
    write_parquet(tmp_path / "d.parquet", docs)
    plain = workload_file(tmp_path, 'files = ["d.parquet"]\ntokenizer = "bytes"', vocab=256)
    encoded = tmp_path / "e.toml"
    encoded.write_text(plain.read_text().replace("d.parquet", "c.parquet"))
    a, b = resolve_workload(plain), resolve_workload(encoded)
    assert np.array_equal(np.array(files.tokens(a)), np.array(files.tokens(b)))


def test_a_worker_hashes_the_token_file_only_when_it_changed(
        tmp_path: Path, token_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command verifies the token file's sha256 in full; a worker (tokens() in a fresh
    process) trusts a file whose identity is the one recorded when it was written, and
    hashes, and refuses, one that was written since."""
    path, body = _text_corpus(tmp_path)
    w = resolve_workload(path)
    hashed: list[str] = []
    real = files._hash_open_file
    monkeypatch.setattr(files, "_hash_open_file",
                        lambda f, p: (p.suffix == ".bin" and hashed.append(p.name)) or real(f, p))
    files.reset_process_cache()
    assert np.array(files.tokens(w)).tobytes() == body
    assert hashed == []
    files.reset_process_cache()
    resolve_workload(path)  # the command: always in full
    assert hashed == [f"{w.data.digest}.bin"]
    bin_path = token_cache / f"{w.data.digest}.bin"
    poisoned = bytearray(bin_path.read_bytes())
    poisoned[3] ^= 0xFF
    bin_path.write_bytes(bytes(poisoned))
    files.reset_process_cache()
    hashed.clear()
    assert np.array(files.tokens(w)).tobytes() == body  # hashed, refused, made again
    assert hashed[0] == f"{w.data.digest}.bin"
