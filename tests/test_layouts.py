"""`compare layouts`: which layouts it runs, why it skips the others, and the code-size
figure it prints (counted in the source, without importing a framework)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from sextant.backends import get_backend
from sextant.backends.code_size import code_lines, strategy_lines
from sextant.commands.compare import layout_strategies, layouts_not_run
from tests.helpers import run_cli

HAS_JAX = importlib.util.find_spec("jax") is not None


def test_code_lines_count_statements_not_docstrings_or_comments() -> None:
    # measure.comm.megatron_tp_payload: a long docstring, then 5 lines of code + signature.
    n = code_lines("sextant.measure.comm:megatron_tp_payload")
    assert 4 <= n <= 8
    # Nested functions are found by qualified name.
    assert code_lines("sextant.backends.jax_backend.train:_step_functions.per_device_step") > 3
    with pytest.raises(LookupError):
        code_lines("sextant.measure.comm:no_such_function")


def test_every_named_strategy_function_exists_and_no_framework_is_imported() -> None:
    for name in ("torch", "jax", "deepspeed"):
        backend = get_backend(name)
        for parallel in backend.capabilities().parallel:
            entries = backend.strategy_code(parallel)
            lines = strategy_lines(entries)
            assert (lines is None) == (not entries)
    # Declared sharding needs a handful of lines; the hand-written split many more.
    jax = get_backend("jax")
    assert strategy_lines(jax.strategy_code("tp")) < 15 < strategy_lines(
        jax.strategy_code("tp-manual"))
    # Counted without importing a framework (the parent process never imports one).
    code = ("import sys; from sextant.backends import get_backend; "
            "from sextant.backends.code_size import strategy_lines; "
            "[strategy_lines(get_backend(f).strategy_code(p)) for f in ('torch', 'jax', 'deepspeed') "
            "for p in get_backend(f).capabilities().parallel]; "
            "print(sorted(m for m in ('torch', 'jax', 'tensorflow', 'deepspeed') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-500:]


def test_layouts_run_what_each_backend_supports_and_say_why_not() -> None:
    labels = [s.label for s in layout_strategies(["torch", "jax", "tensorflow"], 2)]
    for expected in ("torch tp x2", "torch pp x2 m4 gpipe", "torch tp x4 dp2",
                     "jax compiled tp-manual x2", "jax compiled tp x4 dp2"):
        assert expected in labels or not importlib.util.find_spec(expected.split()[0])
    assert not any(label.startswith("tensorflow") and " tp" in label for label in labels)
    lines = " ".join(layouts_not_run(["torch", "jax", "tensorflow"]))
    if importlib.util.find_spec("tensorflow"):
        assert "tensorflow does not run fsdp, tp, tp-manual, pp" in lines
        assert "data-parallel strategies only" in lines


def test_layouts_refuse_a_gpt_workload(tmp_path) -> None:
    out = run_cli("compare", "layouts", "--workload", "gpt-tiny", "--db",
                  str(tmp_path / "r.db"))
    assert out.returncode == 2 and "compare layouts splits a Llama-shaped model" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(not HAS_JAX, reason="jax not installed")
def test_compare_layouts_on_jax_end_to_end(tmp_path) -> None:
    report = tmp_path / "report.html"
    out = run_cli("compare", "layouts", "--frameworks", "jax", "--steps", "6",
                  "--repeats", "1", "--no-calibrate", "--report", str(report),
                  "--db", str(tmp_path / "r.db"), env={"COLUMNS": "250"}, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for label in ("jax compiled tp x2", "jax compiled tp-manual x2", "jax compiled tp x4 dp2"):
        assert label in out.stdout
    assert "jax compiled pp x2 m4 gpipe" in out.stdout and "jax does not run" not in out.stdout
    html = report.read_text()
    section = html[html.index('<section id="layouts">'):]
    section = section[:section.index("</section>")]
    assert section.count("<tr>") == 1 + 7  # header + single, dp, fsdp, tp, tp-manual, pp, dp x tp
    assert "jax compiled tp-manual x2" in section
