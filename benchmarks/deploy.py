"""The deployment matrix on this machine: every export format of every framework, from one
set of trained weights.

Runs `sextant compare deploy` as a user runs it, into a fresh results store: a reference
torch run of the workload's steps, then each framework's exporters (all formats, AOTInductor
included) with every artifact served in a fresh process pinned to `--serve-threads` cores.
Then prints the Markdown table docs/deployment.md quotes (from the store's typed rows, the
report's own cells) and, with `--out`, the rows as JSON.

    python benchmarks/deploy.py [--workload gpt-tiny] [--calls 30] [--serve-threads 1]
                                [--formats torch:onnx,...] [--out deploy.json]

Latency is the median of `--calls` timed calls after 3 warm-up calls, with the 95 %
interval of the median (moving-block bootstrap, as the training step times). Measure on a
quiet machine: another process on the pinned core shows in every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from sextant.report.model import DEPLOY_COLUMNS, deploy_cells, deploy_row
from sextant.results.store import ResultsStore

SEXTANT = [sys.executable, "-c",
           "import sys; from sextant.cli import main; sys.exit(main(sys.argv[1:]))"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="gpt-tiny")
    p.add_argument("--calls", default="30")
    p.add_argument("--serve-threads", default="1")
    p.add_argument("--formats", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sextant-deploy-") as home:
        db = Path(home) / "results.db"
        cmd = [*SEXTANT, "compare", "deploy", "--workload", args.workload, "--calls",
               args.calls, "--serve-threads", args.serve_threads, "--db", str(db),
               "--no-report"] + (["--formats", args.formats] if args.formats else [])
        done = subprocess.run(cmd, cwd=home, timeout=3600)
        with ResultsStore(db) as store:
            group = store.latest_deployment_group()
            rows = store.deployments(group_id=group) if group else []
    if not rows:
        return done.returncode or 1
    print(f"\n`{' '.join(['sextant', *cmd[3:-3]])}` ({len(rows)} artifacts)\n")
    print("| " + " | ".join(DEPLOY_COLUMNS) + " |")
    print("|" + "---|" * len(DEPLOY_COLUMNS))
    for r in rows:
        print("| " + " | ".join(str(c) for c in deploy_cells(deploy_row(r))) + " |")
    if args.out is not None:
        args.out.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1,
                                       default=str))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
