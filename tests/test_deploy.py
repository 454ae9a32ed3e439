"""The deployment leg: real exporters, real runtimes, each artifact in processes of its own.

One `sextant compare deploy` on gpt-tiny (every format but AOTInductor, whose C++ compile
takes about a minute) is shared by the matrix tests; llama-tiny runs one format per serving
runtime; the faults (a crashing exporter, a changed weight, a silently fixed sequence
length) run in one matrix of their own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import needs_torch, run_cli
from sextant.backends.base import ExportFormat
from sextant.claims.deploy import deploy_claims
from sextant.deploy.matrix import Options, Row, rows, run_matrix, unavailable
from sextant.workloads.init import init_params, params_digest
from sextant.measure.agreement import EXPORT_RTOL, logits_parity
from sextant.results import deploy as rec
from sextant.results.deploy import DeployRecord, Latency
from sextant.results.store import ResultsStore
from sextant.sources import resolve_workload

pytestmark = [pytest.mark.slow, needs_torch]

SKIPPED = {"torch:aoti"}
"""Left out of the shared matrix: AOTInductor's C++ compile (about a minute on two cores)."""


def _every_format() -> list[str]:
    return [f"{r.framework}:{r.format.name}" for r in rows()
            if f"{r.framework}:{r.format.name}" not in SKIPPED]


@pytest.fixture(scope="module")
def gpt_matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """`sextant compare deploy` on gpt-tiny, as a user runs it (a short reference run)."""
    home = tmp_path_factory.mktemp("deploy")
    db = home / "results.db"
    done = run_cli("compare", "deploy", "--steps", "6", "--calls", "5", "--rows", "2",
                   "--formats", ",".join(_every_format()), "--db", str(db),
                   "--report", str(home / "report.html"), cwd=home, timeout=900)
    with ResultsStore(db) as store:
        group = store.latest_deployment_group()
        records = store.deployments(group_id=group)
    return {"done": done, "records": records, "home": home, "db": db}


def test_compare_deploy_lists_every_format_with_its_measurements(gpt_matrix):
    done = gpt_matrix["done"]
    records: list[DeployRecord] = gpt_matrix["records"]  # type: ignore[assignment]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [f"{r.framework}:{r.format}" for r in records] == _every_format()
    working = [r for r in records if r.status == rec.OK]
    assert len(working) >= 8, [(r.label, r.status, r.error) for r in records]
    assert {r.framework for r in working} >= {"torch", "tensorflow", "jax", "keras"}
    for r in working:
        assert r.size_bytes and r.size_bytes > 0 and r.cold_start_s and r.cold_start_s > 0
        assert r.peak_rss_bytes and r.peak_rss_bytes > 0
        assert [lat.batch for lat in r.latency] == [1, 2]
        assert all(lat.n == 5 and lat.low_s is not None for lat in r.latency)
        if r.quantized:
            assert r.parity == rec.QUANTIZED  # never called a match
            assert r.loss_artifact is not None and r.loss_reference is not None
        else:
            assert r.parity == rec.MATCH and r.max_rel is not None and r.max_rel <= EXPORT_RTOL
            assert r.generation_match is True, r.label
        assert r.probe in (rec.WORKS, rec.REFUSED), (r.label, r.probe, r.probe_detail)
    # One set of weights: every row names the reference run's digest.
    assert len({r.params_sha256 for r in records}) == 1


def test_dynamic_shapes_are_reported_as_exported(gpt_matrix):
    by = {f"{r.framework}:{r.format}": r for r in gpt_matrix["records"]}  # type: ignore[attr-defined]
    for name in ("torch:torch-export", "torch:onnx", "tensorflow:savedmodel", "jax:jax-export"):
        assert by[name].probe == rec.WORKS and "seq" in by[name].dynamic, name
    # Keras exports one input signature (batch dynamic, sequence fixed): refused, not wrong.
    assert by["keras:savedmodel"].probe == rec.REFUSED
    assert by["keras:savedmodel"].probe_detail


def test_missing_runtime_is_a_row_with_its_install_hint(gpt_matrix):
    fake = Row("torch", ExportFormat(name="x", runtime="torch", needs=("torch", "no_such_pkg"),
                                     install="pip install no-such-pkg", targets=("server",)))
    assert unavailable(fake) == "not installed: no_such_pkg (pip install no-such-pkg)"
    for r in gpt_matrix["records"]:  # type: ignore[attr-defined]
        if r.status == rec.UNAVAILABLE:
            assert r.error.startswith("not installed: ") and "pip install" in r.error


