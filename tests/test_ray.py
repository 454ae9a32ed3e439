"""`sextant run --launcher ray` on a real Ray cluster: `sextant cluster up NAME --ray` starts
`ray start --head` and a worker node in the namespaces of an emulated cluster, and every test
below shares that one cluster (brought up once, torn down even when a test fails). The ranks
are sextant's own `sextant join`, placed by one Ray placement group, reporting through the
authenticated collector.

Order matters in this module: the node-kill test takes a node away, and the last test takes
the cluster down and checks that nothing of it is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sextant.cluster import emulated, ray_lab
from sextant.core.paths import runs_beside
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
from sextant.runner import execute
from sextant.sources import resolve_workload
from sextant.strategy import Strategy
from tests.helpers import run_cli, same_training, tiny_gpt_file

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                       reason="an emulated cluster needs root and iproute2"),
    pytest.mark.skipif(shutil.which("ray", path=str(Path(sys.executable).parent)) is None,
                       reason="needs Ray beside this interpreter (pip install 'sextant[ray]')"),
]

NAME = f"y{os.getpid() % 10000}"
RUN_TIMEOUT_S = 180


def _pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], check=False, capture_output=True,
                         text=True, timeout=10).stdout
    return [int(p) for p in out.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def cluster() -> emulated.Cluster:
    out = run_cli("cluster", "up", NAME, "--hosts", "2", "--link", "10gbit", "--ray",
                  timeout=120)
    try:
        assert out.returncode == 0, out.stderr
        yield emulated.load(NAME)
    finally:
        emulated.down(NAME)


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gpt_file(tmp_path_factory.mktemp("w") / "tiny-ray.toml", "tiny-ray", 6)


@pytest.fixture(scope="module")
def local_run(cluster: emulated.Cluster, workload_file: Path,
              tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The reference: the local launcher, torch dp x2 on the same two hosts."""
    pytest.importorskip("torch")
    return execute(resolve_workload(str(workload_file)),
                   Strategy(framework="torch", mode="eager", parallel="dp", workers=2),
                   runs_dir=tmp_path_factory.mktemp("local"), cluster=cluster.name)


