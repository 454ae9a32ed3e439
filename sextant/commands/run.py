"""`sextant run`: train one workload with one strategy, measured, and store it."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from sextant.backends import get_backend, require
from sextant.backends.base import REGISTRY, BackendBase
from sextant.commands.common import (
    RunProgress,
    add_run_args,
    comparison_table,
    lever_fields,
    open_store,
    runs_dir,
)
from sextant.commands.trials import add_repeats_arg, run_trials
from sextant.core.display import console
from sextant.backends.base import layout_of
from sextant.core.devices import check_ranks_fit, detect
from sextant.core.errors import RunFailed, UserError
from sextant.core.fields import add_flags, flag_defaults, option, values_from
from sextant.core.fsutil import atomic_output
from sextant.monitor import add_monitor_args
from sextant.runner import execute
from sextant.strategy import TENSOR_PARALLEL, Strategy
from sextant.workloads.spec import Workload
from sextant.sources import resolve_workload, workload_source


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="train one workload with one framework and strategy, measured",
                       description="Train one workload with one framework and strategy; "
                                   "store the measured run.")
    add_run_args(p)
    add_monitor_args(p)
    add_strategy_args(p)
    add_repeats_arg(p, 1)
    add_flags(p, LaunchFlags, ("launcher", "ray", "slurm", "kubernetes", "run"))
    p.set_defaults(func=cmd_run)


@dataclass(frozen=True, kw_only=True)
class LaunchFlags:
    """How `sextant run` starts its ranks (docs/multi-host.md), declared once
    (sextant.core.fields); `compare` takes the local and Ray launchers' flags from here too."""

    launcher: str = option("local", group="launcher",
                           choices=("local", "slurm", "kubernetes", "ray"),
                           help="local (default: processes on this machine, or on the hosts of "
                                "--cluster), slurm (a batch job through sbatch, or srun inside "
                                "an allocation), kubernetes (a Kubeflow TrainJob, PyTorchJob "
                                "or JobSet) or ray (one placement group on a Ray cluster); see "
                                "docs/multi-host.md")
    ray_address: str | None = option(
        None, group="ray", metavar="ADDR",
        help="with --launcher ray: the cluster's head, HOST:PORT (this host must be a node) or "
             "ray://HOST:PORT (Ray Client); default: RAY_ADDRESS, else the emulated cluster "
             "started with 'sextant cluster up NAME --ray'")
    nodes: int | None = option(None, group="slurm",
                               help="with --launcher slurm: nodes of the job (default: one per "
                                    "worker)")
    tasks_per_node: int | None = option(None, group="slurm",
                                        help="with --launcher slurm: ranks per node (default: "
                                             "all ranks spread evenly over --nodes)")
    partition: str | None = option(None, group="slurm",
                                   help="with --launcher slurm: the partition")
    dry_run: bool = option(False, group="slurm",
                           help="with --launcher slurm: print the batch script and stop; with "
                                "--launcher kubernetes: write the manifest and stop")
    k8s_kind: str | None = option(None, group="kubernetes", metavar="KIND",
                                  help="with --launcher kubernetes: trainjob, pytorchjob, jobset "
                                       "(default: trainjob, a Kubeflow Trainer v2 TrainJob)")
    image: str | None = option(None, group="kubernetes",
                               help="with --launcher kubernetes: the pods' image, with sextant "
                                    "and the framework installed (default: sextant:<version>)")
    cpu: str | None = option(None, group="kubernetes",
                             help="with --launcher kubernetes: CPU per pod, requested and "
                                  "limited (default: --threads, else 4)")
    memory: str | None = option(None, group="kubernetes",
                                help="with --launcher kubernetes: memory per pod, requested and "
                                     "limited (default: 4Gi)")
    namespace: str | None = option(None, group="kubernetes",
                                   help="with --launcher kubernetes: the namespace (default: "
                                        "default)")
    out: Path | None = option(None, group="kubernetes", metavar="FILE",
                              help="with --launcher kubernetes --dry-run: write the manifest to "
                                   "FILE (mode 0600: it holds the run's secret) instead of "
                                   "printing it")
    yes: bool = option(False, group="run",
                       help="start a run predicted to take over 10 minutes on this machine "
                            "without asking (asked on a terminal only)")
    print_config: bool = option(False, group="run",
                                help="print the framework configuration sextant generates for "
                                     "this run (deepspeed: its JSON config) and stop without "
                                     "training")


KUBERNETES_FLAGS = tuple(f.name for f in dataclasses.fields(LaunchFlags)
                         if f.metadata["group"] == "kubernetes")


