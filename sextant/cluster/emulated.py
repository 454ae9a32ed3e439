"""An emulated cluster on one machine: one Linux network namespace per host, shaped links.

Topology (everything lives in namespaces; the machine's own network is never touched):

    sextant-<name>-sw        a "switch" namespace holding one bridge, br0
    sextant-<name>-h<i>      host i: loopback and eth0 (address 10.211.<k>.<i+1>/24),
                             a veth pair whose other end is a port of br0
    sxg-<name>               this machine's own port on the switch (10.211.<k>.254), the
                             "login node" from which sextant submits Slurm jobs and collects
                             results; unshaped, and the only change outside the namespaces

Each cluster has its own /24 (k = 0, 1, ...), so several can exist at once.

Each link is shaped in both directions (host egress on eth0, switch egress on the bridge
port) with a token-bucket filter at the link rate, so a host sends and receives at most that
rate at once, as a full-duplex NIC does. One-way latency and packet loss use netem where the
kernel has it (half the latency on each side of the link); where it does not, asking for them
is a one-line error rather than a link that silently is not what was asked.

The namespaces are the state: `status` and `down` find them with `ip netns list`, so a cluster
whose record was lost is still removed. The record (link settings, hosts) is a JSON file under
/run/sextant/clusters, on tmpfs like the namespaces themselves, so neither outlives a reboot.
Ranks are started inside a host with `ip netns exec` (see `sextant.launch.hosts`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sextant.core.defaults import MEASUREMENT_TIMEOUT_S
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_json
from sextant.launch.hosts import (
    NETNS_ETC,
    HostSlot,
    Placement,
    blocks,
    delete_netns,
    write_netns_hosts,
)

PREFIX = "sextant-"
SUBNET_BASE = "10.211"
"""Cluster k's hosts are SUBNET_BASE.k.(i+1); this machine is SUBNET_BASE.k.254 on it."""
GATEWAY_HOST = 254
STATE_DIR = Path(os.environ.get("SEXTANT_CLUSTER_STATE", "/run/sextant/clusters"))

NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
MAX_HOSTS = 64
RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")
LATENCY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
COMMAND_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Link:
    rate_bit_s: float | None
    """Link rate in bit/s; None means unshaped (veth speed)."""
    latency_s: float = 0.0
    """One-way host-to-host latency."""
    loss: float = 0.0
    """Packet loss probability on each direction of each link."""

    def describe(self) -> str:
        parts = [format_rate(self.rate_bit_s)]
        if self.latency_s:
            parts.append(f"{self.latency_s * 1e6:g} us")
        if self.loss:
            parts.append(f"{self.loss:.2%} loss")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    """Hostname inside the cluster, e.g. 'lab-h0'."""
    address: str
    netns: str

    @property
    def index(self) -> int:
        return int(self.netns.rsplit("-h", 1)[1])


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    hosts: tuple[Host, ...]
    link: Link
    created_at: str = ""
    gateway: str = ""
    """This machine's address on the cluster network."""

    @property
    def switch(self) -> str:
        return switch_netns(self.name)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "hosts": [asdict(h) for h in self.hosts],
                "link": asdict(self.link), "created_at": self.created_at,
                "gateway": self.gateway}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        hosts = tuple(Host(**h) for h in d["hosts"])
        return cls(name=str(d["name"]), hosts=hosts, link=Link(**d["link"]),
                   created_at=str(d.get("created_at", "")), gateway=str(d.get("gateway", "")))


# ---------------------------------------------------------------------------- parsing

