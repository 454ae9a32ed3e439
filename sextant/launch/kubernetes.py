"""`sextant run --launcher kubernetes`: the run's ranks as the pods of a Kubeflow job.

`--dry-run` writes a manifest (a YAML stream): a `Secret` holding the run's collector secret,
then the training job, one pod per rank, each running `sextant join`:

- `trainjob` (the default): a Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1)
  on the `torch-distributed` ClusterTrainingRuntime. The Trainer's torch plugin gives every
  node PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the Indexed Job's completion index),
  PET_MASTER_ADDR (`<name>-node-0-0.<name>`) and PET_MASTER_PORT (29500): kubeflow/trainer
  v2.3.0, pkg/runtime/framework/plugins/torch/torch.go and pkg/constants/constants.go.
- `pytorchjob`: a Kubeflow Training Operator v1 `PyTorchJob` (kubeflow.org/v1), one Master and
  N-1 Workers. The operator sets MASTER_ADDR (`<name>-master-0`), MASTER_PORT (the container
  port named `pytorchjob-port`), WORLD_SIZE and RANK (the Master 0, Worker i is i+1):
  kubeflow/trainer v1.9.4, pkg/controller.v1/pytorch/envvar.go and master.go.
- `jobset`: a `JobSet` (jobset.x-k8s.io/v1alpha2) of one Indexed Job; JobSet sets no rank
  variables, so the pod template sets them itself: RANK from the annotation
  `batch.kubernetes.io/job-completion-index`, MASTER_ADDR the first pod's DNS name
  (`<name>-node-0-0.<name>`, kubernetes-sigs/jobset v0.12.0, api/jobset/v1alpha2).

`sextant join` reads either set (sextant.launch.join). In a manifest applied by hand rank 0
hosts the run's collector at MASTER_PORT + 1 and stores the run in its own results database
(inside its pod); `launcher` applies the manifest itself with the official client, the pods
report to a collector on this host, and the run is stored here.

The secret reaches each container as a file: the Secret is mounted read-only (mode 0400) at
SECRET_MOUNT and SEXTANT_COLLECTOR_SECRET_FILE names its key's file, so the value is written in
the Secret document only, never in a pod spec, and never in an environment variable that child
processes, crash reports or `kubectl describe` would show. `validate` checks a manifest offline: the Secret and every pod template against
Kubernetes' own schemas (kubernetes-validate, strict), the custom resources against the CRD
schemas vendored in sextant/launch/crds/ (jsonschema, unknown fields refused).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from sextant import __version__
from sextant.contracts import RankResult
from sextant.core.errors import RunFailed, UserError
from sextant.launch.collector import ENV as COLLECTOR_ENV
from sextant.launch.collector import SECRET_FILE_ENV, Collector, gather, new_secret

if TYPE_CHECKING:
    from sextant.launch.local import EventHandler, Launcher
    from sextant.strategy import Strategy
    from sextant.workloads.spec import Workload

KINDS = ("trainjob", "pytorchjob", "jobset")
KUBERNETES_VERSION = "1.37"
"""The Kubernetes version whose schemas `validate` checks the core objects against (the
newest that the pinned kubernetes-validate ships)."""
CRDS = Path(__file__).with_name("crds")
API_VERSIONS = {"trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
                "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
                "jobset": ("jobset.x-k8s.io/v1alpha2", "JobSet")}
MASTER_PORTS = {"trainjob": 29500, "pytorchjob": 23456, "jobset": 29500}
"""The rendezvous port of each kind: the Trainer's ContainerTrainerPort, the Training
Operator's PyTorchJobDefaultPort, and torch's usual one for JobSet (set by sextant)."""
RUNTIME = "torch-distributed"
"""The Trainer's ClusterTrainingRuntime a TrainJob runs on: its torch plugin injects PET_*."""
SECRET_KEY = "secret"
WORKLOAD_KEY = "workload.toml"
"""The Secret's key that carries a workload given as a file, which the pods read where the
Secret is mounted: a team's own workload needs no image of its own."""
MAX_WORKLOAD_BYTES = 256 * 1024
"""A workload file larger than this is not shipped (a Secret holds at most 1 MiB)."""
SECRET_MOUNT = "/var/run/sextant-secret"
"""Where the run's Secret is mounted in every pod (read-only, mode 0400)."""
SECRET_VOLUME = "sextant-secret"
CONTAINER = {"trainjob": "node", "pytorchjob": "pytorch", "jobset": "node"}
"""The container's name: the Trainer's runtimes and the Training Operator require theirs."""
START_UP_S = 600
"""Added to the run's --timeout for the job's deadline: scheduling and the image pull."""
_QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")
_CPU = re.compile(r"(\d+(\.\d{1,3})?|\d+m)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
NAME_MAX = 40
"""Characters of a job's name: JobSet's pod hostnames add `-node-<i>-<j>` and must stay
within a DNS label (63)."""


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    """The job's name (and its Secret's, with `-collector`), a DNS label."""
    namespace: str
    kind: str
    """One of KINDS."""
    image: str
    """A container image with sextant and the run's framework installed."""
    ranks: int
    """Pods: one rank each."""
    cpu: str
    """CPU requested and limited per pod (a Kubernetes quantity: '4', '500m')."""
    memory: str
    """Memory requested and limited per pod (a Kubernetes quantity: '4Gi')."""
    join_args: tuple[str, ...]
    """`sextant join` arguments that rebuild the run's workload and strategy."""
    time_limit_s: float
    label: str
    gpus_per_rank: int = 0
    """`nvidia.com/gpu` per pod: 1 on GPU runs, none on CPU runs."""
    labels: dict[str, str] = field(default_factory=dict)
    collector: str | None = None
    """host:port of the collector the pods report to (SEXTANT_COLLECTOR) when sextant applies
    the job itself; None in a written manifest, where rank 0 hosts it."""
    workload_toml: str | None = None
    """The workload file's text when the run's workload is a file (shipped in the Secret and
    read by the pods at SECRET_MOUNT/WORKLOAD_KEY); None for a bundled name or an hf: spec,
    which the image resolves itself."""

    @property
    def secret_name(self) -> str:
        return f"{self.name}-collector"

    @property
    def master_port(self) -> int:
        return MASTER_PORTS[self.kind]

    @property
    def command(self) -> list[str]:
        """What every pod runs: the console script the image puts on its PATH."""
        return ["sextant", "join", *self.join_args]

    @classmethod
    def for_run(cls, strategy: Strategy, *, workload: str, timeout_s: float,
                collective_timeout_s: float, steps: int | None = None,
                kind: str = "trainjob", image: str | None = None, cpu: str | None = None,
                memory: str = "4Gi", namespace: str = "default",
                name: str | None = None) -> Job:
        """The job of one run: one pod per rank of its process layout."""
        from sextant.backends.base import layout_of
        from sextant.launch.slurm import join_args

        if kind not in KINDS:
            raise UserError(f"--k8s-kind must be one of {', '.join(KINDS)}. Received: "
                            f"{kind[:80]!r}")
        cpu = cpu if cpu is not None else str(strategy.threads or 4)
        check_quantity("--cpu", cpu, _CPU, "a number of cores ('4', '0.5') or millicores "
                       "('500m')")
        check_quantity("--memory", memory, _QUANTITY, "a Kubernetes quantity such as 4Gi, "
                       "512Mi or 8G")
        if not _DNS_LABEL.fullmatch(namespace) or len(namespace) > 63:
            raise UserError(f"--namespace must be a DNS label (lower-case letters, digits and "
                            f"'-', at most 63). Received: {namespace[:80]!r}")
        image = image or f"sextant:{__version__}"
        if not _IMAGE.fullmatch(image):
            raise UserError(f"--image must be a container image reference (registry/name:tag "
                            f"or @sha256:...). Received: {image[:80]!r}")
        if strategy.threads is None and cpu.isdigit():
            # The pod sees the node's cores but may use only its limit: the ranks' threads
            # follow the limit, not os.cpu_count().
            strategy = replace(strategy, threads=int(cpu))
        world = len(layout_of(strategy).roles)
        toml = _workload_text(workload)
        return cls(name=name or job_name(strategy.label), namespace=namespace, kind=kind,
                   image=image, ranks=world, cpu=cpu, memory=memory,
                   join_args=tuple(join_args(
                       strategy, workload=workload if toml is None
                       else f"{SECRET_MOUNT}/{WORKLOAD_KEY}", timeout_s=timeout_s,
                       collective_timeout_s=collective_timeout_s, steps=steps)),
                   time_limit_s=timeout_s, label=strategy.label,
                   gpus_per_rank=1 if strategy.device == "gpu" else 0, workload_toml=toml)


def _workload_text(workload: str) -> str | None:
    """The text of a workload given as a file, to ship with the job; None for a bundled
    workload's name or an hf: spec (the image has those). Files the workload names in turn
    ([data] files, pretrained weights) must be in the image, or on a volume, at their path."""
    from sextant.sources import is_hf

    path = Path(workload)
    if is_hf(workload) or not path.is_file():
        return None
    size = path.stat().st_size
    if size > MAX_WORKLOAD_BYTES:
        raise UserError(f"the workload file {workload} is {size} bytes; a Kubernetes Secret "
                        f"ships at most {MAX_WORKLOAD_BYTES} here: put it in the image")
    return path.read_text()


def check_quantity(flag: str, value: str, pattern: re.Pattern[str], allowed: str) -> None:
    if not pattern.fullmatch(value) or not re.search(r"[1-9]", value):
        raise UserError(f"{flag} must be {allowed}, above zero. Received: {value[:80]!r}")


def job_name(label: str) -> str:
    """A fresh DNS-label name for a run's job: 'sextant-<label>-<6 hex>' (a new one per run,
    so that a second run does not collide with the first's objects)."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return f"sextant-{slug[:NAME_MAX - 15].strip('-')}-{secrets.token_hex(3)}"


# --- the manifest ---------------------------------------------------------------------------

def manifest(job: Job, secret: bytes) -> list[dict[str, Any]]:
    """The run's objects, in the order they are applied: the Secret, then the job."""
    meta = {"name": job.name, "namespace": job.namespace, "labels": _labels(job),
            "annotations": {"sextant.run/strategy": job.label}}
    data = {SECRET_KEY: _b64(secret.hex())}
    if job.workload_toml is not None:
        data[WORKLOAD_KEY] = _b64(job.workload_toml)
    secret_doc = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": job.secret_name, "namespace": job.namespace,
                               "labels": _labels(job)},
                  "data": data}
    api, kind = API_VERSIONS[job.kind]
    spec = {"trainjob": _trainjob, "pytorchjob": _pytorchjob, "jobset": _jobset}[job.kind](job)
    return [secret_doc, {"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec}]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _labels(job: Job) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sextant", "app.kubernetes.io/instance": job.name,
            "app.kubernetes.io/version": __version__, **job.labels}


def _resources(job: Job) -> dict[str, Any]:
    """Requests equal to limits (Guaranteed QoS: the measured step shares no CPU beyond what
    it asked for); one GPU per pod on GPU runs."""
    limits: dict[str, Any] = {"cpu": job.cpu, "memory": job.memory}
    if job.gpus_per_rank:
        limits["nvidia.com/gpu"] = job.gpus_per_rank
    return {"requests": {"cpu": job.cpu, "memory": job.memory}, "limits": limits}


def _secret_env(job: Job) -> dict[str, Any]:
    return {"name": SECRET_FILE_ENV, "value": f"{SECRET_MOUNT}/{SECRET_KEY}"}


def _secret_volume(job: Job) -> dict[str, Any]:
    return {"name": SECRET_VOLUME, "secret": {"secretName": job.secret_name,
                                              "defaultMode": 0o400}}


def _secret_mount() -> dict[str, Any]:
    return {"name": SECRET_VOLUME, "mountPath": SECRET_MOUNT, "readOnly": True}


def _one_rank_env(job: Job) -> list[dict[str, Any]]:
    """Every pod is one rank: its local rank and local world are 0 and 1 (without them
    `sextant join` takes the whole world as local)."""
    env = [{"name": "LOCAL_RANK", "value": "0"}, {"name": "LOCAL_WORLD_SIZE", "value": "1"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if job.collector:
        env.append({"name": COLLECTOR_ENV, "value": job.collector})
    return env


def _container(job: Job, env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": CONTAINER[job.kind], "image": job.image, "command": job.command,
            "env": [*env, *_one_rank_env(job), _secret_env(job)], "resources": _resources(job),
            "volumeMounts": [_secret_mount()],
            "ports": [{"name": "rendezvous" if job.kind != "pytorchjob" else "pytorchjob-port",
                       "containerPort": job.master_port}]}


def _deadline(job: Job) -> int:
    return int(job.time_limit_s) + START_UP_S


def _trainjob(job: Job) -> dict[str, Any]:
    # PET_* are the Trainer's to set (its webhook refuses them in trainer.env); one process
    # per node, else PET_NPROC_PER_NODE would follow the CPU request.
    return {"runtimeRef": {"apiGroup": "trainer.kubeflow.org",
                           "kind": "ClusterTrainingRuntime", "name": RUNTIME},
            "activeDeadlineSeconds": _deadline(job),
            "trainer": {"image": job.image, "command": job.command, "numNodes": job.ranks,
                        "numProcPerNode": 1, "resourcesPerNode": _resources(job),
                        "env": [*_one_rank_env(job), _secret_env(job)]},
            # The trainer field takes no volumes: the runtime's `node` pods get the Secret's
            # volume through a patch of the runtime's pod template (Trainer v2.3).
            "runtimePatches": [{"manager": "sextant", "trainingRuntimeSpec": {"template": {
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
                    "template": {"spec": {
                        "volumes": [_secret_volume(job)],
                        "containers": [{"name": CONTAINER["trainjob"],
                                        "volumeMounts": [_secret_mount()]}]}}}}}]}}}}]}


