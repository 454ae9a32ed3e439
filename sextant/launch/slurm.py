"""`sextant run --launcher slurm`: the run's ranks as the tasks of a Slurm job.

Outside an allocation sextant writes a batch script and submits it with `sbatch --wait`;
inside one (SLURM_JOB_ID is set, e.g. under `salloc`) it starts the tasks with `srun`. Each
task runs `sextant join`, which takes its rank, world and node from Slurm's variables. This
process hosts the run's collector (collector.py) on the address it uses to reach the Slurm
controller, so the plan goes out and the events and results come back over TCP: no shared
filesystem is needed, and the run lands in this host's results database like a local one.
`--dry-run` prints the script; submitted by hand it still works, with rank 0 storing the run
on its own node (see join.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.contracts import RankResult
from sextant.core.errors import RunFailed, UserError
from sextant.launch.collector import ENV, SECRET_ENV, Collector, gather, new_secret
from sextant.core.paths import RESULTS_DIR
from sextant.strategy import Strategy

if TYPE_CHECKING:
    from sextant.launch.local import EventHandler, Launcher
    from sextant.workloads.spec import Workload

SUBMIT_TIMEOUT_S = 30.0
_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}(,[A-Za-z0-9_.-]{1,64}){0,31}")
OUTPUT = "/tmp/sextant-slurm-{job_id}.out"
"""The job's output file on its first node (the batch script's --output, %j its job id)."""


@dataclass(frozen=True, slots=True)
class Job:
    nodes: int
    tasks_per_node: int
    partition: str | None
    time_limit_s: float
    join_args: tuple[str, ...]
    """`sextant join` arguments that rebuild the run's workload and strategy."""
    label: str
    python: str = sys.executable
    """The interpreter every task runs `sextant join` with: this one, or the framework's
    environment (sextant.core.envs), which holds sextant too."""
    gpus_per_node: int = 0
    """GPUs requested per node: one per task on GPU runs (each task then keeps its local
    rank's, sextant.core.devices.pin_rank), none on CPU runs."""

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @classmethod
    def for_run(cls, strategy: Strategy, *, workload: str, timeout_s: float,
                collective_timeout_s: float, steps: int | None = None,
                nodes: int | None = None, tasks_per_node: int | None = None,
                partition: str | None = None) -> Job:
        """The job of one run: its ranks over `nodes` x `tasks_per_node` (by default one node
        per rank, or the ranks spread evenly over the nodes given)."""
        from sextant.backends.base import layout_of, python_for

        world = len(layout_of(strategy).roles)
        n = nodes if nodes is not None else (
            world // tasks_per_node if tasks_per_node else world)
        per_node = tasks_per_node or (world // n if n and world % n == 0 else 0)
        if n < 1 or per_node < 1 or n * per_node != world:
            raise UserError(
                f"{strategy.label} runs {world} processes: --nodes ({nodes}) x "
                f"--tasks-per-node ({tasks_per_node}) must equal {world}")
        if partition is not None and not _PARTITION.fullmatch(partition):
            raise UserError(f"--partition must be a Slurm partition name or a comma-separated "
                            f"list of them ({_PARTITION.pattern}). Received: "
                            f"{partition[:80]!r}")
        return cls(nodes=n, tasks_per_node=per_node, partition=partition,
                   time_limit_s=timeout_s,
                   join_args=tuple(join_args(strategy, workload=workload, timeout_s=timeout_s,
                                             collective_timeout_s=collective_timeout_s,
                                             steps=steps)),
                   label=strategy.label, python=python_for(strategy.framework),
                   gpus_per_node=per_node if strategy.device == "gpu" else 0)


def join_args(strategy: Strategy, *, workload: str, timeout_s: float,
              collective_timeout_s: float, steps: int | None = None) -> list[str]:
    """The flags of `sextant join` for this run (the same run on every task): the workload
    and limits, then every field of the strategy (Strategy.to_flags)."""
    out = ["--workload", workload, "--collective-timeout", f"{collective_timeout_s:g}",
           "--timeout", f"{timeout_s:g}"]
    if steps is not None:
        out += ["--steps", str(steps)]
    return out + strategy.to_flags()


def _time(seconds: float) -> str:
    s = max(60, int(seconds) + 60)  # a minute for start-up and the results
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def batch_script(job: Job) -> str:
    """The batch script `sextant run --launcher slurm` submits (printed by --dry-run)."""
    directives = [f"--job-name=sextant-{re.sub(r'[^A-Za-z0-9_.-]+', '-', job.label)}",
                  f"--nodes={job.nodes}", f"--ntasks-per-node={job.tasks_per_node}",
                  f"--time={_time(job.time_limit_s)}",
                  f"--output={OUTPUT.format(job_id='%j')}"]
    if job.partition:
        directives.append(f"--partition={job.partition}")
    if job.gpus_per_node:
        directives.append(f"--gpus-per-node={job.gpus_per_node}")
    join = shlex.join([job.python, "-m", "sextant.cli", "join", *job.join_args])
    for value in (*directives, job.python, *job.join_args):
        if any(ord(c) < 32 or c == "\x7f" for c in value):  # a line of its own in the script
            raise UserError(f"a control character would reach the Slurm batch script: "
                            f"{value[:80]!r}")
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "# Written by sextant. Each task runs `sextant join`, which reads its rank from",
        "# SLURM_PROCID/SLURM_NTASKS/SLURM_JOB_NODELIST. With SEXTANT_COLLECTOR set (sextant",
        "# sets it when it submits) results go back to the submitting host; without it,",
        f"# rank 0 stores the run on the first node (its --db, default ./{RESULTS_DIR}).",
        "# Every task needs the run's secret: export SEXTANT_COLLECTOR_SECRET (64 hex digits)",
        "# before sbatch, or SEXTANT_COLLECTOR_SECRET_FILE naming a file that holds it.",
        "set -euo pipefail",
        f"srun --kill-on-bad-exit=1 --wait=60 {join}",
        "",
    ])


