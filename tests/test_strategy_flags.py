"""The strategy serialises itself: Strategy.to_flags spells out every field, `sextant join`
(the command a Slurm job or torchrun starts on every rank) parses it back into the same
strategy, and `sextant run --launcher slurm --dry-run` prints those flags."""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
from pathlib import Path

import pytest

from sextant.cli import build_parser
from sextant.commands.run import strategy_from_args
from sextant.launch.slurm import join_args
from sextant.core.fields import flag_of
from sextant.strategy import Strategy
from tests.helpers import run_cli

CASES = [
    Strategy(framework="torch", mode="compiled", parallel="dp", workers=2, precision="bf16",
             grad_accum=2, compress="bf16", activation_checkpointing=True, checkpoint_every=2,
             checkpoint_dir="ck", resume=True, trust_checkpoint=True, threads=1),
    Strategy(framework="jax", mode="compiled", parallel="dp", workers=1, devices_per_worker=2),
    Strategy(framework="tensorflow", parallel="ps", workers=2, ps=1),
    Strategy(framework="torch", parallel="tp", workers=2, tp=2, sequence_parallel=True),
    Strategy(framework="torch", parallel="pp", workers=2, pp=2, microbatches=4,
             schedule="1f1b"),
    Strategy(framework="keras", mode="compiled", keras_backend="torch"),
    Strategy(framework="torch", device="gpu", precision="tf32"),
]
"""Between them, every field away from its default (checked below)."""


def parse_join(flags: list[str]):
    return build_parser().parse_args(["join", "--workload", "gpt-tiny", *flags])


def test_the_cases_move_every_field_off_its_default():
    default = Strategy(framework="jax")  # framework: every case differs from jax or is jax
    moved = {f.name for case in CASES for f in dataclasses.fields(Strategy)
             if getattr(case, f.name) != getattr(default, f.name)}
    assert moved == {f.name for f in dataclasses.fields(Strategy)}


@pytest.mark.parametrize("strategy", CASES, ids=lambda s: s.label)
def test_join_reads_every_field_back_from_the_flags(strategy: Strategy):
    args = parse_join(strategy.to_flags())
    for f in dataclasses.fields(Strategy):
        assert getattr(args, f.name) == getattr(strategy, f.name), flag_of(f.name)


@pytest.mark.parametrize("strategy", [s for s in CASES if s.device == "cpu"],
                         ids=lambda s: s.label)
def test_join_rebuilds_the_same_strategy(strategy: Strategy):
    package = strategy.keras_backend if strategy.framework == "keras" else strategy.framework
    if importlib.util.find_spec(package) is None or (
            strategy.framework == "keras" and importlib.util.find_spec("keras") is None):
        pytest.skip(f"needs {package}")
    assert strategy_from_args(parse_join(strategy.to_flags())) == strategy


def test_join_args_carry_the_workload_and_limits_before_the_strategy():
    strategy = CASES[0]
    out = join_args(strategy, workload="w.toml", timeout_s=900.0, collective_timeout_s=60.0,
                    steps=5)
    assert out == ["--workload", "w.toml", "--collective-timeout", "60", "--timeout", "900",
                   "--steps", "5", *strategy.to_flags()]


def test_the_slurm_dry_run_keeps_checkpointing_and_resume(tmp_path: Path):
    out = run_cli("run", "--launcher", "slurm", "--parallel", "dp", "--workers", "2",
                  "--checkpoint-every", "2", "--checkpoint-dir", "ck", "--resume",
                  "--trust-checkpoint", "--devices-per-worker", "1", "--dry-run", timeout=120)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if "sextant.cli join" in ln]
    argv = shlex.split(line)
    flags = argv[argv.index("join") + 1:]
    args = build_parser().parse_args(["join", *flags])
    assert (args.checkpoint_every, args.checkpoint_dir, args.resume, args.trust_checkpoint,
            args.devices_per_worker, args.device, args.precision) == (
        2, "ck", True, True, 1, "cpu", "fp32")


def test_every_strategy_field_is_a_flag_of_run_and_join():
    """The flags are made from the Strategy's declaration: a new field is a new flag."""
    for command in ("run", "join"):
        args = build_parser().parse_args([command, "--framework", "torch"])
        missing = [f.name for f in dataclasses.fields(Strategy) if not hasattr(args, f.name)]
        assert not missing, (command, missing)


def test_a_strategy_file_sets_the_fields_and_a_flag_wins(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text('framework = "torch"\nparallel = "dp"\nworkers = 2\ngrad_accum = 2\n'
                    'compress = "bf16"\n')
    args = build_parser().parse_args(["run", "--strategy", str(path), "--grad-accum", "4"])
    strategy = strategy_from_args(args)
    assert (strategy.parallel, strategy.workers, strategy.grad_accum, strategy.compress) == (
        "dp", 2, 4, "bf16")


def test_a_strategy_file_with_an_unknown_field_is_one_line(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text('framework = "torch"\nworkerz = 2\n')
    out = run_cli("run", "--strategy", str(path), timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"sextant: error: strategy file {path}: unknown field 'workerz'; allowed: "
        + ", ".join(f.name for f in dataclasses.fields(Strategy))]
