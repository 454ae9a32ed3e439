"""Property-based tests over the inputs a user writes: workload files, team profiles and
command lines. Every outcome is a success or sextant's own one-line error (UserError, exit
code 2), never another exception.

The default run tries a few hundred generated cases in all (seconds). The long version, at
least 10,000 cases per property, runs with SEXTANT_LONG_TESTS=1 (docs/reliability.md):

    SEXTANT_LONG_TESTS=1 python -m pytest tests/test_properties.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sextant.core.errors import UserError
from sextant.workloads.spec import load_workload, workload_from_dict

LONG = os.environ.get("SEXTANT_LONG_TESTS") == "1"
REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "examples" / "profiles" / "startup-nvidia-pytorch.toml"


def cases(default: int) -> settings:
    return settings(max_examples=10_000 if LONG else default, deadline=None,
                    derandomize=not LONG, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# --- values a user might write, good and bad ------------------------------------------------

NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=300),
    st.sampled_from([0, 1, 2, 4, 8, 16, 64, 256, 1797, 1798, 2**31, 2**63, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 1e300, 1e308, 3e-3, 0.5, 0.999, 1.0]),
)
ANY_VALUE = st.one_of(
    NUMBERS, st.booleans(), st.text(max_size=12),
    st.lists(st.integers(min_value=-2, max_value=300), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def maybe(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A table with any subset of `keys` (valid-looking values mostly, anything sometimes),
    now and then with an unknown key."""
    return st.fixed_dictionaries({}, optional={
        **{k: st.one_of(v, v, ANY_VALUE) for k, v in keys.items()},
        "bogus": ANY_VALUE,
    })


MODEL = st.one_of(
    maybe({"family": st.just("mlp"), "input_dim": NUMBERS, "num_classes": NUMBERS,
           "hidden": st.lists(st.integers(min_value=-1, max_value=200), max_size=3)}),
    maybe({"family": st.just("gpt"), "vocab_size": st.sampled_from([256, 255]),
           "seq_len": NUMBERS, "d_model": NUMBERS, "n_layers": NUMBERS,
           "n_heads": NUMBERS, "d_ff": NUMBERS}),
)
WORKLOAD_TABLE = st.fixed_dictionaries(
    {"name": st.one_of(st.text(max_size=30), st.just("../x[/bold]"), ANY_VALUE),
     "model": st.one_of(MODEL, MODEL, ANY_VALUE),
     "data": st.one_of(maybe({"dataset": st.sampled_from(["digits", "python-reference", "x"])}),
                       ANY_VALUE)},
    optional={
        "seed": NUMBERS, "steps": NUMBERS, "global_batch": NUMBERS,
        "description": st.text(max_size=10),
        "optimizer": maybe({"name": st.just("adamw"), "lr": NUMBERS, "beta1": NUMBERS,
                            "beta2": NUMBERS, "eps": NUMBERS, "weight_decay": NUMBERS,
                            "warmup_steps": NUMBERS, "min_lr_ratio": NUMBERS}),
        "measure": maybe({"warmup_steps": NUMBERS, "nosync_steps": NUMBERS,
                          "log_every": NUMBERS}),
        "bogus": ANY_VALUE,
    },
)


@cases(200)
@example({"name": "w", "model": {"family": "mlp"}, "data": {"dataset": "digits"},
          "optimizer": {"lr": 10**400}})  # OverflowError in math.isfinite
@example({"name": "w", "model": {"family": "mlp"}, "data": {"dataset": "digits"},
          "optimizer": {"weight_decay": math.inf}})  # issue 19: accepted, then NaN losses
@given(WORKLOAD_TABLE)
def test_workload_tables(raw: dict[str, Any]) -> None:
    try:
        workload = workload_from_dict(raw)
    except UserError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2_000
        return
    workload.content_hash()
    workload.state_hash()
    # What would otherwise fail late, inside a worker: the first global batch of a valid workload.
    if workload.global_batch * workload.tokens_per_sample <= 1 << 16:
        from sextant.data import global_batch

        x, _ = global_batch(workload, 0)
        assert x.shape[0] == workload.global_batch


# --- whole files, including what tomllib itself chokes on -----------------------------------

GOOD = (REPO / "sextant" / "workloads" / "gpt-tiny.toml").read_text()
HOSTILE_FRAGMENTS = st.sampled_from([
    "x = " + "[" * 5000 + "]" * 5000,
    "x = " + "{a = " * 3000 + "1" + "}" * 3000,
    "steps = " + "9" * 5000,
    "seed = 1" + "0" * 4400,
    "[model]\nfamily = 'gpt'\nseq_len = 1_000_000",
    "steps = 1e400",
    "name = \"\\u0000\"",
    "\x00",
    "steps = nan",
    "[optimizer]\nweight_decay = inf",
])