def _pod_template(job: Job, env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"labels": _labels(job)},
            "spec": {"restartPolicy": "Never", "containers": [_container(job, env)],
                     "volumes": [_secret_volume(job)]}}


def _pytorchjob(job: Job) -> dict[str, Any]:
    # The operator sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE; nprocPerNode 1 keeps
    # WORLD_SIZE the number of pods.
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never",
                           "template": _pod_template(job, [])}}
    if job.ranks > 1:
        replicas["Worker"] = {"replicas": job.ranks - 1, "restartPolicy": "Never",
                              "template": _pod_template(job, [])}
    return {"nprocPerNode": "1",
            "runPolicy": {"backoffLimit": 0, "activeDeadlineSeconds": _deadline(job),
                          "cleanPodPolicy": "Running"},
            "pytorchReplicaSpecs": replicas}


def _jobset(job: Job) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": "RANK", "valueFrom": {"fieldRef": {
               "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
           {"name": "WORLD_SIZE", "value": str(job.ranks)},
           {"name": "MASTER_ADDR", "value": f"{job.name}-node-0-0.{job.name}"},
           {"name": "MASTER_PORT", "value": str(job.master_port)}]
    return {"network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                "parallelism": job.ranks, "completions": job.ranks,
                "completionMode": "Indexed", "backoffLimit": 0,
                "activeDeadlineSeconds": _deadline(job),
                "template": _pod_template(job, env)}}}]}


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates inside a rendered job. A TrainJob has none of its own (the runtime
    holds it): its trainer's container, as the runtime's `node` container receives it, with
    the volumes and mounts of its runtime patch."""
    spec = obj["spec"]
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    trainer = spec["trainer"]
    patched = [j["template"]["spec"]["template"]["spec"]
               for p in spec.get("runtimePatches", ())
               for j in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
               if j["name"] == "node"]
    mounts = [m for pod in patched for c in pod.get("containers", ())
              if c["name"] == CONTAINER["trainjob"] for m in c.get("volumeMounts", ())]
    return [{"spec": {"restartPolicy": "Never", "containers": [{
        "name": CONTAINER["trainjob"], "image": trainer["image"], "command": trainer["command"],
        "env": trainer["env"], "resources": trainer["resourcesPerNode"],
        "volumeMounts": mounts}],
        "volumes": [v for pod in patched for v in pod.get("volumes", ())]}}]


# --- YAML -----------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(value: Any) -> str:
    # A word stays plain; any other string is in JSON quoting, which YAML reads the same, so
    # no value turns into a number, a boolean or null ('1.0', 'on', 'no') on its way.
    if isinstance(value, str) and _PLAIN_KEY.fullmatch(value) and value.lower() not in _RESERVED:
        return value
    return json.dumps(value)


def _key(key: str) -> str:
    return _scalar(key)


def _yaml(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{_key(k)}:")
                lines += _yaml(v, indent + 2)
            else:
                lines.append(f"{pad}{_key(k)}: {_scalar(v)}")
    else:
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def render(objects: list[dict[str, Any]], header: tuple[str, ...] = ()) -> str:
    """A YAML stream, one document per object, for `kubectl apply -f`."""
    docs = ["\n".join(_yaml(obj, 0)) for obj in objects]
    return "".join(f"# {line}\n" for line in header) + "---\n" + "\n---\n".join(docs) + "\n"


def header(job: Job) -> tuple[str, ...]:
    api, kind = API_VERSIONS[job.kind]
    return (f"Written by sextant {__version__} for {job.label}: a Secret, then a {kind} "
            f"({api}) of {job.ranks} pod(s), each `sextant join`.",
            "The Secret holds the run's collector secret; apply both: kubectl apply -f FILE",
            "Rank 0 stores the run in its own results database (--db) inside its pod.")


# --- offline validation ---------------------------------------------------------------------

def crd_schema(kind: str) -> dict[str, Any]:
    """The vendored OpenAPI v3 schema of a custom resource kind (see crds/README.md)."""
    doc: dict[str, Any] = json.loads((CRDS / f"{kind}.json").read_text())
    return doc


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused where it lists the known ones: the API server
    prunes unknown fields of a structural schema in silence, so a misspelt field would pass
    and then do nothing."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def validate(objects: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a manifest, checked offline (empty when nothing is): the core
    objects and pod templates against Kubernetes KUBERNETES_VERSION, the custom resources
    against the vendored CRD schemas. Needs kubernetes-validate and jsonschema (the
    `kubernetes` extra): UserError naming them when they are missing."""
    try:
        import jsonschema
        import kubernetes_validate
    except ImportError as exc:
        raise UserError(f"validating a manifest needs kubernetes-validate and jsonschema "
                        f"(pip install 'sextant[kubernetes]'): {exc}") from None
    problems: list[str] = []

    def core(doc: dict[str, Any], what: str) -> None:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            problems.append(f"{what}: {where}: {e.message}")

    by_kind = {kind: key for key, (_, kind) in API_VERSIONS.items()}
    for obj in objects:
        what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        if obj.get("kind") not in by_kind:
            core(obj, what)
            continue
        crd = crd_schema(by_kind[obj["kind"]])
        if obj.get("apiVersion") != crd["apiVersion"]:
            problems.append(f"{what}: apiVersion {obj.get('apiVersion')!r}, the vendored "
                            f"schema is {crd['apiVersion']}")
        validator = jsonschema.Draft4Validator(_strict(crd["openAPIV3Schema"]))
        for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in err.path)
            problems.append(f"{what}: {where}: {err.message}")
        for i, template in enumerate(pod_templates(obj)):
            core({"apiVersion": "v1", "kind": "PodTemplate",
                  "metadata": {"name": f"{obj['metadata']['name']}-{i}"},
                  "template": template}, f"{what} pod template {i}")
    return problems


