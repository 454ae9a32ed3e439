"""sextant vs an expert's hand-written loop (issue #20), alternating in fresh processes.

For each configuration (framework, mode, parallelism) and each round, runs a full
`sextant run` of the workload (fresh CLI process, its own results store; the steady-state
step times are read from the stored run's rank results, slowest rank per step, after the
workload's measure.warmup_steps, exactly as sextant's own step_time_median) and then the
expert loop of benchmarks/expert/ (fresh process, imports nothing from sextant) with the
same shapes, optimizer hyper-parameters, steps, warm-up exclusion, thread count and
OMP_NUM_THREADS. Rounds go A B A B ...; every configuration runs once per round, so drifts of
a shared machine hit all of them. Prints, per configuration, the median over rounds of each
side's median step, their ratio sextant/expert, the per-round ratios' median and min-max,
and a bootstrap 95% interval of the median per-round ratio; writes everything (with the load
averages before and after) as JSON under benchmarks/results/.

    python benchmarks/expert_ratio.py --workload benchmarks/expert/gpt-issue20.toml \
        --configs torch-eager,torch-compiled,jax,tensorflow --rounds 5

Within a round the two sides alternate which runs first. On a machine whose speed drifts
from one run to the next (a shared virtual machine), `--concurrent --threads 1` runs both
sides at the same time instead, each pinned to its own core (swapped every round), and
compares only the steps each ran while the other was training (wall-clock step ends from
sextant's step events and the expert's report); single-process configurations.
`NAME+sxinputs` trains the expert on sextant's own initial weights and batches and reports
how far the two loss curves are apart. `NAME+keep` gives the expert loop the allocator
setting sextant's workers use (`--keep-freed-memory`: a like-for-like comparison of the
step), and `NAME+system` runs sextant's worker with the C library's allocator defaults
(SEXTANT_MALLOC=system), as the expert loop runs by default.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERT = ROOT / "benchmarks" / "expert"

# name -> (sextant run flags, expert script, expert flags)
CONFIGS: dict[str, tuple[list[str], str, list[str]]] = {
    "torch-eager": (["--framework", "torch", "--mode", "eager"], "torch_gpt.py",
                    ["--mode", "eager"]),
    "torch-compiled": (["--framework", "torch", "--mode", "compiled"], "torch_gpt.py",
                       ["--mode", "compiled"]),
    "torch-dp2-eager": (["--framework", "torch", "--mode", "eager", "--parallel", "dp",
                         "--workers", "2"], "torch_gpt.py", ["--mode", "eager", "--workers", "2"]),
    "torch-dp2-compiled": (["--framework", "torch", "--mode", "compiled", "--parallel", "dp",
                            "--workers", "2"], "torch_gpt.py",
                           ["--mode", "compiled", "--workers", "2"]),
    "jax": (["--framework", "jax", "--mode", "compiled"], "jax_gpt.py", []),
    "tensorflow": (["--framework", "tensorflow", "--mode", "compiled"], "tf_gpt.py",
                   ["--mode", "keras"]),
    "tensorflow-fused": (["--framework", "tensorflow", "--mode", "compiled"], "tf_gpt.py",
                         ["--mode", "fused"]),
}


def expert_shape_flags(workload: str, steps: int | None) -> tuple[list[str], int, int]:
    """The expert loop's flags for the workload's shapes and optimizer; (flags, steps,
    warm-up steps excluded)."""
    from sextant.sources import resolve_workload

    w = resolve_workload(workload)
    if steps:
        w = w.replace(steps=steps)
    m, o = w.model, w.optimizer
    flags = ["--vocab", m.vocab_size, "--seq-len", m.seq_len, "--d-model", m.d_model,
             "--n-layers", m.n_layers, "--n-heads", m.n_heads, "--d-ff", m.d_ff,
             "--batch", w.global_batch, "--steps", w.steps, "--lr", o.lr,
             "--beta1", o.beta1, "--beta2", o.beta2, "--eps", o.eps,
             "--weight-decay", o.weight_decay, "--lr-warmup", o.warmup_steps,
             "--min-lr-ratio", o.min_lr_ratio, "--seed", w.seed]
    return [str(f) for f in flags], w.steps, w.measure.warmup_steps


def worker_pids(parent: int) -> list[int]:
    """The `sextant.launch.worker` children of `parent` (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"sextant.launch.worker" in cmd:
                found.append(int(child))
    return found


def stopped_parent(proc: subprocess.Popen, workers: int) -> None:
    """The experiment of --stop-parent: once `sextant run` (proc) has started its workers,
    stop it (SIGSTOP: its event tailing, 50 ms poll and interference sampler all halt) until
    every worker has exited, then let it finish. The workers need nothing from the parent
    once started (the plan is a file, events and results go to files). Waiting uses pidfds,
    so this process does not poll while the workers train."""
    import select
    import signal

    deadline = time.monotonic() + 120
    while len(pids := worker_pids(proc.pid)) < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"--stop-parent: {workers} worker(s) never started")
        time.sleep(0.01)
    fds = [os.pidfd_open(pid) for pid in pids]
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        for fd in fds:
            select.select([fd], [], [], 1800)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        for fd in fds:
            os.close(fd)


