"""Do verdicts survive a busy machine?

Runs the default `sextant compare` twice into two fresh stores: once as the machine is, once
while this script keeps a CPU-bound load of its own running, pinned to one core, for part
of the time (it starts after `--load-delay` seconds, lasts `--load-seconds`, and is killed by
this script in any case). Then compares the two compares' verdicts:

- a *flip* is a claim (or the headline) that holds in one and does not hold in the other
  (a fastest run named in both, but a different one, is a headline flip);
- under load a verdict may stay the same or become inconclusive / tied, never flip;
- the runs that trained while the load ran should be marked disturbed.

    python benchmarks/noise.py [--frameworks torch,jax,tensorflow] [--repeats N]
                               [--steps S] [--out noise.json]

Prints a Markdown summary (quoted in docs/benchmarks.md) and writes the figures as JSON.
Exit code 1 when a verdict flipped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sextant.claims import HOLDS, NOT_HOLD
from sextant.report.model import build_report
from sextant.results.store import ResultsStore

LOAD = "while True:\n    pass\n"
SEXTANT = [sys.executable, "-c",
           "import sys; from sextant.cli import main; sys.exit(main(sys.argv[1:]))"]


def load1() -> float:
    return os.getloadavg()[0]


def compare(db: Path, extra: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run([*SEXTANT, "compare", "--no-report",
                           "--no-calibrate", "--db", str(db), *extra],
                          capture_output=True, text=True, cwd=db.parent, check=False)
    if proc.returncode not in (0, 1) or not db.exists():
        raise SystemExit(f"compare failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.monotonic() - t0, proc.stdout


def start_load(core: int) -> subprocess.Popen[bytes]:
    """A CPU-bound Python loop pinned to `core`, outside the compare's process tree."""
    proc = subprocess.Popen([sys.executable, "-c", LOAD])
    os.sched_setaffinity(proc.pid, {core})
    return proc


def verdicts(db: Path, keep_disturbed: bool = False) -> dict:
    """The compare's verdicts; with keep_disturbed, as if no run had been marked disturbed
    (what the intervals alone decide, for comparison)."""
    with ResultsStore(db, create=False) as store:
        runs = store.runs(group_id=store.latest_group())
    if keep_disturbed:
        runs = [r.with_metrics(disturbed=False) for r in runs]
    report = build_report(runs)
    s = report["summary"]
    head = s["fastest"] or {}
    return {
        "claims": {c["id"]: {"verdict": c["verdict"], "figure": c["figure"]}
                   for c in report["claims"]},
        "headline": {"run": head.get("run"), "verdict": head.get("verdict"),
                     "vs_runner_up": head.get("vs_runner_up"),
                     "tied_with": head.get("tied_with")},
        "runs": len(runs),
        "disturbed": [{"id": r.id, "label": r.label, "trial": r.metrics.trial,
                       "outside_cores": r.fingerprint.interference.get("outside_cores_mean"),
                       "busy_share": r.fingerprint.interference.get("outside_busy_share")}
                      for r in runs if r.metrics.disturbed],
        "interference": [{"id": r.id, "label": r.label,
                          "outside_cores": r.fingerprint.interference.get("outside_cores_mean"),
                          "disturbed": r.metrics.disturbed} for r in runs],
    }