# --- applying to a cluster ------------------------------------------------------------------

PLURALS = {"trainjob": "trainjobs", "pytorchjob": "pytorchjobs", "jobset": "jobsets"}
POLL_S = 5.0
"""Seconds between two looks at the job's pods while the run trains."""
API_TIMEOUT_S = 30


def client() -> Any:
    """The official client, configured from KUBECONFIG (or ~/.kube/config, or the pod's
    service account inside a cluster); UserError in one line without the package or a
    configuration."""
    try:
        from kubernetes import client as k8s
        from kubernetes import config
    except ImportError:
        raise UserError("--launcher kubernetes needs the kubernetes package to apply the job "
                        "(pip install 'sextant[kubernetes]'); --dry-run writes the manifest "
                        "without it") from None
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        elif os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().exists():
            config.load_kube_config()
        else:
            raise UserError("--launcher kubernetes needs a cluster: set KUBECONFIG (or run in "
                            "a pod); --dry-run writes the manifest without one")
    except config.ConfigException as exc:
        raise UserError(f"cannot load the Kubernetes configuration: {_one_line(exc)}") from None
    return k8s


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300]


def _collector_bind(k8s: Any) -> str:
    """This host's address on the network the pods reach it by: SEXTANT_COLLECTOR_ADDR, else
    the source address of the route to the API server."""
    if os.environ.get("SEXTANT_COLLECTOR_ADDR"):
        return os.environ["SEXTANT_COLLECTOR_ADDR"]
    url = urlparse(k8s.Configuration.get_default_copy().host)
    try:
        server = socket.gethostbyname(url.hostname or "")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((server, url.port or 443))  # UDP: only the route is chosen
            return str(s.getsockname()[0])
    except OSError as exc:
        raise UserError(f"cannot find this host's address towards the API server "
                        f"{url.hostname}: {exc}; set SEXTANT_COLLECTOR_ADDR") from None


