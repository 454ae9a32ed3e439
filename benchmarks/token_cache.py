"""How long `sextant` takes to find the tokens of a corpus of many small files: cold (every
file hashed and tokenized), then warm in a fresh process (the hash index read once, every
file's identity checked against it, the token file's own hash verified).

Method: N .txt files of a few hundred bytes each from the bundled corpus, in a temporary
directory with its own SEXTANT_CACHE, the 'bytes' tokenizer (so the figure is sextant's own
work, not a tokenizer's); each resolve runs `sextant.sources.resolve_workload` in a new
interpreter, timed around the call. Prints one line per phase.

    python benchmarks/token_cache.py --files 100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESOLVE = """
import sys, time
from sextant.sources import resolve_workload
t = time.perf_counter()
w = resolve_workload(sys.argv[1])
print(time.perf_counter() - t, w.data.digest)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    args = parser.parse_args()
    from sextant import data

    text = data.text_tokens().tobytes().decode("utf-8", errors="replace")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus"
        for i in range(args.files):
            folder = corpus / f"{i // 1000:04d}"
            if i % 1000 == 0:
                folder.mkdir(parents=True)
            start = (i * 397) % (len(text) - 400)
            (folder / f"{i:06d}.txt").write_text(text[start:start + 300])
        workload = root / "w.toml"
        workload.write_text(f"""name = "many-files"
steps = 6
global_batch = 2
[model]
family = "gpt"
vocab_size = 256
seq_len = 32
d_model = 16
n_layers = 1
n_heads = 2
[data]
files = [{json.dumps(str(corpus) + "/**/*.txt")}]
tokenizer = "bytes"
""")
        env = {**os.environ, "SEXTANT_CACHE": str(root / "cache")}
        for phase in ("cold", "warm", "warm"):
            started = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", RESOLVE, str(workload)], env=env,
                                 capture_output=True, text=True, timeout=3600)
            if out.returncode:
                sys.exit(f"{phase} resolve failed: {out.stderr.strip()[-2000:]}")
            inner, digest = out.stdout.split()
            print(f"{phase}: {args.files} files resolved in {float(inner):.2f} s "
                  f"({time.perf_counter() - started:.2f} s with the interpreter's start), "
                  f"digest {digest}")


if __name__ == "__main__":
    main()