@cases(80)
@given(st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.tuples(st.integers(0, len(GOOD)), HOSTILE_FRAGMENTS).map(
        lambda cut: GOOD[:cut[0]] + "\n" + cut[1] + "\n" + GOOD[cut[0]:]),
))
def test_workload_files(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.toml"
        path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
        try:
            load_workload(path)
        except UserError as exc:
            assert "\n" not in str(exc)


def test_hostile_files_are_one_line_errors(tmp_path: Path) -> None:
    """The reproductions of issue 19: nesting 5,000 deep and a 4,400-digit integer (before:
    RecursionError and ValueError tracebacks)."""
    path = tmp_path / "w.toml"
    for text, fragment in (("x = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
                           ("seed = 1" + "0" * 4400, "Exceeds the limit")):
        path.write_text(text)
        with pytest.raises(UserError, match=fragment):
            load_workload(path)


# --- team profiles --------------------------------------------------------------------------

BASE_PROFILE = tomllib.loads(PROFILE.read_text())
PROFILE_NUMBERS = ("model_params", "gpu_price_per_hour", "devices", "training_hours",
                   "training_tokens", "engineer_cost_per_day", "team_size", "deadline_weeks")


@cases(150)
@example({"gpu_price_per_hour": 1e308}, set())  # issue 19: scores were NaN
@example({"model_params": 10**400}, set())  # OverflowError in math.isfinite
@example({"model_params": 1e-300}, set())  # a cost near 0: the cost ratio overflowed
@given(st.dictionaries(st.sampled_from(PROFILE_NUMBERS + ("hardware", "deployment", "bogus")),
                       st.one_of(NUMBERS, NUMBERS, ANY_VALUE), max_size=4),
       st.sets(st.sampled_from(PROFILE_NUMBERS), max_size=2))
def test_profiles_rank_with_finite_scores(changes: dict[str, Any], dropped: set[str]) -> None:
    from sextant.advisor.engine import advise
    from sextant.advisor.profile import parse_profile

    raw = {k: v for k, v in {**BASE_PROFILE, **changes}.items() if k not in dropped}
    try:
        profile = parse_profile(raw)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    advice = advise(profile)
    assert all(math.isfinite(r.score) for r in advice.ranking), advice.ranking


# --- command lines --------------------------------------------------------------------------

FLAG_VALUES = st.one_of(st.sampled_from(["0", "-1", "1", "2", "3", "nan", "inf", "-inf", "1e9",
                                         "", "x", "1.5", "10" * 30]),
                        st.text(max_size=6))
RUN_FLAGS = ("--steps", "--timeout", "--workers", "--devices-per-worker", "--ps",
             "--grad-accum", "--checkpoint-every", "--threads", "--framework", "--mode",
             "--parallel", "--precision", "--compress", "--workload")


@cases(150)
@example([("--workload", "\x1e")], False)  # a line separator in a file name
@given(st.lists(st.tuples(st.sampled_from(RUN_FLAGS), FLAG_VALUES), max_size=5),
       st.booleans())
def test_run_command_lines(flags: list[tuple[str, str]], resume: bool) -> None:
    """`sextant run` with generated flags. --db names a directory, so a command line that
    passes every check stops at the store and nothing is launched."""
    argv = ["run", "--db", tempfile.gettempdir()]
    for flag, value in flags:
        argv += [flag, value]
    if resume:
        argv += ["--resume", "--checkpoint-dir", "/nonexistent/ckpt"]
    code, _, err = in_process(argv)
    assert code == 2, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sextant: error: "), (argv, err)


def in_process(argv: list[str]) -> tuple[Any, str, str]:
    """sextant's main() with `argv` in this process: (exit code, stdout, stderr). Anything
    but SystemExit that escapes main() fails the test with its traceback."""
    from sextant.cli import main

    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        finally:  # main() installs its own; pytest's must stay
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return code, out.getvalue(), err.getvalue()


def exit_0_or_one_line(argv: list[str]) -> tuple[Any, str]:
    """Run `argv`; assert it succeeded or ended in sextant's one-line error (exit 2)."""
    code, out, err = in_process(argv)
    assert code in (0, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err, (argv, err[-2000:])
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sextant: error: "), (argv, err)
    return code, out


# --- Hugging Face configs (issue 50) -------------------------------------------------------

HF_DIR = REPO / "tests" / "data" / "hf"
HF_BASES = [json.loads((HF_DIR / name / "config.json").read_text())
            for name in ("tinyllama-1.1b-chat-v1.0", "gpt2")]
HOSTILE_TEXT = st.sampled_from([
    "x\nseed = 7\n[optimizer]\nlr = 0.5", "\x1b]0;owned\x07\x1b[2J", "\ud800", "\u2028",
    "\u202e", '"', "\\", "\U0001f600", "", "a" * 300])
HF_VALUES = st.one_of(
    ANY_VALUE, HOSTILE_TEXT, st.none(),
    st.sampled_from([10**400, 2**53 + 1, -1, 0.0, 1e-300, [], {}, {"rope_type": "default"},
                     {"rope_theta": None}, {"rope_theta": "x"}, [[[[1]]]]]),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=2), max_leaves=6),
)
HF_KEYS = sorted({k for base in HF_BASES for k in base} | {
    "rope_parameters", "head_dim", "num_key_value_heads", "rope_scaling", "sliding_window",
    "_name_or_path", "attention_bias", "num_local_experts", "bogus"})
HF_FLAGS = st.lists(st.tuples(st.sampled_from(["--scale", "--layers", "--width", "--seq-len",
                                               "--global-batch", "--steps"]),
                              st.sampled_from(["0.01", "0.5", "1", "2", "0", "-1", "nan",
                                               "1e9", "64", "7", "x"])), max_size=2)


@cases(60)
@example(0, {"num_key_value_heads": 64}, [("--scale", "0.01")])  # a division by zero
@example(0, {"rope_parameters": [1]}, [])
@example(0, {"layer_norm_epsilon": 10**400}, [])  # OverflowError in math.isfinite
@example(0, {"_name_or_path": "x\n[optimizer]\nlr = 0.5 \ud800"}, [])
@given(st.integers(0, len(HF_BASES) - 1),
       st.dictionaries(st.sampled_from(HF_KEYS), HF_VALUES, max_size=3), HF_FLAGS)
def test_hf_configs_give_one_workload_or_one_line(base: int, changes: dict[str, Any],
                                                  flags: list[tuple[str, str]]) -> None:
    """`workload from-hf` over a real config with fields changed to anything: exit 0 with
    printable-ASCII TOML that loads as exactly one workload, or exit 2 in one line; the same
    config through `plan --workload hf:...` likewise."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps({**HF_BASES[base], **changes}))
        argv = ["workload", "from-hf", str(path)]
        for flag, value in flags:
            argv += [flag, value]
        code, out = exit_0_or_one_line(argv)
        if code == 0:
            assert all(32 <= ord(c) < 127 for c in out.replace("\n", "")), out
            assert set(tomllib.loads(out)) == {"name", "description", "steps", "global_batch",
                                               "model", "data"}
            (Path(tmp) / "w.toml").write_text(out)
            load_workload(Path(tmp) / "w.toml")
        exit_0_or_one_line(["plan", "--workload", f"hf:{path}", "--gpus", "8", "--no-curve"])


# --- workload files given to plan, and plan's flags (issue 50) ------------------------------

PLAN_FRAGMENTS = st.sampled_from([
    "model = 3", 'model = "gpt"', "model = [1, 2]", "model = {}", "[model]\nfamily = 7",
    "[model]\nfamily = 'llama'\nn_kv_heads = 99", "[model]\nd_model = " + "9" * 400,
    "[data]\nfiles = 3", "data = 'x'", "global_batch = {}", "steps = -1"])


@cases(40)
@example(0, "model = 3")  # AttributeError in plan's family check
@given(st.integers(0, len(GOOD)), PLAN_FRAGMENTS)
def test_plan_reads_any_workload_file(cut: int, fragment: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.toml"
        path.write_text(GOOD[:cut] + "\n" + fragment + "\n" + GOOD[cut:])
        exit_0_or_one_line(["plan", "--workload", str(path), "--gpus", "8", "--no-curve"])


PLAN_FLAGS = ("--gpus", "--accelerator", "--network", "--gpus-per-node", "--tokens",
              "--global-batch", "--precision", "--dp", "--tp", "--pp", "--zero", "--mbs",
              "--cp", "--ep", "--mfu", "--stack", "--memory-model", "--overlap",
              "--link-efficiency", "--fragmentation", "--overhead-gb", "--price-per-hour",
              "--goodput", "--interleave", "--offload", "--recompute", "--optimizer",
              "--host-memory-gb", "--oversubscription", "--kernel-efficiency", "--top")


@cases(60)
@example("llama2-7b", [("--gpus", "10" * 30)], True)  # a search that never ended
@example("llama2-7b", [("--gpus-per-node", "10" * 30)], False)  # numpy's OverflowError
@given(st.sampled_from(["llama2-7b", "gpt3-175b", "llama3-8b", "x"]),
       st.lists(st.tuples(st.sampled_from(PLAN_FLAGS), FLAG_VALUES), max_size=4),
       st.booleans())
def test_plan_flags(model: str, flags: list[tuple[str, str]], search: bool) -> None:
    argv = ["plan", "--model", model, "--gpus", "8", "--no-curve"]
    for flag, value in flags:
        argv += [flag, value]
    if search:
        argv.append("--search")
    exit_0_or_one_line(argv)
