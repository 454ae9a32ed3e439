"""The GPU acceptance check: one command, about 8 minutes on one GPU.

    PYTHONPATH=. python benchmarks/gpu_check.py --out DIR          # on a GPU machine
    python benchmarks/gpu_check.py --smoke --out DIR                # the same plumbing on CPU

It runs, on the GPU-scale bundled workload (gpt2-small; gpt-tiny with --smoke):
1. `sextant compare` as a user would, with no flags but --repeats: it must exit 0 on any
   number of GPUs, train every framework's single-device rows in bf16 and the fp32 anchor
   of the mixed-precision band;
2. fp32 against tf32 on torch and JAX: each run's effective precision as the framework
   reports it, and a report built from torch fp32 beside JAX tf32, which must rank nothing;
3. the independent loops of benchmarks/expert/ (share no code with sextant, clip their
   gradients) in bf16 on the same shapes, for each framework's sextant/expert step ratio.

It prints (and writes to DIR/gpu_check.md and .json) one table per part: per framework the
bf16 step time, MFU, device memory and the planner's error; fp32 vs tf32 with effective
precisions; the mixed-precision agreement of every run; the expert ratios. Exit status 1
when compare failed, a verdict was drawn across precisions, or a run disagreed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sextant.core.devices import detect  # noqa: E402
from sextant.results.record import RunRecord  # noqa: E402
from sextant.results.store import ResultsStore  # noqa: E402

EXPERT = ROOT / "benchmarks" / "expert"
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def sextant(*args: str, log: Path, timeout: float) -> int:
    """One sextant command in a fresh interpreter; its output kept in `log`."""
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "sextant.cli", *args], stdout=out,
                              stderr=subprocess.STDOUT, env=ENV, timeout=timeout,
                              cwd=log.parent).returncode


def records(db: Path) -> list[RunRecord]:
    with ResultsStore(db, create=False) as store:
        return store.runs()


def expert(script: str, flags: list[str], warmup: int, timeout: float) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(EXPERT / script), *flags], capture_output=True,
                         text=True, timeout=timeout, env=ENV)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    doc["step_median_s"] = statistics.median(doc["step_times_s"][warmup:])
    return doc


def part_compare(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    db = out / "compare.db"
    args = ["compare", "--db", str(db), "--report", str(out / "report.html"),
            "--repeats", str(a.repeats), "--no-calibrate", "--frameworks", a.frameworks]
    if a.smoke:
        args += ["--workload", a.workload, "--steps", str(a.steps), "--device", "cpu",
                 "--precision", "bf16"]
    t0 = time.perf_counter()
    rc = sextant(*args, log=out / "compare.txt", timeout=a.timeout)
    runs = records(db) if db.exists() else []
    from sextant.report.model import build_report

    report = build_report(runs) if runs else None
    rows = []
    for row in (report or {}).get("runs", []):
        rows.append({k: row.get(k) for k in (
            "label", "effective_precision", "device", "accelerator", "mfu",
            "planner_step_s", "planner_error", "device_peak_bytes", "not_ranked")}
            | {"step_s": row["step_time_s"]["median"]})
    parity = (report or {}).get("parity") or {}
    return {"rc": rc, "seconds": time.perf_counter() - t0, "rows": rows,
            "agreement": [{k: p.get(k) for k in ("run", "precision", "max_diff", "agrees",
                                                 "band_ratio", "rule", "why_not")}
                          for p in parity.get("per_run", [])],
            "headline": (report or {}).get("summary", {}).get("fastest")}


def part_precision(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    db = out / "precision.db"
    device = ["--device", "cpu"] if a.smoke else []
    for framework in a.frameworks.split(","):
        for precision in ("fp32", "tf32"):
            sextant("run", "--framework", framework, "--precision", precision, "--workload",
                    a.workload, "--steps", str(a.steps), "--db", str(db), *device,
                    log=out / f"run-{framework}-{precision}.txt", timeout=a.timeout)
    runs = records(db) if db.exists() else []
    from sextant.claims import conditions
    from sextant.report.model import build_report

    table = [{"run": r.label, "requested": r.strategy.precision,
              "effective": conditions(r)[0], "step_s": r.metrics.step_time_median_s,
              "switches": r.fingerprint.to_dict().get("precision", {}).get("switches")}
             for r in runs]
    pick = {(r.strategy.framework, r.strategy.precision): r for r in runs}
    crossed = None
    if ("torch", "fp32") in pick and ("jax", "tf32") in pick:
        report = build_report([pick["torch", "fp32"], pick["jax", "tf32"]])
        crossed = {"speedup": report["runs"][1]["speedup_vs_reference"],
                   "not_ranked": report["runs"][1]["not_ranked"],
                   "effective": [conditions(pick[k])[0] for k in (("torch", "fp32"),
                                                                  ("jax", "tf32"))]}
    return {"runs": table, "torch_fp32_vs_jax_tf32": crossed}


def part_expert(a: argparse.Namespace, out: Path, compare: dict[str, Any]) -> list[dict]:
    from sextant.sources import resolve_workload

    w = resolve_workload(a.workload)
    m, o = w.model, w.optimizer
    steps = a.steps or w.steps
    shape = ["--vocab", m.vocab_size, "--seq-len", m.seq_len, "--d-model", m.d_model,
             "--n-layers", m.n_layers, "--n-heads", m.n_heads, "--d-ff", m.d_ff,
             "--batch", w.global_batch, "--steps", steps, "--lr", o.lr,
             "--lr-warmup", o.warmup_steps, "--device", "cpu" if a.smoke else "gpu",
             "--precision", "bf16"]
    flags = [str(x) for x in shape]
    sx = {row["label"]: row["step_s"] for row in compare["rows"]}
    out_rows = []
    for label, script, extra in (("torch eager bf16", "torch_gpt.py", ["--mode", "eager"]),
                                 ("torch compiled bf16", "torch_gpt.py",
                                  ["--mode", "compiled"]),
                                 ("jax compiled bf16", "jax_gpt.py", [])):
        if label.split()[0] not in a.frameworks.split(","):
            continue
        doc = expert(script, flags + extra, w.measure.warmup_steps, a.timeout)
        ours = sx.get(label)
        ratio = ours / doc["step_median_s"] if ours and "step_median_s" in doc else None
        out_rows.append({"run": label, "sextant_step_s": ours,
                         "expert_step_s": doc.get("step_median_s"), "ratio": ratio,
                         "expert_attention": doc.get("attention"),
                         "error": doc.get("error")})
    return out_rows


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def markdown(doc: dict[str, Any]) -> str:
    c, p = doc["compare"], doc["precision"]
    lines = [f"device: {doc['inventory']}", "",
             f"`sextant compare` exit status {c['rc']} ({c['seconds']:.0f} s)", "",
             "| run | precision | step ms | MFU | device MB | planner ms (error) | ranked |",
             "|---|---|---|---|---|---|---|"]
    for r in c["rows"]:
        planner = (f"{ms(r['planner_step_s'])} ({r['planner_error']:+.1%})"
                   if r["planner_error"] is not None else "-")
        lines.append(
            f"| {r['label']} | {r['effective_precision']} | {ms(r['step_s'])} | "
            f"{'-' if r['mfu'] is None else format(r['mfu'], '.1%')} | "
            f"{'-' if r['device_peak_bytes'] is None else round(r['device_peak_bytes'] / 2**20)}"
            f" | {planner} | {r['not_ranked'] or 'yes'} |")
    lines += ["", "| run | precision | max abs diff vs fp32 | agreement |", "|---|---|---|---|"]
    for g in c["agreement"]:
        verdict = ("agrees" if g["agrees"] else "DISAGREES") if g["agrees"] is not None \
            else f"not held: {g['why_not']}"
        diff = "-" if g["max_diff"] is None else f"{g['max_diff']:.1e}"
        lines.append(f"| {g['run']} | {g['precision']} | {diff} | {verdict} |")
    lines += ["", "| run | requested | effective | step ms |", "|---|---|---|---|"]
    for r in p["runs"]:
        lines.append(f"| {r['run']} | {r['requested']} | {r['effective']} | {ms(r['step_s'])} |")
    crossed = p["torch_fp32_vs_jax_tf32"]
    if crossed:
        lines += ["", f"torch fp32 beside jax tf32: speed-up {crossed['speedup']}, "
                      f"not ranked: {crossed['not_ranked']}"]
    lines += ["", "| run | sextant ms | expert ms | ratio |", "|---|---|---|---|"]
    for r in doc["expert"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['run']} | {ms(r['sextant_step_s'])} | {ms(r['expert_step_s'])} | "
                     f"{ratio} |" + (f" {r['error']}" if r.get("error") else ""))
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gpu-check"))
    p.add_argument("--smoke", action="store_true",
                   help="on CPU: gpt-tiny, a few steps, to test this script without a GPU")
    p.add_argument("--frameworks", default="torch,jax")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    inventory = detect()
    if not a.smoke and inventory.kind != "gpu":
        print("gpu_check: this host has no visible GPU; --smoke runs the check on CPU",
              file=sys.stderr)
        return 2
    a.workload = "gpt-tiny" if a.smoke else "gpt2-small"
    if a.smoke:
        a.steps, a.repeats = a.steps or 8, 1
    a.out.mkdir(parents=True, exist_ok=True)
    out = a.out.resolve()
    doc: dict[str, Any] = {"inventory": inventory.describe(), "smoke": a.smoke}
    doc["compare"] = part_compare(a, out)
    doc["precision"] = part_precision(a, out)
    doc["expert"] = part_expert(a, out, doc["compare"])
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
    text = markdown(doc)
    (out / "gpu_check.md").write_text(text)
    print(text)
    crossed = doc["precision"]["torch_fp32_vs_jax_tf32"] or {}
    # A verdict across precisions: a speed-up drawn where the effective precisions differ
    # (on a CPU, where tf32 runs as fp32, ranking them is right).
    across = (crossed.get("speedup") is not None
              and len(set(crossed.get("effective") or ())) > 1)
    bad = (doc["compare"]["rc"] != 0 or across
           or any(g["agrees"] is False for g in doc["compare"]["agreement"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