def run_sextant(workload: str, flags: list[str], threads: int, env: dict,
                stop_workers: int = 0, cpus: list[int] | None = None, ends: list | None = None
                ) -> tuple[list[float], list[float]]:
    """(step times, losses) of one `sextant run` (the slowest rank's time and the ranks' mean
    loss, step by step); with stop_workers > 0, its launcher is stopped while that many
    workers train (stopped_parent). `cpus`: the run's affinity (its launcher pins its worker
    inside it); `ends`: filled with rank 0's wall-clock time at the end of each step (from
    its step events)."""
    with tempfile.TemporaryDirectory(prefix="sextant-ratio-") as tmp:
        cmd = [sys.executable, "-c", "from sextant.cli import main; main()", "run",
               "--workload", workload, "--db", str(Path(tmp) / "results.db"),
               "--threads", str(threads), *flags]
        if stop_workers:
            with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=env, cwd=tmp, text=True) as proc:
                stopped_parent(proc, stop_workers)
                _, err = proc.communicate(timeout=1800)
            if proc.returncode:
                raise SystemExit(f"sextant run failed ({proc.returncode}): {err[-2000:]}")
        else:
            pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800,
                           env=env, cwd=tmp, preexec_fn=pin)
        (run_dir,) = [p for p in (Path(tmp) / "runs").iterdir() if p.is_dir()]
        ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank*.result.json"))]
        if ends is not None:
            events = (json.loads(line) for line in
                      (run_dir / "rank0.events.jsonl").read_text().splitlines())
            ends.extend(e["time"] for e in events if e["event"] == "step")
    steps = range(len(ranks[0]["step_times_s"]))
    return ([max(r["step_times_s"][k] for r in ranks) for k in steps],
            [statistics.fmean(r["losses"][k] for r in ranks) for k in steps])


def overlapping(a: list[float], ends_a: list[float], b: list[float], ends_b: list[float],
                warm: int) -> tuple[list[float], list[float]]:
    """Of two runs made at the same time, the steps of each that ended while the other was
    also past its warm-up and still training (by their wall-clock step ends): the two sides
    then share whatever the machine did meanwhile."""
    lo = max(ends_a[warm], ends_b[warm])
    hi = min(ends_a[-1], ends_b[-1])
    keep_a = [t for t, e in zip(a, ends_a) if lo < e <= hi]
    keep_b = [t for t, e in zip(b, ends_b) if lo < e <= hi]
    if min(len(keep_a), len(keep_b)) < 20:
        raise SystemExit(f"--concurrent: the two runs overlapped for {len(keep_a)} and "
                         f"{len(keep_b)} steps only; use more --steps")
    return keep_a, keep_b


def sextant_cores(workers: int, threads: int) -> list[int] | None:
    """The cores sextant's launcher pins a single-process run to (None: not pinned)."""
    from sextant.launch.local import core_sets

    return core_sets((0,), 1, threads)[0] if workers == 1 else None


