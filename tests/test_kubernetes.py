"""`sextant run --launcher kubernetes`: the manifest it writes (a Secret and a Kubeflow
TrainJob, PyTorchJob or JobSet), checked offline against the pinned Kubernetes schemas and the
vendored CRD schemas; no secret outside the Secret; and the pods' command and environment,
as each operator would give them, run as local processes that train with parity.

What needs a real cluster (the operators' webhooks and controllers, DNS between pods, image
pulls) is not tested here: see docs/multi-host.md."""

from __future__ import annotations

import base64
import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from sextant.core.errors import UserError
from sextant.launch import kubernetes
from sextant.launch.collector import SECRET_ENV, SECRET_FILE_ENV, new_secret
from sextant.launch.join import identity_from_env
from sextant.launch.local import free_port
from sextant.results.store import ResultsStore
from sextant.runner import execute
from sextant.sources import resolve_workload
from sextant.strategy import Strategy
from tests.helpers import needs_torch, run_cli, same_training, tiny_gpt_file

yaml = pytest.importorskip("yaml")
pytest.importorskip("kubernetes_validate")

STRATEGY = Strategy(framework="torch", mode="eager", parallel="dp", workers=2)


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gpt_file(tmp_path_factory.mktemp("w") / "tiny-k8s.toml", "tiny-k8s", 4)


