"""Kept as run for docs/benchmarks.md (issue #20); see README.md here."""
# ruff: noqa: E401, E402, E501, E701, E702, E731, F401, I001, E741
import subprocess, sys, time, os, signal, json, tempfile, glob, statistics
steps = 400
with tempfile.TemporaryDirectory() as tmp:
    p = subprocess.Popen([sys.executable, "-c", "from sextant.cli import main; main()", "run", "--workload",
        str(__import__("pathlib").Path(__file__).resolve().parents[1] / "expert" / "gpt-issue20.toml"), "--db", tmp + "/r.db", "--steps", str(steps)],
        cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2])})
    # wait for step 20 in events
    ev = None
    while ev is None:
        time.sleep(0.2)
        g = glob.glob(tmp + "/runs/*/rank0.events.jsonl")
        if g: ev = g[0]
    def nsteps():
        return sum(1 for l in open(ev) if '"step"' in l and '"event": "step"' in l)
    while nsteps() < 40: time.sleep(0.1)
    windows = []
    for k in range(6):  # alternate parent stopped / running, ~1.5 s each
        stopped = k % 2 == 0
        if stopped: os.kill(p.pid, signal.SIGSTOP)
        a = nsteps(); time.sleep(1.5); b = nsteps()
        if stopped: os.kill(p.pid, signal.SIGCONT)
        windows.append((stopped, a, b))
    p.wait()
    res = json.load(open(glob.glob(tmp + "/runs/*/rank0.result.json")[0]))["step_times_s"]
    for stopped, a, b in windows:
        seg = res[a + 1:b - 1]
        print("parent", "STOPPED" if stopped else "running", f"steps {a}-{b}", f"median {statistics.median(seg)*1e3:.2f} ms p10 {sorted(seg)[len(seg)//10]*1e3:.2f}")
