"""Ranks started by a cluster's own launcher: a real Slurm (slurmctld and one slurmd per
emulated host, munge) through `sextant run --launcher slurm`, and torchrun-style variables
through `sextant join`. Results come back over the collector's TCP connection."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sextant.cluster import emulated, slurm_lab
from sextant.core.errors import UserError
from sextant.launch.collector import SECRET_ENV, new_secret
from sextant.launch.join import first_host, identity_from_env, tasks_per_node
from sextant.launch.local import free_port
from sextant.results.store import ResultsStore
from sextant.runner import execute
from sextant.strategy import Strategy
from sextant.sources import resolve_workload
from tests.helpers import needs_torch, run_cli, same_training, tiny_gpt_file


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gpt_file(tmp_path_factory.mktemp("w") / "tiny-join.toml", "tiny-join", 4)


@pytest.fixture(scope="module")
def one_process(workload_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("torch")
    return execute(resolve_workload(str(workload_file)),
                   Strategy(framework="torch", mode="eager"),
                   runs_dir=tmp_path_factory.mktemp("one"))


# --- identity from the launcher's variables (pure) ----------------------------------------

def test_torchrun_variables_give_the_identity() -> None:
    ident = identity_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n0",
                               "MASTER_PORT": "29500"})
    assert (ident.rank, ident.world, ident.local_rank, ident.local_world, ident.source) == (
        3, 4, 1, 2, "torchrun")


def test_slurm_variables_give_the_identity() -> None:
    ident = identity_from_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1",
                               "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x3),1",
                               "SLURM_JOB_NODELIST": "gpu[07-10],cpu1"})
    assert (ident.rank, ident.world, ident.local_world, ident.master_addr, ident.source) == (
        5, 7, 2, "gpu07", "slurm")
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert first_host("a,b") == "a" and first_host("node[3,5-6]") == "node3"


def test_join_without_a_launcher_is_a_one_line_error() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    out = subprocess.run([sys.executable, "-m", "sextant.cli", "join"], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "RANK, WORLD_SIZE, MASTER_ADDR" in out.stderr
    with pytest.raises(UserError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node("2(y3)")


def test_dry_run_prints_the_batch_script(workload_file: Path) -> None:
    out = run_cli("run", "--launcher", "slurm", "--parallel", "dp", "--workers", "4",
                  "--nodes", "2", "--workload", str(workload_file), "--dry-run", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --nodes=2" in out.stdout and "#SBATCH --ntasks-per-node=2" in out.stdout
    assert "sextant.cli join --workload" in out.stdout
    bad = run_cli("run", "--launcher", "slurm", "--parallel", "dp", "--workers", "3",
                  "--nodes", "2", "--dry-run", timeout=120)
    assert bad.returncode == 2 and "must equal 3" in bad.stderr


# --- real runs -----------------------------------------------------------------------------

@pytest.mark.slow
@needs_torch
def test_ranks_started_by_torchrun_store_one_run_on_rank_0(
    workload_file: Path, one_process: dict, tmp_path: Path
) -> None:
    """torchrun starts two `sextant join` processes: rank 0 hosts the collector and stores
    the run, which trained what one process trains."""
    sextant = Path(sys.executable).parent / "sextant"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         "2", "--master-port", str(free_port()), "--no-python", str(sextant), "join",
         "--workload", str(workload_file), "--parallel", "dp", "--db", str(tmp_path / "r.db"),
         "--collective-timeout", "60"],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
        env={**os.environ, SECRET_ENV: new_secret().hex()})
    assert out.returncode == 0, out.stderr[-2000:]
    with ResultsStore(tmp_path / "r.db", create=False) as store:
        (run,) = store.runs()  # one run, stored once, by rank 0
        stored = store.get(run.id)
    same_training(stored, one_process)


slurm_present = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("slurmd") is None,
    reason="needs root, iproute2 and Debian's slurm-wlm and munge")


@pytest.fixture(scope="module")
def slurm_cluster() -> emulated.Cluster:
    name = f"s{os.getpid() % 10000}"
    cluster = emulated.up(name, 2, emulated.Link(rate_bit_s=10e9))
    try:
        slurm_lab.start(cluster)
        yield cluster
    finally:
        emulated.down(name)


@pytest.mark.slow
@slurm_present
@needs_torch
def test_a_slurm_job_across_two_hosts_trains_like_one_process(
    slurm_cluster: emulated.Cluster, workload_file: Path, one_process: dict, tmp_path: Path
) -> None:
    db = tmp_path / "r.db"
    out = run_cli("run", "--launcher", "slurm", "--parallel", "dp", "--workers", "2",
                  "--workload", str(workload_file), "--db", str(db), "--timeout", "240",
                  env={"SLURM_CONF": str(slurm_lab.conf_path(slurm_cluster))}, timeout=300)
    assert out.returncode == 0, out.stderr + daemon_logs(slurm_cluster)
    with ResultsStore(db, create=False) as store:
        (run,) = store.runs()
        stored = store.get(run.id)
    same_training(stored, one_process)
    assert [r.fingerprint["hostname"] for r in stored.ranks] == [
        h.name for h in slurm_cluster.hosts]
    assert stored.fingerprint.values["network"]["kind"] == "hosts"


def daemon_logs(cluster: emulated.Cluster, lines: int = 15) -> str:
    """The end of each Slurm daemon's log, for a failed assertion's message."""
    out = []
    for log in sorted(slurm_lab.conf_dir(cluster).glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"\n--- {log.name}\n" + "\n".join(tail))
    return "".join(out)


@pytest.mark.slow
@slurm_present
@needs_torch
def test_a_job_that_cannot_start_is_reported_with_its_slurm_state(
    slurm_cluster: emulated.Cluster, workload_file: Path, tmp_path: Path
) -> None:
    """While another job holds both nodes, sextant's job waits in the queue; when the run's
    time is up the error says so (state and reason from squeue), and the run is stored as
    failed."""
    env = {**os.environ, "SLURM_CONF": str(slurm_lab.conf_path(slurm_cluster))}
    blocker = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--output=/dev/null",
                              "--wrap", "sleep 120"], check=True, capture_output=True,
                             text=True, timeout=30, env=env).stdout.strip().split(";")[0]
    try:
        db = tmp_path / "r.db"
        out = run_cli("run", "--launcher", "slurm", "--parallel", "dp", "--workers", "2",
                      "--workload", str(workload_file), "--db", str(db), "--timeout", "15",
                      env=env, timeout=120)
        assert out.returncode != 0 and out.stderr.count("\n") == 1, out.stderr
        assert "never joined the run" in out.stderr and "PENDING, reason " in out.stderr, (
            out.stderr + daemon_logs(slurm_cluster))
        with ResultsStore(db, create=False) as store:
            assert [run.status for run in store.runs()] == ["failed"]
    finally:
        subprocess.run(["scancel", blocker], check=False, timeout=30, env=env)
        slurm_lab.wait_idle(slurm_cluster)


@pytest.mark.slow
@slurm_present
def test_slurm_down_leaves_no_daemon_and_no_namespace() -> None:
    before = emulated.namespaces()
    name = f"z{os.getpid() % 10000}"
    cluster = emulated.up(name, 2, emulated.Link(rate_bit_s=1e9))
    try:
        slurm_lab.start(cluster)
        pids = subprocess.run(["ip", "netns", "pids", cluster.hosts[1].netns], check=True,
                              capture_output=True, text=True, timeout=10).stdout.split()
        assert pids  # slurmd runs inside the host
    finally:
        emulated.down(name)
    assert emulated.namespaces() == before
    assert not any(emulated.running(int(pid)) for pid in pids)
    assert not (emulated.STATE_DIR / name).exists()


@pytest.mark.slow
@slurm_present
@needs_torch
def test_a_slurm_job_checkpoints_and_a_second_one_resumes(
    slurm_cluster: emulated.Cluster, workload_file: Path, one_process: dict, tmp_path: Path
) -> None:
    """Checkpointing and resume travel to every task of a Slurm job (Strategy.to_flags): the
    first job's rank 0 is killed after step 3, leaving the step-2 checkpoint sealed; a second
    job with --resume trains steps 3-4 from it, as one process trains them."""
    env = {"SLURM_CONF": str(slurm_lab.conf_path(slurm_cluster))}
    db, ckpt = tmp_path / "r.db", tmp_path / "ckpt"
    flags = ["run", "--launcher", "slurm", "--parallel", "dp", "--workers", "2", "--workload",
             str(workload_file), "--db", str(db), "--timeout", "240", "--checkpoint-every",
             "2", "--checkpoint-dir", str(ckpt)]
    killed = run_cli(*flags, env={**env, "SEXTANT_TEST_FAULT": "kill-rank-0-at-3"},
                     timeout=300)
    assert killed.returncode != 0, killed.stdout
    assert [p.name for p in sorted(ckpt.iterdir())] == ["step-00000002"], (
        killed.stderr + daemon_logs(slurm_cluster))
    resumed = run_cli(*flags, "--resume", env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr + daemon_logs(slurm_cluster)
    with ResultsStore(db, create=False) as store:
        (run,) = [r for r in store.runs() if r.status == "ok"]
        stored = store.get(run.id)
    assert stored.strategy.resume and stored.metrics.resumed_from_step == 2
    assert stored.ranks[0].details["notes"] == ("resumed from step-00000002",)
    same_training(stored, one_process, b_from=2)