def dry_run(tmp_path: Path, *flags: str) -> tuple[str, list[dict[str, Any]]]:
    """The manifest `sextant run --launcher kubernetes --dry-run --out` writes: its text and
    its documents as YAML reads them."""
    out = tmp_path / f"m-{len(list(tmp_path.iterdir()))}.yaml"
    proc = run_cli("run", "--launcher", "kubernetes", "--dry-run", "--parallel", "dp",
                   "--workers", "2", "--out", str(out), *flags, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    return text, list(yaml.safe_load_all(text))


# --- the manifest -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", kubernetes.KINDS)
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_manifest_of_each_kind_passes_its_schemas(kind: str, device: str,
                                                      tmp_path: Path) -> None:
    text, docs = dry_run(tmp_path, "--k8s-kind", kind, "--device", device, "--cpu", "2",
                         "--memory", "6Gi", "--namespace", "team-a", "--image",
                         "registry.example/sextant:1")
    assert [d["kind"] for d in docs] == ["Secret", kubernetes.API_VERSIONS[kind][1]]
    assert kubernetes.validate(docs) == []
    assert "Checked offline against Kubernetes 1.37" in text
    assert oct((tmp_path / "m-0.yaml").stat().st_mode & 0o777) == "0o600"
    (template,) = {repr(t): t for t in kubernetes.pod_templates(docs[1])}.values()
    (container,) = template["spec"]["containers"]
    assert container["command"][:2] == ["sextant", "join"]
    assert container["image"] == "registry.example/sextant:1"
    assert container["resources"]["requests"] == {"cpu": "2", "memory": "6Gi"}
    assert container["resources"]["limits"].get("nvidia.com/gpu") == (
        1 if device == "gpu" else None)
    assert all(d["metadata"]["namespace"] == "team-a" for d in docs)


def test_a_gpu_dry_run_prints_nvidia_gpu_limits() -> None:
    out = run_cli("run", "--launcher", "kubernetes", "--dry-run", "--parallel", "dp",
                  "--device", "gpu", timeout=120)
    assert out.returncode == 0, out.stderr
    trainjob = list(yaml.safe_load_all(out.stdout))[1]
    assert trainjob["kind"] == "TrainJob"
    assert trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    assert "nvidia.com/gpu" not in run_cli(
        "run", "--launcher", "kubernetes", "--dry-run", "--parallel", "dp", "--device", "cpu",
        timeout=120).stdout


def test_the_validator_catches_what_the_api_server_would_refuse_or_prune() -> None:
    """The checks can fail: a misspelt field in a CRD, a bad quantity in the pod template, a
    Secret with an unknown field, a string where the CRD wants an integer. (Replica type
    names and CEL rules are the operators' webhooks' to check, on a cluster.)"""
    job = kubernetes.Job.for_run(STRATEGY, workload="gpt-tiny", timeout_s=60,
                                 collective_timeout_s=30, kind="pytorchjob")
    good = kubernetes.manifest(job, new_secret())
    assert kubernetes.validate(good) == []

    typo = copy.deepcopy(good)
    typo[1]["spec"]["runPolicy"]["backofLimit"] = 0
    assert any("backofLimit" in p for p in kubernetes.validate(typo))
    quantity = copy.deepcopy(good)
    container = quantity[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    container["resources"]["limits"]["memory"] = "4 GB"
    assert any("resources.limits.memory" in p for p in kubernetes.validate(quantity))
    secret = copy.deepcopy(good)
    secret[0]["stringdata"] = {"x": "y"}
    assert any(p.startswith("Secret ") for p in kubernetes.validate(secret))
    replica = copy.deepcopy(good)
    replica[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "1"
    assert any("Worker.replicas" in p for p in kubernetes.validate(replica))

    trainjob = kubernetes.manifest(kubernetes.Job.for_run(
        STRATEGY, workload="gpt-tiny", timeout_s=60, collective_timeout_s=30), new_secret())
    trainjob[1]["spec"]["trainer"]["numNodes"] = "2"
    assert any("numNodes" in p for p in kubernetes.validate(trainjob))


@pytest.mark.parametrize("kind", kubernetes.KINDS)
def test_no_secret_outside_the_secret_object(kind: str) -> None:
    secret = new_secret()
    job = kubernetes.Job.for_run(STRATEGY, workload="gpt-tiny", timeout_s=60,
                                 collective_timeout_s=30, kind=kind)
    text = kubernetes.render(kubernetes.manifest(job, secret), kubernetes.header(job))
    head, secret_doc, job_doc = re.split(r"(?m)^---\n", text)
    assert "kind: Secret" in secret_doc
    forms = [secret.hex(), secret.hex().upper(), base64.b64encode(secret.hex().encode()).decode(),
             base64.b64encode(secret).decode()]
    assert base64.b64encode(secret.hex().encode()).decode() in secret_doc
    for form in forms:
        assert form not in job_doc and form not in head
    # The pods read it from the Secret mounted as a file, never from an environment variable.
    assert SECRET_FILE_ENV in job_doc and f"secretName: {job.secret_name}" in job_doc
    assert f"{SECRET_ENV}\n" not in job_doc


def test_the_cli_manifest_keeps_its_secret_in_the_secret(tmp_path: Path) -> None:
    text, docs = dry_run(tmp_path)
    secret = base64.b64decode(docs[0]["data"]["secret"]).decode()
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    assert text.count(secret) == 0 and text.count(docs[0]["data"]["secret"]) == 1
    _, again = dry_run(tmp_path)
    assert again[0]["data"] != docs[0]["data"]  # a fresh secret per run
    assert again[1]["metadata"]["name"] != docs[1]["metadata"]["name"]


def test_yaml_keeps_strings_strings() -> None:
    """Words YAML 1.1 would read as booleans, numbers or null stay strings."""
    objects = [{"a": ["on", "no", "1.0", "0x1F", "null", "~", "1e3", "-x", "a: b", "#c", "yes"],
                "on": "Off", "b": True, "c": 3}]
    assert list(yaml.safe_load_all(kubernetes.render(objects))) == objects


@pytest.mark.parametrize("flags, says", [
    (("--k8s-kind", "mpijob"), "--k8s-kind must be one of trainjob, pytorchjob, jobset"),
    (("--memory", "4GB"), "--memory must be a Kubernetes quantity"),
    (("--memory", "0Gi"), "--memory must be a Kubernetes quantity"),
    (("--cpu", "two"), "--cpu must be a number of cores"),
    (("--namespace", "Team_A"), "--namespace must be a DNS label"),
    (("--image", "a b"), "--image must be a container image reference"),
])
def test_bad_input_is_one_line_and_exit_2(flags: tuple[str, ...], says: str,
                                          tmp_path: Path) -> None:
    out = run_cli("run", "--launcher", "kubernetes", "--dry-run", "--parallel", "dp",
                  "--out", str(tmp_path / "m.yaml"), *flags, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert says in out.stderr
    assert not (tmp_path / "m.yaml").exists()


def test_kubernetes_flags_need_the_kubernetes_launcher() -> None:
    out = run_cli("run", "--k8s-kind", "jobset", "--parallel", "dp", timeout=120)
    assert out.returncode == 2 and "--k8s-kind goes with --launcher kubernetes" in out.stderr


def test_the_trainer_variables_give_the_identity() -> None:
    ident = identity_from_env({"PET_NNODES": "4", "PET_NPROC_PER_NODE": "1",
                               "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "j-node-0-0.j",
                               "PET_MASTER_PORT": "29500"})
    assert (ident.rank, ident.world, ident.local_rank, ident.local_world, ident.master_addr,
            ident.master_port, ident.source) == (3, 4, 0, 1, "j-node-0-0.j", 29500,
                                                  "kubeflow-trainer")
    with pytest.raises(UserError, match="numProcPerNode to 1"):
        identity_from_env({"PET_NNODES": "4", "PET_NPROC_PER_NODE": "auto",
                           "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "a",
                           "PET_MASTER_PORT": "1"})


# --- the pods' command and environment, run here ------------------------------------------

COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def replicas(docs: list[dict[str, Any]], secrets_dir: Path
             ) -> list[tuple[list[str], dict[str, str]]]:
    """Each replica's command and environment as its operator and the kubelet give them to the
    container, per the operators' sources at the vendored versions:
    - TrainJob: kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch.go adds
      PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the completion index), PET_MASTER_ADDR
      `<name>-node-0-0.<name>` and PET_MASTER_PORT 29500 (pkg/constants) to trainer.env;
    - PyTorchJob: kubeflow/trainer v1.9.4 pkg/controller.v1/pytorch/envvar.go and master.go
      add PYTHONUNBUFFERED, MASTER_PORT/PET_MASTER_PORT (the `pytorchjob-port`),
      MASTER_ADDR/PET_MASTER_ADDR `<name>-master-0`, WORLD_SIZE, RANK and PET_NODE_RANK
      (Master 0, Worker i is i+1), PET_NPROC_PER_NODE and PET_NNODES;
    - JobSet: nothing; Kubernetes sets JOB_COMPLETION_INDEX in an Indexed Job's pods and
      resolves the pod template's fieldRef to the completion-index annotation.
    The kubelet mounts the Secret of the same stream where the pod template says: here its
    key's file is written under `secrets_dir` (mode 0400), and the variable naming it points
    there."""
    secret_doc, job = docs
    secret_data = {k: base64.b64decode(v).decode() for k, v in secret_doc["data"].items()}
    name, spec = job["metadata"]["name"], job["spec"]
    pod_spec = kubernetes.pod_templates(job)[0]["spec"]  # every replica mounts it alike
    (volume,) = [v for v in pod_spec["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == secret_doc["metadata"]["name"]
    (mount,) = [m for m in pod_spec["containers"][0]["volumeMounts"]
                if m["name"] == volume["name"]]
    assert mount["readOnly"] and volume["secret"]["defaultMode"] == 0o400
    mounted = {}
    for key, value in secret_data.items():
        path = secrets_dir / key
        path.write_text(value)
        path.chmod(0o400)
        mounted[f"{mount['mountPath']}/{key}"] = str(path)

    def command(argv: list[str]) -> list[str]:  # a mounted file named on the command line
        return [mounted.get(arg, arg) for arg in argv]

    def resolve(env: list[dict[str, Any]], index: int) -> dict[str, str]:
        out = {}
        for var in env:
            source = var.get("valueFrom")
            if source is None:
                out[var["name"]] = mounted.get(var["value"], var["value"])
            elif "secretKeyRef" in source:
                assert source["secretKeyRef"]["name"] == secret_doc["metadata"]["name"]
                out[var["name"]] = secret_data[source["secretKeyRef"]["key"]]
            else:
                assert source["fieldRef"]["fieldPath"] == COMPLETION_INDEX
                out[var["name"]] = str(index)
        return out

    if job["kind"] == "TrainJob":
        trainer = spec["trainer"]
        nodes = trainer["numNodes"]
        return [(command(trainer["command"]), {**resolve(trainer["env"], i),
                 "PET_NNODES": str(nodes),
                 "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]), "PET_NODE_RANK": str(i),
                 "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500"})
                for i in range(nodes)]
    if job["kind"] == "PyTorchJob":
        specs = spec["pytorchReplicaSpecs"]
        world = sum(r["replicas"] for r in specs.values())
        out = []
        for rtype, rspec in specs.items():
            (container,) = rspec["template"]["spec"]["containers"]
            (port,) = [p["containerPort"] for p in specs["Master"]["template"]["spec"][
                "containers"][0]["ports"] if p["name"] == "pytorchjob-port"]
            for i in range(rspec["replicas"]):
                rank = i + 1 if rtype == "Worker" else i
                out.append((command(container["command"]), {
                    **resolve(container["env"], i), "PYTHONUNBUFFERED": "1",
                    "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
                    "MASTER_ADDR": f"{name}-master-0", "PET_MASTER_ADDR": f"{name}-master-0",
                    "WORLD_SIZE": str(world), "RANK": str(rank), "PET_NODE_RANK": str(rank),
                    "PET_NPROC_PER_NODE": spec["nprocPerNode"], "PET_NNODES": str(world)}))
        return out
    (rjob,) = spec["replicatedJobs"]
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    return [(command(container["command"]), {**resolve(container["env"], i),
                                    "JOB_COMPLETION_INDEX": str(i)})
            for i in range(rjob["template"]["spec"]["completions"])]


LAUNCHER_VARIABLES = re.compile(r"(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|"
                                r"MASTER_PORT|PET_.*|SLURM_.*|SEXTANT_COLLECTOR.*|"
                                r"SEXTANT_RESULTS|TORCHELASTIC_.*)")


@pytest.fixture(scope="module")
def local_run(workload_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("torch")
    return execute(resolve_workload(str(workload_file)),
                   Strategy(framework="torch", mode="eager", parallel="dp", workers=2,
                            threads=1),
                   runs_dir=tmp_path_factory.mktemp("local"))


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("kind", kubernetes.KINDS)
def test_the_pods_environment_trains_like_the_local_launcher(
    kind: str, workload_file: Path, local_run: Any, tmp_path: Path
) -> None:
    """Two replicas, each with exactly the command and environment its operator would give
    the pod, run as processes on loopback, each in a directory of its own (a pod's
    filesystem). Two things differ from a cluster, both for this one machine: the master's
    DNS name becomes 127.0.0.1, and its port a free one (each pod has an address of its own,
    this machine has one loopback)."""
    text, docs = dry_run(tmp_path, "--k8s-kind", kind, "--cpu", "1", "--device", "cpu",
                         "--workload", str(workload_file), "--collective-timeout", "60",
                         "--timeout", "180")
    assert kubernetes.validate(docs) == []
    (tmp_path / "secret-volume").mkdir()
    pods = replicas(docs, tmp_path / "secret-volume")
    assert len(pods) == 2
    base = {k: v for k, v in os.environ.items() if not LAUNCHER_VARIABLES.fullmatch(k)}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    port = str(free_port())
    procs = []
    for i, (command, env) in enumerate(pods):
        here = {k: "127.0.0.1" if k.endswith("MASTER_ADDR") else
                port if k.endswith("MASTER_PORT") else v for k, v in env.items()}
        (tmp_path / f"pod-{i}").mkdir()
        procs.append(subprocess.Popen(command, env={**base, **here}, cwd=tmp_path / f"pod-{i}",
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-3000:]
    # Rank 1 keeps only its logs (the run directory's path in its pod); rank 0 stores the run.
    assert not (tmp_path / "pod-1" / "sextant-results" / "results.db").exists()
    with ResultsStore(tmp_path / "pod-0" / "sextant-results" / "results.db",
                      create=False) as store:
        (run,) = store.runs()
        stored = store.get(run.id)
    assert stored.strategy.workers == 2 and stored.strategy.threads == 1
    same_training(stored, local_run)


# --- applying: the official client against a stand-in API server --------------------------

class StandInCluster:
    """An HTTP server on loopback that answers the Kubernetes API calls sextant makes (create
    a Secret and a custom resource, list pods, delete both) and plays the operator: when the
    job is created it starts each replica as a local process with the command and
    environment replicas() gives it, and deletes them when the job is deleted. The client,
    its HTTP requests, the collector, the training and the stored run are real; the API
    server and the operator are this stand-in."""

    def __init__(self, root: Path, fail_rank: int | None = None) -> None:
        import http.server
        import json
        import threading

        self.root, self.fail_rank = root, fail_rank
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        self.queries: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(f"POST {self.path}")
                outer.objects[body["kind"]] = body
                if body["kind"] != "Secret":
                    outer.start(body)
                self._send(201, body)

            def do_GET(self) -> None:
                outer.requests.append(f"GET {self.path.split('?')[0]}")
                outer.queries.append(self.path.partition("?")[2])
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                 "items": outer.pods()})

            def do_DELETE(self) -> None:
                outer.requests.append(f"DELETE {self.path.split('?')[0]}")
                if "/secrets/" not in self.path:
                    outer.stop()
                self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                 "status": "Success"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.kubeconfig = root / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {
                "server": f"http://127.0.0.1:{self.server.server_address[1]}"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in",
                                                          "user": "u"}}]}))

    def start(self, job: dict[str, Any]) -> None:
        base = {k: v for k, v in os.environ.items() if not LAUNCHER_VARIABLES.fullmatch(k)}
        base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
        port = str(free_port())
        (self.root / "secret-volume").mkdir(exist_ok=True)
        for i, (command, env) in enumerate(replicas([self.objects["Secret"], job],
                                                    self.root / "secret-volume")):
            here = {k: "127.0.0.1" if k.endswith("MASTER_ADDR") else
                    port if k.endswith("MASTER_PORT") else v for k, v in env.items()}
            if i == self.fail_rank:
                command = [sys.executable, "-c", "import sys; sys.exit(3)"]
            (self.root / f"pod-{i}").mkdir()
            self.procs.append(subprocess.Popen(
                command, env={**base, **here}, cwd=self.root / f"pod-{i}", text=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def pods(self) -> list[dict[str, Any]]:
        phases = {None: "Running", 0: "Succeeded"}
        return [{"metadata": {"name": f"pod-{i}"},
                 "status": {"phase": phases.get(p.poll(), "Failed")}}
                for i, p in enumerate(self.procs)]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        self.stop()
        self.server.shutdown()
        self.server.server_close()


def cluster_env(cluster: StandInCluster) -> dict[str, str]:
    return {"KUBECONFIG": str(cluster.kubeconfig), "SEXTANT_COLLECTOR_ADDR": "127.0.0.1"}


@pytest.mark.slow
@needs_torch
def test_applying_the_job_collects_the_run_here(workload_file: Path, local_run: Any,
                                                tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    cluster = StandInCluster(tmp_path)
    try:
        db = tmp_path / "here.db"
        out = run_cli("run", "--launcher", "kubernetes", "--parallel", "dp", "--workers", "2",
                      "--cpu", "1", "--device", "cpu", "--workload", str(workload_file),
                      "--db", str(db), "--timeout", "180", "--collective-timeout", "60",
                      env=cluster_env(cluster), timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    finally:
        cluster.close()
    name = cluster.objects["TrainJob"]["metadata"]["name"]
    assert cluster.requests[:2] == [
        "POST /api/v1/namespaces/default/secrets",
        "POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"]
    assert cluster.requests[-2:] == [
        f"DELETE /apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{name}",
        f"DELETE /api/v1/namespaces/default/secrets/{name}-collector"]
    assert parse_qs(cluster.queries[0])["labelSelector"] == [
        f"jobset.sigs.k8s.io/jobset-name={name}"]
    env = {e["name"]: e.get("value")
           for e in cluster.objects["TrainJob"]["spec"]["trainer"]["env"]}
    assert re.fullmatch(r"127\.0\.0\.1:\d+", env["SEXTANT_COLLECTOR"])
    with ResultsStore(db, create=False) as store:  # stored here, not in a pod
        (run,) = store.runs()
        stored = store.get(run.id)
    assert not (tmp_path / "pod-0" / "sextant-results" / "results.db").exists()
    same_training(stored, local_run)


@pytest.mark.slow
@needs_torch
def test_a_failed_pod_fails_the_run_and_deletes_the_job(workload_file: Path,
                                                        tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    cluster = StandInCluster(tmp_path, fail_rank=1)
    try:
        db = tmp_path / "here.db"
        out = run_cli("run", "--launcher", "kubernetes", "--k8s-kind", "jobset", "--parallel",
                      "dp", "--workers", "2", "--cpu", "1", "--device", "cpu", "--workload",
                      str(workload_file), "--db", str(db), "--timeout", "120",
                      "--collective-timeout", "30", env=cluster_env(cluster), timeout=300)
        assert out.returncode != 0 and out.stderr.count("\n") == 1, out.stderr[-3000:]
        assert "pod pod-1 failed: Failed" in out.stderr
        assert cluster.requests[-2][:7] == "DELETE " and "/jobsets/" in cluster.requests[-2]
        assert all(p.poll() is not None for p in cluster.procs)  # nothing left running
        with ResultsStore(db, create=False) as store:
            assert [r.status for r in store.runs()] == ["failed"]
    finally:
        cluster.close()


def test_applying_without_a_cluster_or_the_client_is_one_line(tmp_path: Path) -> None:
    env = {"KUBECONFIG": "", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    out = run_cli("run", "--launcher", "kubernetes", "--parallel", "dp", env=env, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "needs a cluster: set KUBECONFIG" in out.stderr
    hidden = run_cli("run", "--launcher", "kubernetes", "--parallel", "dp", env=env,
                     timeout=120, prelude="import sys; sys.modules['kubernetes'] = None")
    assert hidden.returncode == 2 and "needs the kubernetes package" in hidden.stderr


@pytest.mark.skipif(not os.environ.get("SEXTANT_TEST_KUBECONFIG"),
                    reason="needs a real Kubernetes cluster with the Kubeflow Trainer: set "
                           "SEXTANT_TEST_KUBECONFIG and SEXTANT_TEST_IMAGE (an image with "
                           "sextant and torch) to run it")
def test_a_real_cluster_trains_a_trainjob(workload_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    out = run_cli("run", "--launcher", "kubernetes", "--parallel", "dp", "--workers", "2",
                  "--cpu", "1", "--image", os.environ.get("SEXTANT_TEST_IMAGE", ""),
                  "--db", str(db), "--timeout", "600",
                  env={"KUBECONFIG": os.environ["SEXTANT_TEST_KUBECONFIG"]}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    with ResultsStore(db, create=False) as store:
        assert [r.status for r in store.runs()] == ["ok"]


def test_a_workload_file_ships_in_the_secret(workload_file: Path) -> None:
    """A team's own workload file reaches the pods with the run (no image of its own): its
    text in the Secret, the pods' `sextant join --workload` naming its mounted file; a bundled
    workload's name stays a name."""
    job = kubernetes.Job.for_run(STRATEGY, workload=str(workload_file), timeout_s=60,
                                 collective_timeout_s=30)
    secret_doc, _ = kubernetes.manifest(job, new_secret())
    shipped = base64.b64decode(secret_doc["data"][kubernetes.WORKLOAD_KEY]).decode()
    assert shipped == workload_file.read_text()
    i = job.command.index("--workload")
    assert job.command[i + 1] == f"{kubernetes.SECRET_MOUNT}/{kubernetes.WORKLOAD_KEY}"
    named = kubernetes.Job.for_run(STRATEGY, workload="gpt-tiny", timeout_s=60,
                                   collective_timeout_s=30)
    assert named.workload_toml is None and "gpt-tiny" in named.command