def _collector_bind() -> str:
    """This host's address on the network the cluster reaches it by: SEXTANT_COLLECTOR_ADDR,
    else the source address of the route to the Slurm controller."""
    if os.environ.get("SEXTANT_COLLECTOR_ADDR"):
        return os.environ["SEXTANT_COLLECTOR_ADDR"]
    controller = _controller_address()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((controller, 6817))  # UDP: no packet is sent, only the route is chosen
        return str(s.getsockname()[0])


def _controller_address() -> str:
    out = _slurm("scontrol", "show", "config").stdout
    m = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^(\s]+)(?:\(([^)]+)\))?", out, re.M)
    if not m:
        raise UserError("cannot find SlurmctldHost in 'scontrol show config'; set "
                        "SEXTANT_COLLECTOR_ADDR to this host's address on the cluster network")
    return m.group(2) or socket.gethostbyname(m.group(1))


def _slurm(*argv: str, timeout: float = SUBMIT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise UserError(f"--launcher slurm needs Slurm's {argv[0]} on PATH (Debian: apt-get "
                        f"install slurm-client)")
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(f"'{' '.join(argv)}' did not answer in {timeout:g} s") from exc
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"'{' '.join(argv)}' failed: {err}")
    return proc


def launcher(job: Job) -> Launcher:
    """A launcher for runner.execute: submit (or srun) the job, host the collector, gather."""
    from sextant.backends.base import layout_of
    from sextant.launch.local import base_plan

    def launch(workload: Workload, strategy: Strategy, run_dir: Path, *, timeout_s: float,
               collective_timeout_s: float, on_event: EventHandler | None = None,
               extra_env: dict[str, str] | None = None, resume_step: int | None = None,
               **_: Any) -> list[RankResult]:
        layout = layout_of(strategy)
        plan = base_plan(workload, strategy, run_dir, layout.roles, collective_timeout_s,
                         resume_step)
        secret = new_secret()
        collector = Collector(_collector_bind(), plan, job.tasks, secret=secret,
                              join_timeout_s=collective_timeout_s + 60)
        # sbatch and srun pass this environment to every task (never the script's text).
        env = {**os.environ, **(extra_env or {}), ENV: collector.address,
               SECRET_ENV: secret.hex()}
        job_id: list[str] = []
        proc = _start(job, env, run_dir, job_id)
        try:
            def ended() -> str | None:
                code = proc.poll()
                return None if code is None else f"the Slurm job ended (exit code {code})"

            return gather(collector, layout.primary, label=strategy.label, on_event=on_event,
                          deadline=time.monotonic() + timeout_s, alive=ended)
        except RunFailed as exc:
            if not job_id:
                raise
            raise RunFailed(f"{exc} ({job_state(job_id[0])})") from exc
        finally:
            if proc.poll() is None:
                if job_id:
                    subprocess.run(["scancel", job_id[0]], check=False, timeout=SUBMIT_TIMEOUT_S,
                                   capture_output=True)
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            collector.close()

    return launch


def job_state(job_id: str) -> str:
    """What Slurm says of a job, for an error message: its state, the reason it waits and
    its nodes (squeue), and the last line of its output file when this host can read it."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r %N"], check=False,
                              capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL)
        fields = proc.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        fields = []
    if len(fields) >= 2:
        state = f"Slurm job {job_id}: {fields[0]}, reason {fields[1]}"
        state += f", on {fields[2]}" if len(fields) > 2 else ""
    else:
        state = f"Slurm job {job_id}: no longer in squeue"
    try:
        lines = [ln.strip() for ln in Path(OUTPUT.format(job_id=job_id)).read_text(
            errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return state + (f"; its output ends: {lines[-1][:300]}" if lines else "")


def _start(job: Job, env: dict[str, str], run_dir: Path, job_id: list[str]
           ) -> subprocess.Popen[str]:
    """`srun` inside an allocation, else `sbatch --wait` of the batch script. The job id (for
    scancel) is appended to `job_id` once known."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("SLURM_JOB_ID"):
        _slurm("srun", "--version")
        cmd = ["srun", f"--nodes={job.nodes}", f"--ntasks-per-node={job.tasks_per_node}",
               "--kill-on-bad-exit=1", "--wait=60", job.python, "-m", "sextant.cli",
               "join", *job.join_args]
        job_id.append(os.environ["SLURM_JOB_ID"])
    else:
        _slurm("sbatch", "--version")
        script = run_dir / "job.sbatch"
        script.write_text(batch_script(job))
        cmd = ["sbatch", "--wait", "--parsable", str(script)]
    with open(run_dir / "slurm.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                stdin=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    if not job_id and proc.stdout is not None:
        first = proc.stdout.readline().strip()  # --parsable: the job id, at submission
        if first:
            job_id.append(first.split(";")[0])
    return proc