def ray_cluster(args: argparse.Namespace) -> Any:
    """The Ray cluster `--launcher ray` runs on: --ray-address, RAY_ADDRESS, else the one
    emulated cluster (--cluster NAME, or the only one here) that runs Ray. On an emulated
    cluster the driver starts in the head's namespace and args.cluster names the cluster, so
    the run's network is recorded as the emulated one."""
    import os
    import shutil

    from sextant.cluster import emulated, ray_lab
    from sextant.launch.ray_launcher import Cluster, check_address, require_ray

    require_ray()
    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    if address and args.cluster is None:
        return Cluster(address=check_address(address))
    if args.cluster is not None:
        emulated.load(args.cluster)  # one line when it does not exist
        candidates = [args.cluster]
    elif os.geteuid() == 0 and shutil.which("ip") is not None:
        candidates = emulated.names()
    else:
        candidates = []
    with_ray = [(name, rec) for name in candidates if (rec := ray_lab.record(name))]
    if len(with_ray) != 1:
        found = (f"emulated clusters running Ray: {', '.join(n for n, _ in with_ray)}; name "
                 f"one with --cluster" if with_ray else
                 f"cluster {args.cluster} runs no Ray" if args.cluster else
                 "no emulated cluster runs Ray")
        raise UserError(f"--launcher ray needs a Ray cluster: --ray-address HOST:PORT, "
                        f"RAY_ADDRESS, or 'sextant cluster up NAME --hosts 2 --ray' ({found})")
    name, rec = with_ray[0]
    if address and address != rec["address"]:
        raise UserError(f"--ray-address {address} is not the Ray head of cluster {name} "
                        f"({rec['address']})")
    args.cluster = name
    return Cluster(address=rec["address"], prefix=("ip", "netns", "exec", rec["head_netns"]),
                   node_ip=rec["head_address"], collector_bind=emulated.load(name).gateway,
                   name=name)


def ray_launcher(args: argparse.Namespace, strategy: Strategy, cluster: Any = None,
                 workload: str | None = None) -> Any:
    """The launcher of one run on Ray (`cluster`: ray_cluster(args), found once by compare)."""
    from sextant.launch import ray_launcher as ray

    job = ray.Job.for_run(strategy, cluster or ray_cluster(args),
                          workload=workload or str(args.workload), timeout_s=args.timeout,
                          collective_timeout_s=args.collective_timeout, steps=args.steps)
    return ray.launcher(job)




STRATEGY_FLAGS = ("who", "device", "lever", "layout")
"""The Strategy field groups that `run` and `join` take as flags (and --strategy's file)."""


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    """The strategy of one run (framework, mode, parallelism, levers): a flag for every
    Strategy field, as it declares them, and --strategy for all of them from a file."""
    add_flags(p, Strategy, STRATEGY_FLAGS)
    p.add_argument("--strategy", type=Path, default=None, metavar="FILE",
                   help="a TOML file of Strategy fields (framework = \"jax\", parallel = "
                        "\"fsdp\", workers = 2, ...; the names of these flags, with _ for -); "
                        "a flag given on the command line wins over the file")


def strategy_file(args: argparse.Namespace) -> argparse.Namespace:
    """The flags with --strategy FILE's fields filled in where no flag changed them."""
    path = getattr(args, "strategy", None)
    if path is None:
        return args
    from sextant.core.tomlfile import read_toml

    table = read_toml(path, "strategy file")
    defaults = flag_defaults(Strategy, STRATEGY_FLAGS)
    unknown = sorted(set(table) - set(defaults))
    if unknown:
        raise UserError(f"strategy file {path}: unknown field {unknown[0]!r}; allowed: "
                        f"{', '.join(defaults)}")
    merged = vars(args).copy()
    for name, value in table.items():
        if merged[name] == defaults[name]:
            merged[name] = value
    return argparse.Namespace(**merged)


def model_parallel_fields(args: argparse.Namespace, devices: int) -> dict[str, Any]:
    """--tp / --pp / --microbatches / --schedule / --sequence-parallel, with their defaults
    (the degree: every device; micro-batches: twice the stages)."""
    tp = args.tp if args.tp is not None else (devices if args.parallel in TENSOR_PARALLEL
                                               else 1)
    pp = args.pp if args.pp is not None else (devices if args.parallel == "pp" else 1)
    microbatches = args.microbatches
    if microbatches is None:
        microbatches = 2 * pp if args.parallel == "pp" else 1
    return {"tp": tp, "pp": pp, "microbatches": microbatches, "schedule": args.schedule,
            "sequence_parallel": args.sequence_parallel}


