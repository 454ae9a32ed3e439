"""Peak memory and throughput of tokenizing one long document: a single-document .txt of
N MB, through a byte-level BPE tokenizer.json that the `tokenizers` library trains here on
the bundled corpus (vocabulary `--vocab`), in a fresh process per size.

Method: the text is the bundled corpus repeated to N MB; each size is resolved
(`sextant.sources.resolve_workload`, which tokenizes it into the token cache) in a new
interpreter with its own SEXTANT_CACHE; the figures are that process's peak resident set
(ru_maxrss) less its peak before tokenizing (after the imports), and the text's megabytes
over the seconds the resolve took. Prints one line per size, then the memory per MB of text
between the smallest and largest size (flat when memory does not grow with the document).

    python benchmarks/tokenize_memory.py --sizes 10,100 --vocab 4096
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import resource, sys, time
from sextant.data import files
from sextant.sources import resolve_workload
import tokenizers, numpy
files.Tokenizer(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
workload = resolve_workload(sys.argv[1])
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before // 1024, peak // 1024, seconds, files.tokens(workload).size)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100", help="megabytes, comma-separated")
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from sextant import data

    corpus = data.text_tokens().tobytes().decode("utf-8", errors="replace")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(corpus.split("\n\n"), trainer=trainers.BpeTrainer(
            vocab_size=args.vocab, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(str(root / "tokenizer.json"))
        rows = []
        for mb in (int(s) for s in args.sizes.split(",")):
            folder = root / f"{mb}mb"
            folder.mkdir()
            size = mb * 1_000_000
            with open(folder / "doc.txt", "w", encoding="utf-8") as f:
                written = 0
                while written < size:
                    part = corpus[: size - written]
                    f.write(part)
                    written += len(part)
            (folder / "w.toml").write_text(f"""name = "long-document"
steps = 6
global_batch = 2
[model]
family = "gpt"
vocab_size = {args.vocab}
seq_len = 32
d_model = 16
n_layers = 1
n_heads = 2
[data]
files = ["doc.txt"]
tokenizer = "{root / 'tokenizer.json'}"
""")
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(folder / "w.toml"), str(root / "tokenizer.json")],
                capture_output=True, text=True, timeout=7200,
                env={**os.environ, "SEXTANT_CACHE": str(folder / "cache")})
            if out.returncode:
                sys.exit(f"{mb} MB failed: {out.stderr.strip()[-2000:]}")
            before, peak, seconds, tokens = out.stdout.split()
            grew = int(peak) - int(before)
            rows.append((mb, grew))
            print(f"{mb} MB document: {int(tokens):,} tokens in {float(seconds):.1f} s "
                  f"({mb / float(seconds):.2f} MB/s); peak RSS {peak} MB, {grew} MB above "
                  f"the {before} MB after imports")
            (folder / "doc.txt").unlink()
        if len(rows) > 1:
            (small, g0), (large, g1) = rows[0], rows[-1]
            print(f"memory per MB of text from {small} to {large} MB: "
                  f"{(g1 - g0) / (large - small):.2f} MB")


if __name__ == "__main__":
    main()