def _api_error(exc: Any, what: str) -> RunFailed:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    hint = (" (is its operator installed? its CRD is missing)" if status == 404 else "")
    return RunFailed(f"Kubernetes refused {what}: {status} {reason}{hint}")


def apply(k8s: Any, objects: list[dict[str, Any]], job: Job) -> list[tuple[str, str]]:
    """Create the Secret, then the job; returns what was created (kind, name), for delete."""
    from kubernetes.client.rest import ApiException

    created: list[tuple[str, str]] = []
    secret_doc, job_doc = objects
    try:
        k8s.CoreV1Api().create_namespaced_secret(job.namespace,
                                                 k8s.V1Secret.from_dict(secret_doc),
                                                 _request_timeout=API_TIMEOUT_S)
        created.append(("Secret", secret_doc["metadata"]["name"]))
        group, version = job_doc["apiVersion"].split("/")
        k8s.CustomObjectsApi().create_namespaced_custom_object(
            group, version, job.namespace, PLURALS[job.kind], job_doc,
            _request_timeout=API_TIMEOUT_S)
        created.append((job_doc["kind"], job.name))
    except ApiException as exc:
        delete(k8s, job, created)
        raise _api_error(exc, f"the {'job' if created else 'Secret'} of {job.name}") from None
    return created


