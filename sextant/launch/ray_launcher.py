"""`sextant run --launcher ray`: the run's ranks as the tasks of one Ray placement group.

This process hosts the run's collector, as for Slurm and Kubernetes, and starts the Ray
driver (sextant.launch.ray_driver) as a child process: on this host when it is a node of the
cluster or the address is a Ray Client one (`ray://head:10001`), or inside the head's
network namespace on an emulated cluster (`sextant cluster up NAME --ray`). The driver places
one bundle per rank and runs `sextant join` in each; the ranks report here through the
authenticated collector, and the run is stored here with each rank's Ray node.

Where the cluster is: --ray-address, else RAY_ADDRESS, else the emulated cluster that runs
Ray on this machine (sextant.commands.run resolves it; this module never looks at emulated
clusters, which live a layer above).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.contracts import RankResult
from sextant.core.errors import RunFailed, UserError
from sextant.launch.collector import ENV, SECRET_ENV, Collector, gather, new_secret

if TYPE_CHECKING:
    from sextant.launch.local import EventHandler, Launcher
    from sextant.strategy import Strategy
    from sextant.workloads.spec import Workload

START_UP_S = 90.0
"""Added to the run's timeouts for the driver: importing Ray, connecting, placing."""
STOP_S = 15.0
"""How long the driver may take to remove its placement group after SIGTERM."""
FAILURE_GRACE_S = 20.0
"""After a rank fails, how long to wait for the driver to say which Ray node it lost (Ray
marks a node dead after its health checks fail)."""
RESULT_GRACE_S = 10.0
"""After the driver ended well, how long the ranks' last results may take to arrive."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """A Ray cluster to launch on, and how to reach it from here."""

    address: str
    """GCS address (host:port) or a Ray Client address (ray://host:port)."""
    prefix: tuple[str, ...] = ()
    """Command prefix that starts the driver on a node (`ip netns exec NS` on an emulated
    cluster); empty when this host is a node, or for Ray Client."""
    node_ip: str | None = None
    """The driver's node address (its raylet's --node-ip-address) when it cannot be found."""
    collector_bind: str | None = None
    """This host's address on the cluster network; None: the route towards the head."""
    name: str | None = None
    """The emulated cluster's name, when there is one."""


@dataclass(frozen=True, slots=True)
class Job:
    cluster: Cluster
    ranks: int
    cpus: float
    """CPUs per bundle (one rank each)."""
    gpus: float
    join_args: tuple[str, ...]
    label: str
    time_limit_s: float
    python: str | None = None
    """The interpreter of `sextant join` on the nodes: None for the node's own (the one its
    Ray workers run), else the framework's environment (sextant.core.envs), at the same path on
    every node."""
    driver_python: str = sys.executable

    @classmethod
    def for_run(cls, strategy: Strategy, cluster: Cluster, *, workload: str, timeout_s: float,
                collective_timeout_s: float, steps: int | None = None) -> Job:
        from sextant.backends.base import layout_of, python_for
        from sextant.launch.slurm import join_args

        world = len(layout_of(strategy).roles)
        framework_python = python_for(strategy.framework)
        return cls(cluster=cluster, ranks=world, cpus=float(strategy.threads or 1),
                   gpus=1.0 if strategy.device == "gpu" else 0.0,
                   join_args=tuple(join_args(strategy, workload=workload, timeout_s=timeout_s,
                                             collective_timeout_s=collective_timeout_s,
                                             steps=steps)),
                   label=strategy.label, time_limit_s=timeout_s,
                   python=None if framework_python == sys.executable else framework_python)


def check_address(address: str) -> str:
    """host:port or ray://host:port, or a one-line error saying so."""
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(
            c.isspace() or ord(c) < 32 for c in address):
        raise UserError(f"a Ray address must be HOST:PORT (the head's GCS, e.g. "
                        f"10.0.0.1:6379) or ray://HOST:PORT (Ray Client). Received: "
                        f"{address[:80]!r}")
    return address


def require_ray() -> str:
    """The installed Ray's version, or a one-line error saying how to install it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        raise UserError("--launcher ray needs Ray on this host (pip install 'sextant[ray]'); "
                        "the nodes need the same version") from None


def _collector_bind(cluster: Cluster) -> str:
    """This host's address towards the cluster: SEXTANT_COLLECTOR_ADDR, the emulated
    cluster's gateway, else the source address of the route to the head."""
    if os.environ.get("SEXTANT_COLLECTOR_ADDR"):
        return os.environ["SEXTANT_COLLECTOR_ADDR"]
    if cluster.collector_bind:
        return cluster.collector_bind
    rest = cluster.address.removeprefix("ray://")
    host, _, port = rest.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), int(port)))  # UDP: only the route is chosen
            return str(s.getsockname()[0])
    except OSError as exc:
        raise UserError(f"cannot find this host's address towards the Ray head {host}: "
                        f"{exc}; set SEXTANT_COLLECTOR_ADDR") from None


