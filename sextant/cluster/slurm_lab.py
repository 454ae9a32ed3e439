"""A real Slurm on an emulated cluster: `sextant cluster up --slurm`.

slurmctld runs on the first host and one slurmd per host, each inside its host's network
namespace with its own hostname and node name; munged (one per machine, on its Unix socket)
authenticates them. Jobs are submitted from this machine, which reaches the controller over
its gateway port on the cluster network, as a login node does. The configuration lives in
the cluster's state directory; `export SLURM_CONF=<that>/slurm.conf` points the Slurm
commands (and `sextant run --launcher slurm`) at it.

Why not `ip netns exec` for the daemons: it remounts /sys for the namespace, which hides
/sys/fs/cgroup, and slurmd 22.05 refuses to start without a cgroup filesystem. The daemons are
entered into the network namespace only (nsenter), in a private mount namespace where the
host's /etc/hosts is bind-mounted, so cgroups stay visible and names still resolve.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from sextant.cluster import emulated
from sextant.core.errors import UserError

DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo")
MUNGE_SOCKET_DIR = Path("/run/munge")
START_TIMEOUT_S = 30.0


def conf_dir(cluster: emulated.Cluster) -> Path:
    return emulated.STATE_DIR / cluster.name / "slurm"


def conf_path(cluster: emulated.Cluster) -> Path:
    return conf_dir(cluster) / "slurm.conf"


def require() -> None:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        raise UserError(f"--slurm needs {', '.join(missing)} (Debian: apt-get install "
                        f"slurm-wlm munge)")


def config(cluster: emulated.Cluster, cpus_per_host: int) -> str:
    d = conf_dir(cluster)
    head = cluster.hosts[0]
    lines = [
        f"ClusterName=sextant{cluster.name}",
        f"SlurmctldHost={head.name}({head.address})",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd-%n.log",
        # No cgroup enforcement or CPU binding: the emulated hosts share this machine's
        # cores; sextant pins nothing and the tasks take SLURM_CPUS_ON_NODE threads.
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SchedulerType=sched/builtin", "SelectType=select/linear", "MpiDefault=none",
        "ReturnToService=2", "SlurmdParameters=config_overrides",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
    ]
    lines += [f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus_per_host} State=UNKNOWN"
              for h in cluster.hosts]
    lines.append("PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _in_host(host: emulated.Host, argv: list[str]) -> None:
    """Start a daemon inside a host (network namespace, own hostname, the host's /etc/hosts)."""
    script = (f"mount --bind {emulated.NETNS_ETC / host.netns / 'hosts'} /etc/hosts && "
              f"hostname {host.name} && exec {' '.join(argv)}")
    proc = subprocess.run(["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--mount",
                           "--uts", "sh", "-c", script], check=False, capture_output=True,
                          text=True, timeout=START_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise UserError(f"{argv[0]} did not start on {host.name}: "
                        f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")


def ensure_munged() -> bool:
    """Start munged unless it runs; True when this call started it."""
    if (MUNGE_SOCKET_DIR / "munge.socket.2").exists() and subprocess.run(
            ["munge", "-n"], check=False, capture_output=True, timeout=10).returncode == 0:
        return False
    MUNGE_SOCKET_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
    proc = subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"],
                          check=False, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise UserError(f"munged did not start: {proc.stderr.strip() or proc.stdout.strip()}")
    return True


def start(cluster: emulated.Cluster) -> Path:
    """Start Slurm on the cluster; returns the slurm.conf path. Raises UserError (and leaves
    the daemons to `down`, which ends every process in the hosts) when a daemon fails."""
    require()
    started_munged = ensure_munged()
    d = conf_dir(cluster)
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    cpus = max(1, (os.cpu_count() or 1) // len(cluster.hosts))
    conf_path(cluster).write_text(config(cluster, cpus))
    if started_munged:  # munged serves the whole machine: `down` stops it only if we started it
        emulated.leave_cleanup(cluster.name, "slurm", pid_files=(MUNGE_SOCKET_DIR / "munged.pid",))
    conf = str(conf_path(cluster))
    _in_host(cluster.hosts[0], ["slurmctld", "-f", conf])
    for host in cluster.hosts:
        _in_host(host, ["slurmd", "-f", conf, "-N", host.name])
    wait_idle(cluster)
    return conf_path(cluster)


def wait_idle(cluster: emulated.Cluster) -> None:
    env = {**os.environ, "SLURM_CONF": str(conf_path(cluster))}
    deadline = time.monotonic() + START_TIMEOUT_S
    states = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False,
                              capture_output=True, text=True, timeout=10, env=env)
        states = proc.stdout.strip()
        lines = states.splitlines()
        if len(lines) == len(cluster.hosts) and all(ln.endswith(" idle") for ln in lines):
            return
        time.sleep(0.5)
    raise UserError(f"Slurm nodes not idle after {START_TIMEOUT_S:g} s ({states or 'no answer'}; "
                    f"logs in {conf_dir(cluster)})")