def delete(k8s: Any, job: Job, created: list[tuple[str, str]]) -> None:
    """Delete what apply created, the job first (its pods go with it); errors are ignored:
    the run's outcome is already decided."""
    from kubernetes.client.rest import ApiException

    api, kind = API_VERSIONS[job.kind]
    for what, name in reversed(created):
        try:
            if what == "Secret":
                k8s.CoreV1Api().delete_namespaced_secret(name, job.namespace,
                                                         _request_timeout=API_TIMEOUT_S)
            else:
                group, version = api.split("/")
                k8s.CustomObjectsApi().delete_namespaced_custom_object(
                    group, version, job.namespace, PLURALS[job.kind], name,
                    propagation_policy="Background", _request_timeout=API_TIMEOUT_S)
        except (ApiException, OSError):
            pass


def pod_selector(job: Job) -> str:
    """The label of the job's pods: sextant's own where it writes the pod template; for a
    TrainJob, whose pods come from the runtime's template, the label of the JobSet the Trainer
    makes under the TrainJob's name (kubeflow/trainer v2.3.0, plugins/jobset/jobset.go)."""
    if job.kind == "trainjob":
        return f"jobset.sigs.k8s.io/jobset-name={job.name}"
    return f"app.kubernetes.io/instance={job.name}"


