"""Devices and precision as controlled variables, tested without a GPU: the inventory read
from nvidia-smi's output, CUDA_VISIBLE_DEVICES, one rank per GPU, compare's rows for 0, 1, 2
and 8 GPUs, the precision switches set and read back, and never a ranking across
conditions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sextant.core import devices
from sextant.claims import check_claims, unequal
from sextant.commands.compare import compare_rows
from sextant.core.devices import Accelerator, Inventory
from sextant.core.errors import UserError
from sextant.planner.accelerator_run import catalogue_key, mfu
from sextant.report.model import build_report
from sextant.strategy import Strategy
from sextant.results.record import RunRecord
from tests.report.runs import make_run

SMI = """\
0, NVIDIA H200, 143771, GPU-8f3a0c1e-aaaa-bbbb-cccc-000000000000, 580.65.06
1, NVIDIA H200, 143771, GPU-1b2c3d4e-aaaa-bbbb-cccc-111111111111, 580.65.06
"""


def fake_inventory(n: int, name: str = "NVIDIA H200") -> Inventory:
    return Inventory(accelerators=tuple(
        Accelerator(index=i, name=name, memory_bytes=141 * 2**30, uuid=f"GPU-{i:04d}")
        for i in range(n)), driver="580.65.06", cuda="13.0", source="test")


def test_nvidia_smi_output_is_parsed() -> None:
    found, driver = devices.parse_nvidia_smi(SMI + "garbage line\n")
    assert [a.index for a in found] == [0, 1] and driver == "580.65.06"
    assert found[0].name == "NVIDIA H200" and found[0].memory_bytes == 143771 * 2**20
    assert found[1].uuid.startswith("GPU-1b2c")


@pytest.mark.parametrize(("visible", "expected"), [
    (None, [0, 1]), ("1", [1]), ("1,0", [1, 0]), ("", []), ("-1", []),
    ("GPU-1b2c", [1]), ("0,7,1", [0]),  # CUDA stops at the first entry it cannot match
    ("0,0", [0]),
    ("\u00b2", []), ("--1", []), ("1,\u00b2,0", [1]), ("0,--1", [0]),  # no index: the end
    ("\u0661", []),  # an Arabic-Indic digit is not CUDA's index either
])
def test_cuda_visible_devices_is_honoured(visible: str | None, expected: list[int]) -> None:
    found, _ = devices.parse_nvidia_smi(SMI)
    assert [a.index for a in devices.visible(found, visible)] == expected


def test_device_choice_and_the_one_rank_per_gpu_refusal() -> None:
    assert devices.resolve_device("auto", fake_inventory(0)) == "cpu"
    assert devices.resolve_device("auto", fake_inventory(1)) == "gpu"
    assert devices.resolve_device("cpu", fake_inventory(8)) == "cpu"
    with pytest.raises(UserError, match="no visible GPU"):
        devices.resolve_device("gpu", fake_inventory(0))
    devices.check_ranks_fit("gpu", 1, fake_inventory(1))
    devices.check_ranks_fit("cpu", 8, fake_inventory(1))  # CPU ranks, asked for explicitly
    with pytest.raises(UserError) as exc:
        devices.check_ranks_fit("gpu", 2, fake_inventory(1))
    message = str(exc.value)
    assert "1 GPU (NVIDIA H200" in message and "--device cpu" in message
    assert "\n" not in message


def test_each_rank_sees_only_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "_host_inventory", lambda: fake_inventory(4))
    env = {"CUDA_VISIBLE_DEVICES": "3,1"}
    assert devices.pin_rank("gpu", 1, env) == "GPU-0001"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0001"
    with pytest.raises(UserError, match="local rank 2 has no GPU"):
        devices.pin_rank("gpu", 2, {"CUDA_VISIBLE_DEVICES": "3,1"})
    cpu_env: dict[str, str] = {}
    assert devices.pin_rank("cpu", 0, cpu_env) is None
    assert cpu_env == {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}


def _labels(strategies: list[Strategy]) -> list[str]:
    return [s.label for s in strategies]


def test_compare_rows_follow_the_inventory() -> None:
    fws = ["torch", "jax", "deepspeed"]
    cpu, cpu_skipped = compare_rows(fws, "cpu", fake_inventory(0))
    assert _labels(cpu) == ["torch eager", "torch compiled", "torch dp x2", "jax compiled",
                            "jax compiled dp x2", "deepspeed zero2 x2"]
    assert all(s.precision == "fp32" and s.device == "cpu" for s in cpu) and not cpu_skipped

    one, one_skipped = compare_rows(fws, "gpu", fake_inventory(1))
    assert _labels(one) == ["torch eager bf16", "torch compiled bf16", "jax compiled bf16",
                            "torch eager"]  # the last: the fp32 anchor of the bf16 band
    assert all(s.device == "gpu" and s.workers == 1 for s in one)
    assert len(one_skipped) == 3 and all("needs 2 GPUs" in line for line in one_skipped)

    two, _ = compare_rows(fws, "gpu", fake_inventory(2))
    assert {"torch dp x2 bf16", "torch fsdp x2 bf16", "jax compiled dp x2 bf16",
            "jax compiled fsdp x2 bf16", "deepspeed zero2 x2 bf16"} <= set(_labels(two))
    eight, _ = compare_rows(fws, "gpu", fake_inventory(8))
    assert "torch dp x8 bf16" in _labels(eight) and "torch fsdp x8 bf16" in _labels(eight)
    fp32, _ = compare_rows(["torch"], "gpu", fake_inventory(1), precision="fp32")
    assert _labels(fp32) == ["torch eager", "torch compiled"]


def test_a_framework_that_runs_on_cpu_only_is_listed_not_failed() -> None:
    rows, skipped = compare_rows(["keras"], "gpu", fake_inventory(1))
    assert rows == [] and skipped and "device 'gpu'" in skipped[0]


def test_torch_precision_switches_are_set_and_read_back() -> None:
    import torch

    from sextant.backends import precision

    cpu = torch.device("cpu")
    fp32 = precision.apply_torch("fp32", cpu)
    assert fp32.effective == "fp32" and fp32.switches["cuda.matmul.allow_tf32"] is False
    assert torch.get_float32_matmul_precision() == "highest"
    tf32 = precision.apply_torch("tf32", cpu)
    assert tf32.switches["cuda.matmul.allow_tf32"] is True
    assert tf32.effective == "fp32"  # a CPU has no TF32 units
    assert precision.apply_torch("bf16", cpu).effective == "bf16"
    precision.apply_torch("fp32", cpu)


@pytest.mark.parametrize(("framework", "switch", "fp32_value", "tf32_value"), [
    ("jax", "jax_default_matmul_precision", "highest", "tensorfloat32"),
    ("tensorflow", "tensor_float_32_execution", False, True),
])
def test_jax_and_tensorflow_switches_are_set_and_read_back(
        framework: str, switch: str, fp32_value: object, tf32_value: object) -> None:
    # In a fresh process each: the flags are process-wide, and TensorFlow is not imported
    # beside other frameworks.
    code = ("import json\n"
            "from sextant.backends import precision as p\n"
            f"a, b = p.apply_{framework}('fp32'), p.apply_{framework}('tf32')\n"
            "print(json.dumps([a.to_dict(), b.to_dict()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, check=True).stdout
    fp32, tf32 = json.loads(out.strip().splitlines()[-1])
    assert fp32["switches"][switch] == fp32_value and tf32["switches"][switch] == tf32_value
    assert fp32["effective"] == tf32["effective"] == "fp32"  # no TF32 units on a CPU
    assert tf32["requested"] == "tf32"


def _gpu_run(framework: str, mode: str, step: float, effective: str, **kw: object
             ) -> RunRecord:
    from sextant.planner.version import PLANNER_VERSION, catalogue_hash

    stamp = {"planner_version": PLANNER_VERSION, "catalogue_hash": catalogue_hash()}
    return make_run(framework, mode, step=step, device="gpu",  # type: ignore[arg-type]
                    accelerator="NVIDIA H200", effective_precision=effective, **{**stamp, **kw})


def test_runs_of_another_effective_precision_are_never_ranked() -> None:
    # The H200's first report: JAX ran fp32 as TF32 and was crowned "2.33x faster".
    torch_fp32 = _gpu_run("torch", "eager", 0.218, "fp32")
    jax_tf32 = _gpu_run("jax", "compiled", 0.0934, "tf32")
    assert unequal(jax_tf32, torch_fp32) == "precision tf32 vs fp32"
    report = build_report([torch_fp32, jax_tf32])
    row = report["runs"][1]
    assert row["speedup_vs_reference"] is None and row["not_ranked"] == "precision tf32 vs fp32"
    assert report["summary"]["fastest"]["run"] == "torch eager"
    claim = {c.id: c for c in check_claims([torch_fp32, jax_tf32])}["jax-vs-eager"]
    assert claim.verdict == "not measured" and "different conditions" in claim.reason
    same = _gpu_run("jax", "compiled", 0.269, "fp32")
    claim = {c.id: c for c in check_claims([torch_fp32, same])}["jax-vs-eager"]
    assert claim.verdict == "does not hold here" and claim.value is not None and claim.value < 1
    cpu = make_run("jax", "compiled", step=0.1)
    assert unequal(cpu, torch_fp32) == "device cpu vs gpu; accelerator - vs NVIDIA H200"


def test_mfu_needs_a_catalogued_device() -> None:
    assert catalogue_key("NVIDIA H200") == "h200"
    assert catalogue_key("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert catalogue_key("NVIDIA A100-SXM4-80GB") == "a100-80gb"
    known = mfu(989.4e12 * 0.02, 0.04, "NVIDIA H200", "bf16")
    assert known["mfu"] == pytest.approx(0.5) and known["catalogue"] == "h200"
    unknown = mfu(1e12, 0.1, "Tesla T4", "bf16")
    assert unknown["mfu"] is None and "Tesla T4 is not in the planner's catalogue" in unknown[
        "note"]


def test_the_report_shows_the_accelerator_figures() -> None:
    from sextant.report.html import render

    bf16 = _gpu_run("torch", "eager", 0.032, "bf16", precision="bf16", mfu=0.37,
                    device_peak_bytes=9 * 2**30, planner_step_s=0.0254, planner_error=-0.2)
    fp32 = _gpu_run("torch", "eager", 0.218, "fp32")
    md = render([bf16, fp32], "md")
    assert "| torch eager bf16 | NVIDIA H200 | bf16 | 37% | 9,216 | 25.4 (-20.0%) |" in md
    assert "not ranked (precision fp32 vs bf16)" in md
    html = render([bf16, fp32], "html")
    assert "device peak MB" in html and "Not ranked against torch eager bf16" in html
    assert "device peak MB" not in render([make_run(), make_run("jax", "compiled")], "md")


def test_slurm_asks_for_one_gpu_per_task(capsys: pytest.CaptureFixture[str]) -> None:
    from sextant.cli import main

    # The submitting host (this one) has no GPU; the nodes do: --device gpu is taken as asked.
    assert main(["run", "--launcher", "slurm", "--framework", "torch", "--parallel", "dp",
                 "--workers", "2", "--tasks-per-node", "2", "--device", "gpu",
                 "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --gpus-per-node=2" in script and "--device gpu" in script
    assert main(["run", "--launcher", "slurm", "--framework", "torch", "--parallel", "dp",
                 "--workers", "2", "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "--gpus-per-node" not in script and "--device cpu" in script


def test_report_scaling_efficiency_holds_the_total_compute_equal() -> None:
    single = make_run("torch", "eager", step=0.20)          # 1 worker x 2 threads
    dp = make_run("torch", "eager", "dp", 2, step=0.25)     # 2 workers x 1 thread
    point = build_report([single, dp])["scaling"]["series"][0]["points"][-1]
    assert point["speedup_vs_one"] == pytest.approx(0.8)
    assert point["efficiency"] == pytest.approx(0.8)  # the same 2 cores, not 0.8 / 2
    single, dp = (run.with_metrics(device="gpu", accelerator="NVIDIA H200")
                  for run in (single, dp))
    point = build_report([single, dp])["scaling"]["series"][0]["points"][-1]
    assert point["efficiency"] == pytest.approx(0.4)  # two GPUs against one


def test_the_report_marks_another_planners_figures_stale() -> None:
    from sextant.report.html import render

    old = _gpu_run("torch", "eager", 0.032, "bf16", precision="bf16", mfu=0.37,
                   planner_step_s=0.0254, planner_error=-0.2, planner_version="2000.1.1")
    assert "37% (stale planner)" in render([old], "md")