class Driver:
    """The driver child process and what it has said so far."""

    def __init__(self, job: Job, order: dict[str, Any], run_dir: Path) -> None:
        cmd = [*job.cluster.prefix, job.driver_python, "-m", "sextant.launch.ray_driver"]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_ADDRESS", None)  # the order names the address
        self.events: list[dict[str, Any]] = []
        self.ended_at: float | None = None
        self.log = run_dir / "ray-driver.log"
        self._lock = threading.Lock()
        with open(self.log, "w") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True,
                                         cwd=tempfile.gettempdir())
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.close()
        self._reader = threading.Thread(target=self._read, name="sextant-ray-driver",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                with self._lock:
                    self.events.append(event)

    def seen(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == kind]

    def problem(self) -> str | None:
        """Why the run cannot go on, from the driver's point of view; None while it may.
        UserError when the driver refused the cluster (another Ray version, no connection)."""
        for kind in ("failed", "error"):
            found = self.seen(kind)
            if found:
                return describe(found[0])
        bad = [e for e in self.seen("exit") if e.get("code")]
        if bad:
            return (f"rank {bad[0]['rank']} on Ray node {node_name(bad[0]['node'])} exited "
                    f"with code {bad[0]['code']}")
        code = self.proc.poll()
        if code is None:
            return None
        self._reader.join(timeout=5)
        refused = self.seen("refused")
        if refused:
            raise UserError(str(refused[0]["message"]))
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        # Every rank ended well: their results may still be on their way to the collector.
        if code == 0 and time.monotonic() - self.ended_at < RESULT_GRACE_S:
            return None
        return f"the Ray driver ended (exit code {code}; its log: {self.log})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


def node_name(node: dict[str, Any]) -> str:
    return f"{node.get('hostname')} ({node.get('address')}, {str(node.get('node_id'))[:12]})"


def describe(event: dict[str, Any]) -> str:
    if event.get("event") == "failed":
        dead = "died" if event.get("node_dead") else "lost the rank's task"
        return (f"Ray node {node_name(event['node'])} {dead}: rank {event['rank']}'s task "
                f"failed ({event.get('message')})")
    return str(event.get("message"))


def placement_record(job: Job, nodes: list[dict[str, str]], strategy: str) -> dict[str, Any]:
    """What the run record keeps of where Ray put each rank."""
    return {"address": job.cluster.address, "cluster": job.cluster.name,
            "placement_strategy": strategy,
            "ranks": [{"rank": r, **n} for r, n in enumerate(nodes)]}


def launcher(job: Job) -> Launcher:
    """A launcher for runner.execute: host the collector, start the Ray driver, gather; the
    driver and its placement group are gone when it returns or raises."""
    from sextant.backends.base import layout_of
    from sextant.launch.local import base_plan, core_sets

    def launch(workload: Workload, strategy: Strategy, run_dir: Path, *, timeout_s: float,
               collective_timeout_s: float, on_event: EventHandler | None = None,
               extra_env: dict[str, str] | None = None, resume_step: int | None = None,
               **_: Any) -> list[RankResult]:
        layout = layout_of(strategy)
        run_dir.mkdir(parents=True, exist_ok=True)
        threads = strategy.threads or max(1, int(job.cpus))  # the bundle's, not the node's
        plan = {**base_plan(workload, strategy, run_dir, layout.roles, collective_timeout_s,
                            resume_step),
                "threads": threads,
                # The nodes of an emulated cluster share this machine's cores: each rank gets
                # its own, as under the local launcher, since XLA and TensorFlow size their
                # thread pools from the affinity mask. Ray itself pins nothing.
                "cpus": (core_sets(layout.primary, job.ranks, threads)
                         if job.cluster.name else None)}
        secret = new_secret()
        collector = Collector(_collector_bind(job.cluster), plan, job.ranks, secret=secret,
                              join_timeout_s=collective_timeout_s + START_UP_S)
        order = {"address": job.cluster.address, "node_ip": job.cluster.node_ip,
                 "world": job.ranks, "cpus": job.cpus, "gpus": job.gpus, "label": job.label,
                 "argv": [job.python or "", "-m", "sextant.cli", "join", *job.join_args],
                 "env": {**(extra_env or {}), ENV: collector.address,
                         SECRET_ENV: secret.hex(), "PYTHONUNBUFFERED": "1"},
                 "timeout_s": timeout_s + START_UP_S}
        try:
            driver = Driver(job, order, run_dir)
        except BaseException:
            collector.close()
            raise
        try:
            results = gather(collector, layout.primary, label=strategy.label,
                             on_event=on_event, alive=driver.problem,
                             deadline=time.monotonic() + timeout_s + START_UP_S)
        except RunFailed as exc:
            driver_view = _with_ray_view(str(exc), driver)
            driver.stop()
            raise RunFailed(driver_view, run_dir=run_dir) from exc
        except BaseException:
            driver.stop()
            raise
        finally:
            collector.close()
        _finish(driver, timeout=STOP_S)
        placed = driver.seen("placed")
        if placed:
            results[0].setdefault("fingerprint", {})["ray"] = placement_record(
                job, placed[0]["nodes"], placed[0].get("strategy", ""))
        return results

    return launch


def _with_ray_view(message: str, driver: Driver) -> str:
    """The run's error with the driver's account of it (which Ray node it lost), waiting a
    little for the driver to learn it."""
    deadline = time.monotonic() + FAILURE_GRACE_S
    while time.monotonic() < deadline and driver.proc.poll() is None and not (
            driver.seen("failed") or driver.seen("error")
            or any(e.get("code") for e in driver.seen("exit"))):
        time.sleep(0.2)
    view = next((describe(e) for kind in ("failed", "error") for e in driver.seen(kind)), None)
    return f"{message} ({view})" if view and view not in message else message


def _finish(driver: Driver, timeout: float) -> None:
    """After every result: let the driver see its tasks end and remove its group."""
    try:
        driver.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    driver.stop()