def strategy_from_args(args: argparse.Namespace, default_workers: int = 2) -> Strategy:
    """The strategy the flags (and --strategy's file) ask for, checked against the
    framework's capabilities."""
    args = strategy_file(args)
    if args.workers is not None:
        workers = args.workers
    elif args.parallel == "single" or args.devices_per_worker > 1:
        workers = 1
    else:
        workers = default_workers
    mode = args.mode
    if mode is None:
        mode = (get_backend(args.framework).capabilities().modes[0]
                if args.framework in REGISTRY else "eager")
    strategy = Strategy(**{**values_from(args, Strategy, ("who", "layout")),
                           "workers": workers, "mode": mode, **lever_fields(args),
                           **model_parallel_fields(args, workers * args.devices_per_worker)})
    require(strategy)
    return strategy


def load_with_steps(args: argparse.Namespace) -> Workload:
    workload = resolve_workload(args.workload)
    if args.steps is not None:
        if args.steps <= workload.measure.warmup_steps:
            raise UserError(
                f"--steps must exceed the workload's measure.warmup_steps "
                f"({workload.measure.warmup_steps}). Received: {args.steps}"
            )
        workload = workload.replace(steps=args.steps)
    return workload


def cmd_run(args: argparse.Namespace) -> int:
    workload = load_with_steps(args)
    strategy = strategy_from_args(args)
    if args.print_config:
        return print_config(workload, strategy)
    given = [f"--{f.replace('_', '-')}" for f in KUBERNETES_FLAGS
             if getattr(args, f) is not None]
    if given and args.launcher != "kubernetes":
        raise UserError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with "
                        f"--launcher kubernetes")
    if args.ray_address is not None and args.launcher != "ray":
        raise UserError("--ray-address goes with --launcher ray")
    launcher = None
    if args.launcher == "slurm":
        from sextant.launch import slurm

        job = slurm.Job.for_run(
            strategy, workload=str(args.workload), timeout_s=args.timeout,
            collective_timeout_s=args.collective_timeout, steps=args.steps, nodes=args.nodes,
            tasks_per_node=args.tasks_per_node, partition=args.partition)
        if args.dry_run:
            console().print(slurm.batch_script(job), markup=False, soft_wrap=True)
            return 0
        launcher = slurm.launcher(job)
    elif args.nodes or args.tasks_per_node or args.partition:
        raise UserError("--nodes, --tasks-per-node and --partition go with --launcher slurm")
    elif args.launcher == "kubernetes":
        if args.dry_run:
            return write_manifest(args, kubernetes_job(args, strategy))
        if args.out is not None:
            raise UserError("--out goes with --dry-run (the manifest it writes)")
        launcher = kubernetes_launcher(kubernetes_job(args, strategy))
    elif args.dry_run:
        raise UserError("--dry-run goes with --launcher slurm or kubernetes")
    elif args.launcher == "ray":
        launcher = ray_launcher(args, strategy)
    elif args.cluster is None:  # every rank on this host: one GPU each
        check_ranks_fit(strategy.device, len(layout_of(strategy).primary), detect())
        from sextant.commands.fit import long_run_check

        long_run_check(workload, strategy.device, args.yes, console())
    if args.repeats > 1:
        return run_trials(args, workload, strategy, launcher=launcher)
    return run_and_show(args, workload, strategy, launcher=launcher,
                        tensorboard=args.tensorboard)


def kubernetes_job(args: argparse.Namespace, strategy: Strategy) -> Any:
    from sextant.launch import kubernetes

    return kubernetes.Job.for_run(
        strategy, workload=str(args.workload), timeout_s=args.timeout,
        collective_timeout_s=args.collective_timeout, steps=args.steps,
        kind=args.k8s_kind or "trainjob", image=args.image, cpu=args.cpu,
        memory=args.memory or "4Gi", namespace=args.namespace or "default")


def write_manifest(args: argparse.Namespace, job: Any) -> int:
    """`--launcher kubernetes --dry-run`: the manifest, with a fresh secret, on stdout or in
    --out; checked against the pinned schemas first where kubernetes-validate is installed."""
    from sextant.launch import kubernetes
    from sextant.launch.collector import new_secret

    objects = kubernetes.manifest(job, new_secret())
    header = kubernetes.header(job)
    if importlib.util.find_spec("kubernetes_validate") is not None:
        problems = kubernetes.validate(objects)
        if problems:
            raise RunFailed(f"the rendered manifest breaks its schema ({len(problems)} "
                            f"problem(s)); the first: {problems[0]}")
        header += (f"Checked offline against Kubernetes {kubernetes.KUBERNETES_VERSION} and "
                   f"the vendored CRD schemas (sextant/launch/crds).",)
    text = kubernetes.render(objects, header)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    with atomic_output(args.out) as f:  # mkstemp: 0600 from the start
        f.write(text.encode())
    console().print(f"wrote {args.out} (a Secret and a {objects[1]['kind']}); apply it with "
                    f"kubectl apply -f {args.out}", markup=False, soft_wrap=True)
    return 0