def parse_rate(text: str) -> float | None:
    """'10gbit' -> 1e10 bit/s; 'none' or 'unlimited' -> None (unshaped)."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    m = RATE.match(text.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--link must look like 100mbit, 1gbit, 10gbit or 'none'. Received: {text!r}")
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, None: 1.0}[m.group(2)]


def parse_latency(text: str) -> float:
    """'50us' -> 5e-5 s."""
    m = LATENCY.match(text.strip().lower())
    if not m:
        raise UserError(f"--latency must look like 50us, 1ms or 0ms. Received: {text!r}")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def format_rate(rate_bit_s: float | None) -> str:
    if rate_bit_s is None:
        return "unshaped"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if rate_bit_s >= scale:
            return f"{rate_bit_s / scale:g} {unit}"
    return f"{rate_bit_s:g} bit/s"


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UserError(
            f"cluster name must be 1-8 lower-case letters or digits, starting with a letter "
            f"(it names network interfaces). Received: {name!r}"
        )
    return name


def switch_netns(name: str) -> str:
    return f"{PREFIX}{name}-sw"


def host_netns(name: str, i: int) -> str:
    return f"{PREFIX}{name}-h{i}"


def gateway_device(name: str) -> str:
    return f"sxg-{name}"


def _free_subnet() -> int:
    """The lowest k whose 10.211.k.0/24 no existing cluster uses."""
    used = set()
    for path in STATE_DIR.glob("*.json"):
        try:
            used.add(int(json.loads(path.read_text())["hosts"][0]["address"].split(".")[2]))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
    return min(set(range(256)) - used)


# ---------------------------------------------------------------------------- commands

def _run(*argv: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"'{' '.join(cmd)}' did not finish in {COMMAND_TIMEOUT_S:g} s") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"'{' '.join(cmd)}' failed: {err}")
    return proc


def require_tools() -> None:
    """Root and iproute2, or a one-line error saying what is missing."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UserError(f"an emulated cluster needs {' and '.join(missing)} (Debian: apt-get "
                        f"install iproute2)")
    if os.geteuid() != 0:
        raise UserError("an emulated cluster needs root (it creates network namespaces and "
                        "shapes links with tc); run sextant cluster as root")


def namespaces() -> list[str]:
    out = _run("ip", "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _cluster_namespaces(name: str) -> list[str]:
    return [ns for ns in namespaces() if ns.startswith(f"{PREFIX}{name}-")]


def names() -> list[str]:
    """Clusters that exist now (from their namespaces)."""
    found = {ns[len(PREFIX):].rsplit("-", 1)[0] for ns in namespaces()
             if ns.startswith(PREFIX) and ns.endswith("-sw")}
    return sorted(found)


_NETEM: bool | None = None


def has_netem() -> bool:
    """Whether this kernel has the netem qdisc (latency and loss emulation)."""
    global _NETEM
    if _NETEM is None:
        probe = f"{PREFIX}probe-{os.getpid()}"
        _run("ip", "netns", "add", probe)
        try:
            _NETEM = _run("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us",
                          netns=probe, check=False).returncode == 0
        finally:
            _run("ip", "netns", "del", probe, check=False)
    return _NETEM


def _shape(netns: str, dev: str, link: Link) -> None:
    """Shape one direction of a link: netem for delay/loss (half the latency each way), with
    a token bucket at the link rate (as netem's child, or alone)."""
    tc = ("tc", "qdisc", "add", "dev", dev)
    parent: tuple[str, ...] = ("root",)
    if link.latency_s or link.loss:
        netem = [*tc, "root", "handle", "1:", "netem", "limit", "100000"]
        if link.latency_s:
            netem += ["delay", f"{link.latency_s / 2 * 1e6:.3f}us"]
        if link.loss:
            netem += ["loss", f"{link.loss * 100:.6f}%"]
        _run(*netem, netns=netns)
        parent = ("parent", "1:1")
    if link.rate_bit_s is not None:
        # Burst: at least two 64 KiB GSO segments, and about 1 ms at the rate so that the
        # bucket does not starve a fast link between timer ticks; queue up to 20 ms.
        burst = max(2 * 65536, int(link.rate_bit_s / 8 * 1e-3))
        _run(*tc, *parent, "tbf", "rate", f"{int(link.rate_bit_s)}bit", "burst", str(burst),
             "latency", "20ms", netns=netns)


def up(name: str, hosts: int, link: Link) -> Cluster:
    """Create the cluster; on any failure remove whatever was created, then raise."""
    check_name(name)
    require_tools()
    if not 2 <= hosts <= MAX_HOSTS:
        raise UserError(f"--hosts must be between 2 and {MAX_HOSTS}. Received: {hosts}")
    if not 0.0 <= link.loss < 1.0:
        raise UserError(f"--loss must be a fraction in [0, 1). Received: {link.loss}")
    if (link.latency_s or link.loss) and not has_netem():
        raise UserError("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so latency and "
                        "loss cannot be emulated here; rate shaping (--link) works without it")
    if _cluster_namespaces(name):
        raise UserError(f"cluster {name!r} already exists; 'sextant cluster down {name}' "
                        f"removes it")
    subnet = f"{SUBNET_BASE}.{_free_subnet()}"
    cluster = Cluster(
        name=name,
        hosts=tuple(Host(name=f"{name}-h{i}", address=f"{subnet}.{i + 1}",
                         netns=host_netns(name, i)) for i in range(hosts)),
        link=link, created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        gateway=f"{subnet}.{GATEWAY_HOST}",
    )
    try:
        sw = cluster.switch
        _run("ip", "netns", "add", sw)
        _run("ip", "link", "set", "lo", "up", netns=sw)
        _run("ip", "link", "add", "br0", "type", "bridge", netns=sw)
        _run("ip", "link", "set", "br0", "up", netns=sw)
        for i, host in enumerate(cluster.hosts):
            port = f"p{i}"
            _run("ip", "netns", "add", host.netns)
            _run("ip", "link", "set", "lo", "up", netns=host.netns)
            _run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", port,
                 "netns", sw, netns=host.netns)
            _run("ip", "link", "set", port, "master", "br0", netns=sw)
            _run("ip", "link", "set", port, "up", netns=sw)
            _run("ip", "addr", "add", f"{host.address}/24", "dev", "eth0", netns=host.netns)
            _run("ip", "link", "set", "eth0", "up", netns=host.netns)
            _shape(host.netns, "eth0", link)
            _shape(sw, port, link)
        gw = gateway_device(name)
        _run("ip", "link", "add", gw, "type", "veth", "peer", "name", "gw", "netns", sw)
        _run("ip", "link", "set", "gw", "master", "br0", netns=sw)
        _run("ip", "link", "set", "gw", "up", netns=sw)
        _run("ip", "addr", "add", f"{cluster.gateway}/24", "dev", gw)
        _run("ip", "link", "set", gw, "up")
        hosts_file = "".join(f"{h.address}\t{h.name}\n" for h in cluster.hosts)
        for host in cluster.hosts:  # every host names every host, so a framework that
            # resolves its own hostname (gloo) finds its cluster address
            write_netns_hosts(host.netns, f"127.0.0.1\tlocalhost\n{hosts_file}")
        atomic_write_json(STATE_DIR / f"{name}.json", cluster.to_dict())
    except BaseException:
        down(name)
        raise
    return cluster