def test_report_and_claims_read_the_matrix(gpt_matrix):
    html = (gpt_matrix["home"] / "report.html").read_text()  # type: ignore[operator]
    assert 'id="deployment"' in html and "latency at batch 1" in html
    out = gpt_matrix["home"] / "report.json"  # type: ignore[operator]
    done = run_cli("report", "--format", "json", "--out", str(out), "--db", str(gpt_matrix["db"]))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert len(report["deployment"]["rows"]) == len(_every_format())
    claims = {c["id"]: c for c in report["claims"]}
    for key in ("tf-deploy", "torch-tools", "jax-deploy"):
        assert claims[key]["verdict"] != "not measured", claims[key]
        assert claims[key]["details"]


def _matrix(tmp: Path, name: str, formats: list[str], fault: str = "",
            monkeypatch: pytest.MonkeyPatch | None = None) -> list[DeployRecord]:
    w = resolve_workload(name)  # held-out batches start past its steps
    params = init_params(w.model, w.seed)
    npz = tmp / "params.npz"
    np.savez(npz, **params)
    if monkeypatch is not None:
        monkeypatch.setenv("SEXTANT_TEST_FAULT", fault)
    return run_matrix(w, npz, params_sha256=params_digest(params), out_root=tmp / "out",
                      selected=rows(formats=formats), group_id="t",
                      options=Options(rows=2, repeats=3, warmup=1, generate=4))


def test_llama_parity_for_each_serving_runtime(tmp_path):
    formats = ["torch:torch-export", "torch:onnx", "tensorflow:savedmodel", "tensorflow:litert",
               "jax:jax-export"]
    records = _matrix(tmp_path, "llama-tiny", formats)
    for r in records:
        assert r.status == rec.OK, (r.label, r.error)
        assert r.parity == rec.MATCH and r.max_rel <= EXPORT_RTOL, (r.label, r.max_rel)
        assert r.generation_match is True


def test_faults_cost_only_their_own_row(tmp_path, monkeypatch):
    """A crashing exporter fails its row and the rows after it are still measured; a changed
    weight fails parity; a silently fixed sequence length is caught at the probe shape."""
    formats = ["torch:torch-export", "torch:onnx", "tensorflow:litert"]
    fault = ("deploy-crash@torch:onnx,deploy-weight@tensorflow:litert,"
             "deploy-pad@torch:torch-export")
    by = {f"{r.framework}:{r.format}": r
          for r in _matrix(tmp_path, "gpt-tiny", formats, fault, monkeypatch)}
    crashed = by["torch:onnx"]
    assert crashed.status == rec.FAILED and "killed by signal" in crashed.error
    assert by["tensorflow:litert"].status == rec.OK
    assert by["tensorflow:litert"].parity == rec.MISMATCH
    assert by["tensorflow:litert"].max_rel > 10 * EXPORT_RTOL
    padded = by["torch:torch-export"]
    assert padded.parity == rec.MATCH and padded.probe == rec.SILENTLY_WRONG


def test_rows_round_trip_the_store_and_refuse_damage(tmp_path, capsys):
    row = DeployRecord(framework="torch", format="onnx", runtime="onnxruntime", status=rec.OK,
                       workload_name="w", workload_hash="h", params_sha256="p", group_id="g",
                       targets=("server",), needs=("torch", "onnx"), max_rel=1e-7,
                       parity=rec.MATCH, latency=(Latency(batch=1, n=3, p50_s=1e-3,
                                                          p90_s=2e-3, low_s=9e-4,
                                                          high_s=1.1e-3),),
                       max_abs=math.inf)  # an infinity is stored as missing, never NaN text
    with ResultsStore(tmp_path / "r.db") as store:
        row_id = store.add_deployment(row)
        (back,) = store.deployments(group_id="g")
        assert back.id == row_id and back.latency == row.latency and back.max_abs is None
        assert back.targets == ("server",) and back.needs == ("torch", "onnx")
    conn = sqlite3.connect(tmp_path / "r.db")
    with conn:
        conn.execute("UPDATE deployments SET record_json = ?",
                     (json.dumps({**row.to_dict(), "status": "great", "max_abs": None}),))
    conn.close()
    with ResultsStore(tmp_path / "r.db") as store:
        assert store.deployments() == []
    assert "status 'great' is not one of ok, failed, unavailable" in capsys.readouterr().err


def test_logits_parity_is_relative_to_the_largest_logit_and_nan_never_matches():
    ref = np.array([[[10.0, -2.0, 0.001]]], np.float32)
    close = logits_parity(ref + 5e-4, ref)
    assert close.ok and close.max_rel == pytest.approx(5e-5, rel=1e-2)
    assert not logits_parity(ref + 5e-3, ref).ok
    assert not logits_parity(np.full_like(ref, np.nan), ref).ok
    assert not logits_parity(ref[:, :, :2], ref).ok