def flips(quiet: dict, loaded: dict) -> list[str]:
    out = []
    for cid, q in quiet["claims"].items():
        v = loaded["claims"][cid]["verdict"]
        if {q["verdict"], v} == {HOLDS, NOT_HOLD}:
            out.append(f"{cid}: {q['verdict']} -> {v}")
    qh, lh = quiet["headline"], loaded["headline"]
    if (qh["verdict"] == "fastest" and lh["verdict"] == "fastest" and qh["run"] != lh["run"]):
        out.append(f"headline: {qh['run']} -> {lh['run']}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frameworks", default=None)
    p.add_argument("--repeats", default=None)
    p.add_argument("--steps", default=None)
    p.add_argument("--load-delay", type=float, default=None,
                   help="seconds into the loaded compare before the load starts "
                        "(default: a quarter of the quiet compare's time)")
    p.add_argument("--load-seconds", type=float, default=None,
                   help="how long the load runs (default: half the quiet compare's time)")
    p.add_argument("--core", type=int, default=0, help="the core the load is pinned to")
    p.add_argument("--out", type=Path, default=Path("noise.json"))
    args = p.parse_args()
    extra = []
    for flag in ("frameworks", "repeats", "steps"):
        if getattr(args, flag) is not None:
            extra += [f"--{flag}", str(getattr(args, flag))]

    work = Path(tempfile.mkdtemp(prefix="sextant-noise-"))
    load_before = load1()
    quiet_s, quiet_out = compare(work / "quiet.db", extra)
    load_after_quiet = load1()
    delay = args.load_delay if args.load_delay is not None else quiet_s / 4
    length = args.load_seconds if args.load_seconds is not None else quiet_s / 2

    # The loaded compare in the background; the load starts after `delay`, ends after
    # `length`, and is killed whatever happens.
    t0 = time.monotonic()
    proc = subprocess.Popen([*SEXTANT, "compare", "--no-report",
                             "--no-calibrate", "--db", str(work / "loaded.db"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=work)
    load = None
    window = None
    try:
        while proc.poll() is None:
            now = time.monotonic() - t0
            if load is None and window is None and now >= delay:
                load, window = start_load(args.core), [now, None]
            if load is not None and now >= delay + length:
                load.send_signal(signal.SIGKILL)
                load.wait()
                load, window[1] = None, now
            time.sleep(0.2)
    finally:
        if load is not None:
            load.send_signal(signal.SIGKILL)
            load.wait()
            window[1] = time.monotonic() - t0
    loaded_s = time.monotonic() - t0
    stdout, stderr = proc.communicate()
    if proc.returncode not in (0, 1) or not (work / "loaded.db").exists():
        raise SystemExit(f"loaded compare failed ({proc.returncode}): {stderr[-2000:]}")

    quiet, loaded = verdicts(work / "quiet.db"), verdicts(work / "loaded.db")
    flipped = flips(quiet, loaded)
    quiet_all = verdicts(work / "quiet.db", keep_disturbed=True)
    loaded_all = verdicts(work / "loaded.db", keep_disturbed=True)
    flipped_all = flips(quiet_all, loaded_all)
    result = {
        "command": " ".join(["python benchmarks/noise.py", *sys.argv[1:]]),
        "compare_args": extra,
        "load1_before": load_before, "load1_after_quiet": load_after_quiet,
        "load1_end": load1(), "cores": os.cpu_count(),
        "quiet_s": quiet_s, "loaded_s": loaded_s,
        "load_window_s": window, "load_core": args.core,
        "quiet": quiet, "loaded": loaded, "flipped": flipped,
        "keeping_disturbed": {"quiet": quiet_all, "loaded": loaded_all,
                              "flipped": flipped_all},
        "quiet_stdout": quiet_out[-6000:], "loaded_stdout": stdout[-6000:],
    }
    args.out.write_text(json.dumps(result, indent=2))

    print("| | quiet | under load | quiet, disturbed kept | under load, disturbed kept |\n"
          "|---|---|---|---|---|")
    print(f"| wall time | {quiet_s:.0f} s | {loaded_s:.0f} s (load on core {args.core} "
          f"from {window[0]:.0f} s to {window[1]:.0f} s) | | |" if window else
          f"| wall time | {quiet_s:.0f} s | {loaded_s:.0f} s (the load never started) | | |")
    print(f"| runs | {quiet['runs']} | {loaded['runs']} | | |")
    print(f"| disturbed runs | {len(quiet['disturbed'])} | {len(loaded['disturbed'])} | | |")
    heads = [v["headline"] for v in (quiet, loaded, quiet_all, loaded_all)]
    print("| headline | " + " | ".join(f"{h['run']} ({h['verdict']})" for h in heads) + " |")
    for cid in quiet["claims"]:
        print(f"| {cid} | " + " | ".join(v["claims"][cid]["verdict"]
                                        for v in (quiet, loaded, quiet_all, loaded_all)) + " |")
    print(f"\nload average (1 min) before: {load_before:.2f}, after the quiet compare: "
          f"{load_after_quiet:.2f}, at the end: {result['load1_end']:.2f}")
    print(f"flipped verdicts: {len(flipped)}" + (f": {'; '.join(flipped)}" if flipped else ""))
    print(f"flipped if disturbed runs were kept (intervals alone): {len(flipped_all)}"
          + (f": {'; '.join(flipped_all)}" if flipped_all else ""))
    print(f"figures: {args.out}")
    return 1 if flipped else 0


if __name__ == "__main__":
    sys.exit(main())