def down(name: str) -> list[str]:
    """Remove every namespace of the cluster and its record; returns what was removed."""
    check_name(name)
    require_tools()
    removed = []
    for ns in _cluster_namespaces(name):
        _kill_processes_in(ns)
        delete_netns(ns)
        removed.append(ns)
    _undo_services(name)
    # The gateway veth dies with its peer in the switch namespace; remove it if a failed up
    # left it without one.
    _run("ip", "link", "del", gateway_device(name), check=False)
    for leftover in NETNS_ETC.glob(f"{PREFIX}{name}-*"):  # of namespaces already gone
        shutil.rmtree(leftover, ignore_errors=True)
    (STATE_DIR / f"{name}.json").unlink(missing_ok=True)
    return removed


CLEANUP = "cleanup.json"
"""What `down` undoes for a service started on the cluster, in STATE_DIR/<name>/<service>/."""


def leave_cleanup(name: str, service: str, *, paths: tuple[Path, ...] = (),
                  pid_files: tuple[Path, ...] = ()) -> None:
    """Record what `down` must undo for `service` (Slurm, Ray) once the hosts' processes are
    gone: the directories it made outside the cluster's state, and the pid files of daemons
    it started outside the hosts (munged). Written by the service when it starts, so that
    `down` reads data and imports no service."""
    atomic_write_json(STATE_DIR / name / service / CLEANUP,
                      {"paths": [str(p) for p in paths],
                       "pid_files": [str(p) for p in pid_files]})


def _undo_services(name: str) -> None:
    """Every service's recorded clean-up, then the cluster's state directory."""
    for record in sorted((STATE_DIR / name).glob(f"*/{CLEANUP}")):
        try:
            todo = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        for pid_file in todo.get("pid_files", []):
            try:
                os.kill(int(Path(pid_file).read_text().strip()), 15)
            except (OSError, ValueError):
                pass
        for path in todo.get("paths", []):
            deadline = time.monotonic() + 5.0
            while Path(path).exists() and time.monotonic() < deadline:
                shutil.rmtree(path, ignore_errors=True)  # a dying process's last log line
    shutil.rmtree(STATE_DIR / name, ignore_errors=True)