def pods_state(k8s: Any, job: Job) -> tuple[str, str | None]:
    """What the job's pods are doing ('2 pods: Running, Pending (ImagePullBackOff)'), and a
    reason to stop when one has failed."""
    pods = k8s.CoreV1Api().list_namespaced_pod(
        job.namespace, label_selector=pod_selector(job), _request_timeout=API_TIMEOUT_S).items
    states, failed = [], None
    for pod in pods:
        phase, why = pod.status.phase, None
        for c in pod.status.container_statuses or []:
            waiting, ended = c.state.waiting, c.state.terminated
            why = (waiting.reason if waiting else None) or (
                f"{ended.reason}, exit code {ended.exit_code}" if ended and ended.exit_code
                else None)
        states.append(f"{phase} ({why})" if why else str(phase))
        if phase == "Failed" or why in ("ErrImagePull", "InvalidImageName",
                                        "CreateContainerConfigError"):
            failed = f"pod {pod.metadata.name} failed: {why or phase}"
    return f"{len(pods)} pod(s): {', '.join(states) or 'none yet'}", failed


def launcher(job: Job) -> Launcher:
    """A launcher for runner.execute: apply the manifest with the official client, host the
    collector here, follow the pods, gather, then delete the job and its Secret."""
    from sextant.backends.base import layout_of
    from sextant.launch.local import base_plan

    def launch(workload: Workload, strategy: Strategy, run_dir: Path, *, timeout_s: float,
               collective_timeout_s: float, on_event: EventHandler | None = None,
               resume_step: int | None = None, **_: Any) -> list[RankResult]:
        k8s = client()
        layout = layout_of(strategy)
        plan = base_plan(workload, strategy, run_dir, layout.roles, collective_timeout_s,
                         resume_step)
        secret = new_secret()
        collector = Collector(_collector_bind(k8s), plan, job.ranks, secret=secret,
                              join_timeout_s=collective_timeout_s + START_UP_S)
        applied = replace(job, collector=collector.address)
        created: list[tuple[str, str]] = []
        polled, last = [0.0], [""]

        def ended() -> str | None:
            if time.monotonic() - polled[0] < POLL_S:
                return None
            polled[0] = time.monotonic()
            try:
                last[0], failed = pods_state(k8s, applied)
            except Exception:  # the API server's hiccup is not the run's failure
                return None
            return failed

        try:
            created = apply(k8s, manifest(applied, secret), applied)
            return gather(collector, layout.primary, label=strategy.label, on_event=on_event,
                          deadline=time.monotonic() + timeout_s + START_UP_S, alive=ended)
        except RunFailed as exc:
            if not created or not last[0]:
                raise
            raise RunFailed(f"{exc} ({job.kind} {job.name}: {last[0]})") from exc
        finally:
            delete(k8s, applied, created)
            collector.close()

    return launch