def kubernetes_launcher(job: Any) -> Any:
    from sextant.launch import kubernetes

    kubernetes.client()  # no package or no cluster: one line now, not after the progress bar
    return kubernetes.launcher(job)


def print_config(workload: Workload, strategy: Strategy) -> int:
    """`--print-config`: the generated framework configuration as JSON on stdout."""
    config = get_backend(strategy.framework).generated_config(workload, strategy)
    if config is None:
        having = [name for name in REGISTRY  # the backends that override the default
                  if getattr(type(get_backend(name)), "generated_config")
                  is not BackendBase.generated_config]
        raise UserError(f"--print-config: {strategy.framework} has no generated configuration "
                        f"(sextant's code is its whole set-up); frameworks with one: "
                        f"{', '.join(having)}")
    sys.stdout.write(json.dumps(config, indent=2) + "\n")
    return 0


def run_and_show(args: argparse.Namespace, workload: Workload, strategy: Strategy, *,
                 launcher: Any = None, tensorboard: Any = None) -> int:
    """Execute one run with live progress, store it and print its table (`run`, `join`)."""
    out = console()
    with open_store(args) as store, RunProgress(out, tensorboard=tensorboard) as progress:
        progress.start(strategy.label, workload.steps, workload=workload)
        try:
            record = execute(workload, strategy, runs_dir=runs_dir(store), store=store,
                             on_event=progress.on_event, timeout_s=args.timeout,
                             collective_timeout_s=args.collective_timeout,
                             cluster=args.cluster, launcher=launcher,
                             workload_file=workload_source(args.workload))
        except RunFailed as exc:
            progress.finish(strategy.label, None, error=str(exc))
            raise
        progress.finish(strategy.label, record)
    out.print(comparison_table([record], f"{escape(workload.name)}: run {record.id}"))
    line = trainable_line(workload, [record])
    if line:
        out.print(line, markup=False)
    out.print(f"stored as run {record.id} in {store.path}", markup=False)
    return 0


def trainable_line(workload: Workload, records: list[Any]) -> str | None:
    """For LoRA, the trainable parameters as each framework counted them (PEFT's
    `print_trainable_parameters` figures); None for full fine-tuning."""
    ft = workload.finetune
    if not ft.lora:
        return None
    counts = {r.label: (r.ranks[0].memory_accounting.get("trainable_parameters"),
                        r.ranks[0].memory_accounting.get("parameters"))
              for r in records if r.ranks}
    if not counts:
        return None
    head = (f"LoRA rank {ft.rank}, alpha {ft.alpha:g} (scale {ft.scale:g}) on "
            f"{', '.join(ft.targets)}: trainable parameters ")
    if len(set(counts.values())) == 1:
        trained, total = next(iter(counts.values()))
        where = "" if len(counts) == 1 else f", equal on all {len(counts)} runs"
        line = head + f"{trained:,} of {total:,} ({100 * trained / total:.3f} %){where}"
    else:
        line = head + "differ: " + "; ".join(f"{label} {t:,} of {n:,}"
                                             for label, (t, n) in counts.items())
    return "\n".join([line, *(_memory_split(r) for r in records if r.ranks)])


def _memory_split(record: Any) -> str:
    """A LoRA run's memory by part (rank 0, as the framework's objects hold it): the
    frozen base, the adapters, their optimizer state; and the adapter checkpoint's size."""
    acc, details = record.ranks[0].memory_accounting, record.ranks[0].details

    def mb(value: Any) -> str:
        return "-" if value is None else f"{value / 2**20:.2f} MB"

    params, frozen = acc.get("params"), acc.get("frozen_params")
    adapters = None if params is None or frozen is None else params - frozen
    size = details.get("adapter_bytes")
    return (f"  {record.label}: frozen base {mb(frozen)}, adapters {mb(adapters)}, "
            f"their optimizer state {mb(acc.get('optimizer_state'))}; adapter checkpoint "
            + ("-" if size is None else f"{size / 1024:.1f} kB"))
