"""The mixed-precision agreement band, measured: how far each framework's bf16 curve and two
broken twins stay from torch's fp32 curve, against the envelope torch's own bf16 run sets.

    python benchmarks/mixed_agreement.py --workloads gpt-tiny,llama-tiny

Each configuration is a full `sextant run` (a fresh process per run, each in its own results
store under a temporary directory): torch fp32 and bf16 (the band), jax and tensorflow bf16,
and the twins that must fail it, jax with its loss taken on bf16 logits
(SEXTANT_TEST_FAULT=loss-in-compute-dtype) and torch updating bf16 master weights
(bf16-master-weights). Prints, per workload and run, the largest ratio over the steps of
|L_run - L_fp32| to the band without its factor (sextant.measure.agreement; a run agrees
when it is at most MIXED_FACTOR) and the largest |L_run - L_fp32|.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sextant.measure.agreement import MIXED_FACTOR, mixed_agreement  # noqa: E402
from sextant.results.store import ResultsStore  # noqa: E402

# (label, framework, precision, fault)
RUNS = (
    ("torch fp32", "torch", "fp32", None),
    ("torch bf16 (the band's own run)", "torch", "bf16", None),
    ("jax bf16", "jax", "bf16", None),
    ("tensorflow bf16", "tensorflow", "bf16", None),
    ("jax bf16, loss on bf16 logits (twin)", "jax", "bf16", "loss-in-compute-dtype"),
    ("torch bf16, bf16 master weights (twin)", "torch", "bf16", "bf16-master-weights"),
)


def losses(workload: str, framework: str, precision: str, fault: str | None,
           work: Path) -> list[float]:
    db = work / f"{framework}-{precision}-{fault}.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if fault:
        env["SEXTANT_TEST_FAULT"] = fault
    subprocess.run([sys.executable, "-m", "sextant.cli", "run", "--framework", framework,
                    "--precision", precision, "--workload", workload, "--db", str(db)],
                   check=True, env=env, cwd=work, capture_output=True, timeout=900)
    with ResultsStore(db, create=False) as store:
        return store.runs()[-1].finite_losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="gpt-tiny,llama-tiny")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args()
    out: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workload in a.workloads.split(","):
            curves = {label: losses(workload, fw, prec, fault, Path(tmp))
                      for label, fw, prec, fault in RUNS}
            fp32, band = curves[RUNS[0][0]], curves[RUNS[1][0]]
            out[workload] = {}
            print(f"{workload}: ratio to the band without its factor {MIXED_FACTOR:g} "
                  "(agrees at most that), max |L - L_fp32|")
            for label, *_ in RUNS[1:]:
                result = mixed_agreement(curves[label], fp32, band)
                ratio = result.worst_ratio * MIXED_FACTOR
                out[workload][label] = {"ratio": ratio, "max_diff": result.max_diff}
                print(f"  {label:42s} {ratio:6.2f}  {result.max_diff:.1e}")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
