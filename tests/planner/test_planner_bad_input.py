"""`sextant plan` refuses hostile or meaningless input with one line and exit code 2
(issue #19, Low list), and refuses impossible layouts the same way."""

from __future__ import annotations

import pytest

from sextant.cli import main

BASE = ["plan", "--model", "llama2-7b", "--gpus", "8", "--no-curve"]


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err and "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--tokens", "nan"], "--tokens"),
        (["--tokens", "0"], "--tokens"),
        (["--tokens", "inf"], "--tokens"),
        (["--price-per-hour", "nan"], "--price-per-hour"),
        (["--price-per-hour", "inf"], "--price-per-hour"),
        (["--global-batch", "0"], "--global-batch"),
        (["--global-batch", "-4"], "--global-batch"),
    ],
)
def test_meaningless_numbers_are_refused(capsys, flags, words):
    assert words in _one_line_error(capsys, BASE + flags)


def test_non_utf8_catalogue(capsys, tmp_path):
    bad = tmp_path / "cat.toml"
    bad.write_bytes(b"[prices]\nh100-sxm = 2.0 # \xff\xfe\n")
    assert "UTF-8" in _one_line_error(capsys, BASE + ["--catalogue", str(bad)])


def test_catalogue_that_is_a_directory(capsys, tmp_path):
    assert "directory" in _one_line_error(capsys, BASE + ["--catalogue", str(tmp_path)])


def _workload(tmp_path, text: str):
    path = tmp_path / "w.toml"
    path.write_text(text)
    return ["plan", "--workload", str(path), "--gpus", "2", "--no-curve"]


def test_workload_nested_5000_deep(capsys, tmp_path):
    argv = _workload(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert "not valid TOML" in _one_line_error(capsys, argv)


def test_workload_with_a_4300_digit_integer(capsys, tmp_path):
    argv = _workload(tmp_path, "seed = " + "9" * 4301 + "\n")
    assert "not valid TOML" in _one_line_error(capsys, argv)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "mixtral-8x7b", "--gpus", "64", "--ep", "3"], "divide the number of experts"),
        (["--model", "mixtral-8x7b", "--gpus", "8", "--dp", "2", "--tp", "4", "--ep", "4"],
         "ep must divide dp x cp"),
        (["--model", "llama2-7b", "--gpus", "8", "--ep", "2"], "needs an MoE model"),
        (["--model", "llama2-7b", "--gpus", "6", "--cp", "3"], "2 x cp chunks"),
        (["--model", "llama2-7b", "--gpus", "8", "--cp", "3"], "cp must divide the device count"),
        (["--model", "llama2-7b", "--gpus", "8", "--tp", "3"], "tp must divide the device count"),
        (["--model", "llama2-7b", "--gpus", "8", "--pp", "3"], "pp must divide the device count"),
        (["--model", "llama2-7b", "--gpus", "8", "--tp", "4", "--cp", "4"],
         "tp x pp x cp must divide"),
        (["--model", "llama2-7b", "--gpus", "64", "--pp", "64"], "layer count"),
        (["--model", "llama2-7b", "--gpus", "8", "--sp", "on", "--tp", "1"], "tp > 1"),
        (["--model", "llama2-7b", "--gpus", "8", "--hsdp", "on", "--zero", "0"], "ZeRO stage"),
        (["--model", "llama2-7b", "--gpus", "8", "--offload", "params", "--zero", "2"],
         "needs zero 3"),
        (["--model", "llama2-7b", "--gpus", "8", "--global-batch", "12", "--dp", "8"],
         "multiple of dp x micro-batch"),
        (["--model", "llama2-7b", "--gpus", "16", "--dp", "2", "--tp", "4", "--pp", "2",
          "--interleave", "2", "--global-batch", "6", "--mbs", "1"], "multiple of pp"),
        (["--model", "llama2-7b", "--gpus", "8", "--accelerator", "a100-80gb", "--fp8"],
         "fp8"),
    ],
)
def test_impossible_layouts_are_one_line_errors(capsys, argv, words):
    assert words in _one_line_error(capsys, ["plan", *argv, "--no-curve"])