def _ray_run(workload_file: Path, db: Path, *flags: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return run_cli("run", "--launcher", "ray", "--workload", str(workload_file), "--db",
                   str(db), "--timeout", str(RUN_TIMEOUT_S), "--collective-timeout", "30",
                   *flags, env=env, timeout=RUN_TIMEOUT_S + 60)


def test_bad_ray_flags_are_one_line_errors() -> None:
    out = run_cli("run", "--ray-address", "10.0.0.1:6379", timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--ray-address goes with --launcher ray" in out.stderr
    out = run_cli("run", "--launcher", "ray", "--ray-address", "head node", timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "a Ray address must be HOST:PORT" in out.stderr
    out = run_cli("run", "--launcher", "ray", "--ray-address", "127.0.0.1:1", timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot reach the Ray head at 127.0.0.1:1" in out.stderr


def test_cluster_up_ray_starts_a_node_on_every_host(cluster: emulated.Cluster) -> None:
    record = ray_lab.record(cluster.name)
    assert record is not None and record["address"] == f"{cluster.hosts[0].address}:6379"
    deadline = time.monotonic() + 30
    while True:  # Ray's autoscaler status lags the nodes' registration by a few seconds
        status = subprocess.run(
            ["ip", "netns", "exec", cluster.hosts[0].netns,
             str(Path(sys.executable).parent / "ray"), "status", "--address", record["address"]],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        assert status.returncode == 0, status.stderr
        active = status.stdout.partition("Active:")[2].split("Pending:")[0]
        if active.count(" node_") == len(cluster.hosts) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert active.count(" node_") == len(cluster.hosts), status.stdout
    for host in cluster.hosts:  # each node: its own address and temp dir, no dashboard UI
        raylet = [_cmdline(p) for p in _pids(host.netns) if "raylet/raylet" in _cmdline(p)]
        assert len(raylet) == 1
        assert f"--node_ip_address={host.address}" in raylet[0]
        assert f"--temp_dir={ray_lab.TEMP_ROOT / cluster.name / f'h{host.index}'}" in raylet[0]
        assert f"--object_store_memory={record['object_store_bytes']}" in raylet[0]
        assert not any("--disable-frontend" not in _cmdline(p) and "dashboard.py" in _cmdline(p)
                       for p in _pids(host.netns))


def _trained_on_ray(workload_file: Path, tmp_path: Path, framework: str) -> RunRecord:
    """The stored run of `sextant run --launcher ray --parallel dp --workers 2`."""
    db = tmp_path / "r.db"
    out = _ray_run(workload_file, db, "--framework", framework, "--parallel", "dp",
                   "--workers", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    with ResultsStore(db, create=False) as store:
        (run,) = store.runs()
        return store.get(run.id)


@pytest.mark.slow
def test_torch_dp_on_ray_trains_like_the_local_launcher(
    cluster: emulated.Cluster, workload_file: Path, local_run: dict, tmp_path: Path
) -> None:
    """`sextant run --launcher ray` finds the cluster's recorded head, spreads one rank per
    node, and trains what the local launcher trains on the same hosts; the run is stored
    with each rank's Ray node."""
    stored = _trained_on_ray(workload_file, tmp_path, "torch")
    same_training(stored, local_run)
    ray = stored.fingerprint.values["ray"]
    assert ray["address"] == ray_lab.record(cluster.name)["address"]
    assert ray["placement_strategy"] == "STRICT_SPREAD"
    by_rank = {r["rank"]: r for r in ray["ranks"]}
    hosts = {h.name: h.address for h in cluster.hosts}
    assert sorted(r["hostname"] for r in ray["ranks"]) == sorted(hosts)  # one rank a node
    for rank in stored.ranks:  # each rank ran on the node Ray placed it on
        placed = by_rank[rank.rank]
        assert rank.fingerprint["hostname"] == placed["hostname"]
        assert hosts[placed["hostname"]] == placed["address"]
    assert stored.fingerprint.network["kind"] == "emulated"


@pytest.mark.slow
def test_jax_dp_on_ray_trains_like_the_local_launcher(
    cluster: emulated.Cluster, workload_file: Path, local_run: dict, tmp_path: Path
) -> None:
    """JAX's own multi-process runtime (jax.distributed.initialize, as sextant's worker does
    on every launcher) across the Ray nodes."""
    pytest.importorskip("jax")
    stored = _trained_on_ray(workload_file, tmp_path, "jax")
    same_training(stored, local_run)
    assert len({r["hostname"] for r in stored.fingerprint.values["ray"]["ranks"]}) == 2


def _set_cluster_version(cluster: emulated.Cluster, version: str) -> str:
    """Write `version` where the head recorded its Ray version (the GCS's cluster metadata,
    which ray.init compares too); returns the one it replaced."""
    code = (
        "import json, sys\n"
        "from ray._raylet import GcsClient\n"
        "from ray._common.usage.usage_constants import CLUSTER_METADATA_KEY as key\n"
        "from ray._private.ray_constants import KV_NAMESPACE_CLUSTER as ns\n"
        "gcs = GcsClient(address=sys.argv[1])\n"
        "meta = json.loads(gcs.internal_kv_get(key, namespace=ns))\n"
        "print(meta['ray_version'])\n"
        "meta['ray_version'] = sys.argv[2]\n"
        "gcs.internal_kv_put(key, json.dumps(meta).encode(), overwrite=True, namespace=ns)\n")
    out = subprocess.run(["ip", "netns", "exec", cluster.hosts[0].netns, sys.executable, "-c",
                          code, ray_lab.record(cluster.name)["address"], version],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()[-1]


def test_a_cluster_of_another_ray_version_is_refused_in_one_line(
    cluster: emulated.Cluster, workload_file: Path, tmp_path: Path
) -> None:
    """The head's GCS says another Ray version (as a cluster started with 2.59 says it):
    the run stops before placing anything, in one line naming both versions."""
    ours = _set_cluster_version(cluster, "2.59.0")
    try:
        out = _ray_run(workload_file, tmp_path / "r.db", "--framework", "torch",
                       "--parallel", "dp", "--workers", "2")
    finally:
        _set_cluster_version(cluster, ours)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1, out.stderr
    assert f"runs Ray 2.59.0, this host {ours}" in out.stderr
    if (tmp_path / "r.db").exists():
        with ResultsStore(tmp_path / "r.db", create=False) as store:
            assert not store.runs()


@pytest.mark.slow
def test_a_ray_node_killed_mid_run_fails_the_run_naming_it(
    cluster: emulated.Cluster, tmp_path: Path
) -> None:
    """Every process of the worker node's host dies (its raylet, its Ray worker, its rank)
    while the run trains: the run is stored as failed with that node named, in seconds, and
    nothing of the run is left running on the nodes."""
    pytest.importorskip("torch")
    workload_file = tiny_gpt_file(tmp_path / "long.toml", "tiny-ray-long", 5000)
    db = tmp_path / "r.db"
    cmd = [sys.executable, "-m", "sextant.cli", "run", "--launcher", "ray", "--workload",
           str(workload_file), "--db", str(db), "--timeout", str(RUN_TIMEOUT_S),
           "--collective-timeout", "30", "--framework", "torch", "--parallel", "dp",
           "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = cluster.hosts[1]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                '"event": "step"' in p.read_text(errors="replace")
                for p in runs_beside(db).glob("*/rank*.events.jsonl")):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        assert time.monotonic() < deadline, "the run never reached its first step"
        for pid in _pids(victim.netns):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-2000:]
    assert time.monotonic() - killed < 60
    assert f"Ray node {victim.name} ({victim.address}" in err and "died" in err, err[-2000:]
    with ResultsStore(db, create=False) as store:
        (run,) = store.runs()
        assert run.status == "failed"
        assert victim.name in store.get(run.id).metrics.error
    time.sleep(1.0)  # Ray ends the job's workers once its driver is gone
    for host in cluster.hosts:
        left = [_cmdline(p) for p in _pids(host.netns) if any(
            what in _cmdline(p) for what in ("sextant.cli", "sextant.launch", "run_rank"))]
        assert not left, left


def test_cluster_down_stops_ray_and_leaves_nothing(cluster: emulated.Cluster) -> None:
    pids = [p for h in cluster.hosts for p in _pids(h.netns)]
    assert any("gcs_server" in _cmdline(p) for p in pids)
    out = run_cli("cluster", "down", cluster.name, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not any(emulated.running(p) for p in pids)
    assert not [ns for ns in emulated.namespaces() if ns.startswith(f"sextant-{cluster.name}-")]
    assert ray_lab.record(cluster.name) is None
    assert not (ray_lab.TEMP_ROOT / cluster.name).exists()
    assert f"cluster {cluster.name}:" not in run_cli("cluster", "status", timeout=60).stdout