def _kill_processes_in(netns: str) -> None:
    """Processes still inside a host (a run killed without clean-up, Slurm's or Ray's
    daemons) would keep its network alive after the namespace's name is gone; end them and
    wait for them. Listed again until none is left: a daemon may fork (Ray's raylet starts
    workers) between one listing and its kill."""
    deadline = time.monotonic() + 5.0
    while True:
        proc = _run("ip", "netns", "pids", netns, check=False)
        pids = [int(p) for p in proc.stdout.split() if p.isdigit() and running(int(p))]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Whether a process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def load(name: str) -> Cluster:
    """The running cluster `name`, or a one-line error naming the ones that exist."""
    check_name(name)
    path = STATE_DIR / f"{name}.json"
    existing = names() if shutil.which("ip") and os.geteuid() == 0 else []
    if name in existing and not path.exists():  # an `up` killed before it finished
        raise UserError(f"emulated cluster {name!r} is incomplete (its namespaces exist but "
                        f"its record does not: was 'sextant cluster up' interrupted?); "
                        f"'sextant cluster down {name}' removes it, then 'sextant cluster up "
                        f"{name}' creates it again")
    if name not in existing:
        hint = f"existing: {', '.join(existing)}" if existing else "none exists"
        raise UserError(f"no emulated cluster {name!r} ({hint}); create it with "
                        f"'sextant cluster up {name} --hosts 2 --link 10gbit'")
    try:
        return Cluster.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"the record of cluster {name!r} ({path}) is unreadable ({exc}); "
                        f"'sextant cluster down {name}' removes the cluster") from exc


def set_link(cluster: Cluster, host: str, state: str) -> None:
    """Take a host's link down or bring it back up (fault injection)."""
    match = [h for h in cluster.hosts if host in (h.name, h.netns, str(h.index), f"h{h.index}")]
    if not match:
        raise UserError(f"no host {host!r} in cluster {cluster.name!r}; hosts: "
                        f"{', '.join(h.name for h in cluster.hosts)}")
    if state not in ("up", "down"):
        raise UserError(f"link state must be up or down. Received: {state!r}")
    _run("ip", "link", "set", "eth0", state, netns=match[0].netns)


def link_states(cluster: Cluster) -> dict[str, str]:
    """Each host's eth0 operational state (UP, DOWN, ...)."""
    states = {}
    for host in cluster.hosts:
        proc = _run("ip", "-br", "link", "show", "eth0", netns=host.netns, check=False)
        fields = proc.stdout.split()
        states[host.name] = fields[1] if len(fields) > 1 else "missing"
    return states


def link_fit(name: str) -> dict[str, float] | None:
    """The all-reduce fit (alpha, beta) measured between the cluster's hosts, if measured."""
    path = STATE_DIR / name / "link.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def placement(name: str, world: int) -> Placement:
    """Ranks spread over the hosts of emulated cluster `name` (as many hosts as there are
    ranks, at most), each started in its host's namespace with the host's own hostname: the
    Placement the launcher takes."""
    cluster = load(name)
    slots = tuple(
        HostSlot(name=h.name, address=h.address,
                 prefix=("ip", "netns", "exec", h.netns, "unshare", "--uts", "--"),
                 hostname=h.name)
        for h in cluster.hosts
    )
    return Placement(hosts=slots, rank_host=blocks(world, min(world, len(slots))), cluster=name)


def measure_link(cluster: Cluster, timeout: float = MEASUREMENT_TIMEOUT_S) -> dict[str, float]:
    """Measure (once per cluster) the all-reduce between two hosts, 1 KiB-16 MiB, and keep
    its alpha-beta fit: the link's latency and bandwidth as a collective sees them, which the
    planner uses in place of the nominal rate."""
    found = link_fit(cluster.name)
    if found is not None:
        return found
    from sextant.launch.collectives import measure_collective
    from sextant.measure.collectives import fit_alpha_beta

    data = measure_collective("allreduce", world=2, max_bytes=16 * 2**20, timeout=timeout,
                              placement=placement(cluster.name, 2))
    fit = fit_alpha_beta(data["sizes_bytes"], data["times_s"])
    fit["sizes_bytes"], fit["times_s"] = data["sizes_bytes"], data["times_s"]
    atomic_write_json(STATE_DIR / cluster.name / "link.json", fit)
    return fit