def _row(framework: str, fmt: str, targets: tuple[str, ...], needs: tuple[str, ...],
         status: str = rec.OK, parity: str | None = rec.MATCH) -> DeployRecord:
    return DeployRecord(framework=framework, format=fmt, runtime="r", status=status,
                        workload_name="w", workload_hash="h", params_sha256="p",
                        targets=targets, needs=needs, parity=parity, probe=rec.WORKS)


WORKLOAD = {"name": "gpt-tiny", "file": "/home/me/my model.toml"}


def test_deployment_claims_follow_the_rows():
    torch_rows = [_row("torch", "torch-export", ("server",), ("torch",)),
                  _row("torch", "onnx", ("server", "browser"), ("torch", "onnx"))]
    tf_rows = [_row("tensorflow", "savedmodel", ("server",), ("tensorflow",)),
               _row("tensorflow", "litert", ("mobile",), ("tensorflow", "ai_edge_litert")),
               _row("tensorflow", "onnx", ("server", "browser"), ("tensorflow", "tf2onnx"))]
    jax_rows = [_row("jax", "jax-export", ("server",), ("jax",)),
                _row("jax", "onnx", ("server",), ("jax", "jax2onnx"), parity=rec.MISMATCH)]
    tf_claim, torch_claim, jax_claim = deploy_claims(torch_rows + tf_rows + jax_rows, WORKLOAD)
    assert tf_claim.verdict == "holds"
    assert torch_claim.verdict == "holds" and "browser" in torch_claim.figure
    assert jax_claim.verdict == "does not hold here"  # its only ONNX artifact mismatched
    jax_rows[1] = _row("jax", "onnx", ("server",), ("jax", "jax2onnx"))
    assert deploy_claims(torch_rows + tf_rows + jax_rows, WORKLOAD)[2].verdict == "holds"
    # A framework reaching a target TensorFlow's artifacts do not: not the most complete.
    more = torch_rows + [_row("torch", "executorch", ("edge",), ("torch", "executorch"))]
    assert deploy_claims(more + tf_rows, WORKLOAD)[0].verdict == "does not hold here"
    # A TensorFlow format that could not be tried leaves the verdict open.
    tf_missing = tf_rows + [_row("tensorflow", "x", ("edge",), ("tensorflow", "y"),
                                 status=rec.UNAVAILABLE, parity=None)]
    assert deploy_claims(torch_rows + tf_missing, WORKLOAD)[0].verdict == "inconclusive"
    assert {c.verdict for c in deploy_claims([], WORKLOAD)} == {"not measured"}
    # The command measures this workload, or re-exports the same run's weights.
    assert deploy_claims([], WORKLOAD)[0].command == (
        "sextant compare deploy --workload '/home/me/my model.toml'")
    sourced = [dataclasses.replace(r, source_run=7) for r in tf_rows]
    assert deploy_claims(sourced, WORKLOAD)[0].command == "sextant compare deploy --from-run 7"


@pytest.mark.parametrize("args, message", [
    (("compare", "deploy", "--frameworks", "paddle"), "no deployment formats for paddle"),
    (("compare", "deploy", "--formats", "torch:tflite"), "unknown deployment format"),
    (("compare", "deploy", "--from-run", "7"), "no run with id 7"),
    (("export", "--run", "1", "--format", "torch:onnx", "--out", "x"), "no results store"),
    (("compare", "deploy", "--rows", "0"), "expected a whole number >= 1"),
])
def test_bad_deploy_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = run_cli(*args, "--db", str(tmp_path / "r.db"), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_lora_run_deploys_as_its_merged_model(tmp_path):
    """The artifacts of a LoRA run serve its adapters folded into the frozen base: what
    `compare deploy --from-run` exports is W + A B x alpha / rank, checked like any model."""
    toml = (Path(__file__).resolve().parents[1] / "workloads" / "llama-tiny.toml").read_text()
    workload = tmp_path / "lora.toml"
    workload.write_text(toml + '\n[finetune]\nmethod = "lora"\nrank = 4\nalpha = 8.0\n')
    db = str(tmp_path / "r.db")
    trained = run_cli("run", "--workload", str(workload), "--steps", "6", "--db", db,
                      cwd=tmp_path, timeout=300)
    assert trained.returncode == 0, trained.stderr
    done = run_cli("compare", "deploy", "--from-run", "1", "--formats",
                   "torch:torch-export,jax:jax-export", "--calls", "3", "--rows", "2",
                   "--no-report", "--db", db, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "adapters are merged into its base weights" in done.stdout
    with ResultsStore(tmp_path / "r.db") as store:
        rows = store.deployments()
        run = store.get(1)
    assert [r.parity for r in rows] == [rec.MATCH, rec.MATCH]
    # The merged parameters, not the run's own (base + adapters), are what was exported.
    assert rows[0].params_sha256 != run.ranks[0].final_params_sha256