def run_expert(script: str, flags: list[str], threads: int, env: dict,
               cores: list[int] | None) -> list[float]:
    # Same affinity as sextant's worker, where sextant pins one (single-process runs with
    # fewer threads than cores); a no-op when the run has every core.
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # sextant not even importable
    out = subprocess.run([sys.executable, str(EXPERT / script), "--threads", str(threads),
                          *flags], capture_output=True, text=True, timeout=1800,
                         env=env, preexec_fn=pin, cwd=EXPERT)
    if out.returncode:
        sys.exit(f"{script} exited with {out.returncode}; its stderr ends:\n"
                 + "\n".join(out.stderr.strip().splitlines()[-15:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def sextant_inputs(workload: str, steps: int) -> Path:
    """An .npz of sextant's initial weights (torch names and layout) and its global batches
    for `steps` steps: what a `NAME+sxinputs` configuration's expert loop trains on, so that
    the two sides differ by their code only (the expert loop reads the file as data)."""
    path = Path(tempfile.gettempdir()) / f"sextant-inputs-{Path(workload).stem}-{steps}.npz"
    if str(path) in _WRITTEN:
        return path
    import numpy as np

    from sextant import data
    from sextant.backends.torch_backend import model as tm
    from sextant.workloads.init import init_params
    from sextant.sources import resolve_workload

    w = resolve_workload(workload)
    net = tm.build(w.model)
    tm.load_canonical(net, init_params(w.model, w.seed))
    arrays = {f"w/{k}": v.detach().numpy() for k, v in net.state_dict().items()}
    xs, ys = zip(*(data.global_batch(w, i) for i in range(steps)))
    np.savez(path, x=np.stack(xs), y=np.stack(ys), **arrays)
    _WRITTEN.add(str(path))
    return path


_WRITTEN: set[str] = set()


@atexit.register
def _remove_inputs() -> None:
    for path in _WRITTEN:
        Path(path).unlink(missing_ok=True)


def bootstrap_median(values: list[float], n: int = 10000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def p10(values: list[float]) -> float:
    return sorted(values)[len(values) // 10]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default=str(EXPERT / "gpt-issue20.toml"))
    p.add_argument("--configs", default="torch-eager,torch-compiled,jax,tensorflow",
                   help="comma-separated; NAME+stopped runs NAME with --stop-parent, so one "
                   "run alternates a configuration with and without its launcher stopped")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=None, help="override the workload's steps")
    p.add_argument("--threads", type=int, default=None,
                   help="threads per process (default: cores / workers, sextant's default)")
    p.add_argument("--concurrent", action="store_true",
                   help="run sextant and the expert at the same time, one thread each on its "
                   "own core (swapped every round), and compare the steps both ran while the "
                   "other was running: on a machine whose speed drifts between runs, both "
                   "sides see the same drift (single-process configurations)")
    p.add_argument("--stop-parent", action="store_true",
                   help="experiment: SIGSTOP the `sextant run` process while its workers "
                   "train, so nothing of the launcher runs beside them (Linux)")
    p.add_argument("--out", default=None, help="JSON result file (default: benchmarks/results/"
                   "expert_ratio-<workload>-<time>.json)")
    a = p.parse_args()
    names = a.configs.split(",")
    if Path(a.workload).is_file():  # sextant runs in a scratch directory
        a.workload = str(Path(a.workload).resolve())
    shape_flags, steps, warm = expert_shape_flags(a.workload, a.steps)
    from sextant.workloads.init import count_params
    from sextant.sources import resolve_workload

    n_params = count_params(resolve_workload(a.workload).model)
    cores = len(os.sched_getaffinity(0))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[str, dict] = {n: {"sextant": [], "expert": []} for n in names}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    loads = {"before": load()}
    print(f"workload {a.workload}: {steps} steps, median after {warm}; {a.rounds} rounds; "
          f"load average before {loads['before']}", flush=True)
    for r in range(a.rounds):
        for name in names:
            # torch-eager+stopped: --stop-parent; torch-eager+sxinputs: the expert trains on
            # sextant's initial weights and batches (sextant_inputs)
            base, _, variant = name.partition("+")
            sx_flags, script, ex_flags = CONFIGS[base]
            workers = int(sx_flags[sx_flags.index("--workers") + 1]) if "--workers" in sx_flags else 1
            threads = a.threads or max(1, cores // workers)
            run_env = {**env, "OMP_NUM_THREADS": str(threads)}
            inputs = (["--inputs", str(sextant_inputs(a.workload, steps)), "--clip", "0"]
                      if variant == "sxinputs" else [])
            if variant == "keep":  # the expert keeps freed memory as sextant's workers do
                inputs.append("--keep-freed-memory")
            sx_env = {**run_env, "SEXTANT_MALLOC": "system"} if variant == "system" else run_env

            def sextant_side(cpus: list[int] | None = None, ends: list | None = None):  # noqa: ANN202
                return run_sextant(
                    a.workload, sx_flags + ["--steps", str(steps)], threads, sx_env,
                    workers if a.stop_parent or variant == "stopped" else 0, cpus, ends)

            def expert_side(cores: list[int] | None = sextant_cores(workers, threads)):  # noqa: ANN202
                return run_expert(script, ex_flags + shape_flags + inputs, threads, run_env,
                                  cores)

            if a.concurrent:
                if workers != 1 or threads != 1 or a.stop_parent or variant == "stopped":
                    raise SystemExit("--concurrent: single-process configurations, "
                                     "--threads 1, launcher running")
                # Round r: sextant on core r % 2, the expert on the other one, at once.
                from concurrent.futures import ThreadPoolExecutor

                core, sx_ends = r % 2, []
                with ThreadPoolExecutor(2) as pool:
                    fs = pool.submit(sextant_side, [core], sx_ends)
                    fe = pool.submit(expert_side, [1 - core])
                    (st, sx_losses), report = fs.result(), fe.result()
                st, et = overlapping(st, sx_ends, report["step_times_s"],
                                     report["step_end_unix"], warm)
            else:
                # Counterbalanced: sextant first in odd rounds, the expert first in even
                # ones, so that whatever favours a position in the sequence (what ran just
                # before, a slow drift of the machine) falls on both sides equally.
                if r % 2 == 0:
                    (st, sx_losses), report = sextant_side(), expert_side()
                else:
                    report = expert_side()
                    st, sx_losses = sextant_side()
                st, et = st[warm:], report["step_times_s"][warm:]
            if report["params"] != n_params:  # not the same model: the ratio would mean nothing
                raise SystemExit(f"{script}: {report['params']} parameters, sextant's model has "
                                 f"{n_params}")
            if variant == "sxinputs":
                # Same weights, same batches: the two loss curves must agree (the expert's
                # step computes what sextant's does), up to float reassociation.
                gap = max(abs(x - y) for x, y in zip(sx_losses, report["losses"]))
                results[name].setdefault("max_abs_loss_gap", []).append(gap)
                print(f"round {r + 1} {name}: max |sextant loss - expert loss| over {steps} "
                      f"steps {gap:.2e}", flush=True)
            s, e = statistics.median(st), statistics.median(et)
            results[name]["sextant"].append(s)
            results[name]["expert"].append(e)
            # The 10th percentile of each run's steps: the least disturbed steps, for reading
            # a round hit by another program's burst (the median stays the headline figure).
            results[name].setdefault("sextant_p10", []).append(p10(st))
            results[name].setdefault("expert_p10", []).append(p10(et))
            results[name].setdefault("sextant_steps", []).append(st)
            results[name].setdefault("expert_steps", []).append(et)
            results[name]["threads"] = threads
            print(f"round {r + 1} {name:<20} sextant {s * 1e3:8.2f} ms  expert {e * 1e3:8.2f} ms  "
                  f"ratio {s / e:.3f}  (p10 ratio {p10(st) / p10(et):.3f})  load {load()[0]}",
                  flush=True)
    loads["after"] = load()
    print(f"\nload average after {loads['after']}")
    print(f"{'config':<20} {'sextant ms':>10} {'expert ms':>10} {'ratio':>7} "
          f"{'per-round median':>16} {'min-max':>13} {'bootstrap 95%':>15} rounds {'p10 ratio':>9}")
    summary = {}
    for name in names:
        s, e = results[name]["sextant"], results[name]["expert"]
        ratios = [x / y for x, y in zip(s, e)]
        lo, hi = bootstrap_median(ratios)
        row = {"sextant_ms": statistics.median(s) * 1e3, "expert_ms": statistics.median(e) * 1e3,
               "ratio": statistics.median(s) / statistics.median(e),
               "round_ratio_median": statistics.median(ratios),
               "round_ratio_min": min(ratios), "round_ratio_max": max(ratios),
               "bootstrap_95": [lo, hi], "rounds": len(ratios),
               "threads": results[name]["threads"],
               "p10_ratio": statistics.median(results[name]["sextant_p10"])
               / statistics.median(results[name]["expert_p10"])}
        summary[name] = row
        print(f"{name:<20} {row['sextant_ms']:10.2f} {row['expert_ms']:10.2f} {row['ratio']:7.3f} "
              f"{row['round_ratio_median']:16.3f} {min(ratios):6.3f}-{max(ratios):.3f} "
              f"{lo:7.3f}-{hi:.3f} {len(ratios):6d} {row['p10_ratio']:9.3f}")
    out = Path(a.out) if a.out else (ROOT / "benchmarks" / "results" / (
        f"expert_ratio-{Path(a.workload).stem}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": sys.argv, "started": started, "load_average": loads,
                               "concurrent": a.concurrent,
                               "workload": a.workload, "steps": steps, "warmup_excluded": warm,
                               "summary": summary, "raw": results}, indent=1))
    print(f"written {out}")


if __name__ == "__main__":
    main()
