"""A real Ray cluster on an emulated cluster: `sextant cluster up NAME --ray`.

`ray start --head` runs on the first host and `ray start --address=HEAD:6379` on the others,
each inside its host's network namespace with the host's own hostname, and each with:

- `--node-ip-address` its host's address (Ray's own detection finds no default route in a
  namespace and falls back to loopback, which the other nodes cannot reach);
- its own `--temp-dir` (sockets, session logs), so nodes never share a session directory;
- usage stats and the dashboard off (`--disable-usage-stats`, `--include-dashboard=false`,
  RAY_USAGE_STATS_ENABLED=0): nothing tries to reach outside the machine;
- a capped object store and a share of this machine's CPUs (`--num-cpus`), so that N nodes
  fit on one machine;
- on the head, health checks every second and a node declared dead after three misses
  (Ray's defaults take about 15 s), so a node killed in a test is named quickly.

The head's address is recorded in the cluster's state (ray.json), where `sextant run
--launcher ray` finds it. `stop` ends every process of the hosts (called by `cluster down`):
`ray stop` is not used, because it finds Ray's processes by name on the whole machine and
would stop every other Ray cluster running here too.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sextant.cluster import emulated
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_json

PORT = 6379
START_TIMEOUT_S = 60.0
OBJECT_STORE_MIN = 80 * 2**20
"""Ray refuses an object store under 75 MiB."""
OBJECT_STORE_MAX = 256 * 2**20
TEMP_ROOT = Path("/tmp/sextant-ray")
"""Each node's --temp-dir is TEMP_ROOT/<cluster>/h<i>: short, as Ray's Unix sockets need."""
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def record_path(name: str) -> Path:
    return emulated.STATE_DIR / name / "ray.json"


def record(name: str) -> dict[str, Any] | None:
    """The Ray head of emulated cluster `name` ({'address', 'version', ...}), if it runs Ray."""
    try:
        found: dict[str, Any] = json.loads(record_path(name).read_text())
        return found
    except (OSError, ValueError):
        return None


def ray_executable() -> str:
    """The `ray` command beside this interpreter (the one whose Ray the driver imports)."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise UserError("--ray needs Ray installed beside sextant (pip install "
                        "'sextant[ray]')")
    return found


def object_store_bytes(hosts: int) -> int:
    """Each node's object store: a tenth of the available memory shared by the nodes, within
    Ray's minimum and OBJECT_STORE_MAX (sextant's ranks pass nothing through it)."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = 8 * 2**30
    return max(OBJECT_STORE_MIN, min(OBJECT_STORE_MAX, available // 10 // hosts))


def start(cluster: emulated.Cluster) -> dict[str, Any]:
    """Start Ray on every host, wait until the head sees every node; returns the record.
    Raises UserError when a node fails (leaving its processes to `cluster down`)."""
    ray = ray_executable()
    from importlib.metadata import version

    head = cluster.hosts[0]
    address = f"{head.address}:{PORT}"
    cpus = max(1, (os.cpu_count() or 1) // len(cluster.hosts))
    store = object_store_bytes(len(cluster.hosts))
    common = ["--disable-usage-stats", f"--num-cpus={cpus}", f"--object-store-memory={store}",
              "--num-gpus=0"]
    emulated.leave_cleanup(cluster.name, "ray", paths=(TEMP_ROOT / cluster.name,))
    for host in cluster.hosts:
        temp = TEMP_ROOT / cluster.name / f"h{host.index}"
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        role = (["--head", f"--port={PORT}", "--include-dashboard=false",
                 f"--system-config={json.dumps(SYSTEM_CONFIG)}"] if host is head
                else [f"--address={address}"])
        _in_host(host, [ray, "start", *role, f"--node-ip-address={host.address}",
                        f"--temp-dir={temp}", *common])
    wait_nodes(cluster, address)
    found = {"address": address, "version": version("ray"), "nodes": len(cluster.hosts),
             "cpus_per_node": cpus, "object_store_bytes": store,
             "head_netns": head.netns, "head_address": head.address,
             "temp_root": str(TEMP_ROOT / cluster.name)}
    atomic_write_json(record_path(cluster.name), found)
    return found


def _in_host(host: emulated.Host, argv: list[str]) -> None:
    """Run `ray start` inside a host, with the host's hostname (Ray names its node by it)."""
    script = f"hostname {shlex.quote(host.name)} && exec {shlex.join(argv)}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run(["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c",
                               script], check=False, capture_output=True, text=True,
                              timeout=START_TIMEOUT_S, stdin=subprocess.DEVNULL, env=env,
                              cwd="/")
    except subprocess.TimeoutExpired:
        raise UserError(f"'ray start' did not finish on {host.name} in "
                        f"{START_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise UserError(f"'ray start' failed on {host.name}: "
                        f"{lines[-1].strip() if lines else 'no output'}")


def alive_nodes(cluster: emulated.Cluster, address: str) -> int | None:
    """Nodes the head counts as alive (`ray list nodes` needs the dashboard; the GCS is asked
    through the ray package instead), or None when it does not answer."""
    code = ("import sys, ray\n"
            "from ray._raylet import GcsClient\n"
            "nodes = GcsClient(address=sys.argv[1]).get_all_node_info(timeout=5)\n"
            "print(sum(1 for n in nodes.values() if n.state == 0))\n")
    try:
        proc = subprocess.run(["ip", "netns", "exec", cluster.hosts[0].netns, sys.executable,
                               "-c", code, address], check=False, capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    out = proc.stdout.strip().splitlines()
    return int(out[-1]) if proc.returncode == 0 and out and out[-1].isdigit() else None


def wait_nodes(cluster: emulated.Cluster, address: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    seen = None
    while time.monotonic() < deadline:
        seen = alive_nodes(cluster, address)
        if seen == len(cluster.hosts):
            return
        time.sleep(0.5)
    raise UserError(f"the Ray head at {address} sees {seen if seen is not None else 'no'} "
                    f"of {len(cluster.hosts)} nodes after {START_TIMEOUT_S:g} s (logs under "
                    f"{TEMP_ROOT / cluster.name})")

