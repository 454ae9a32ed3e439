"""Every registered backend against the contract (sextant.backends.base / .contracts).

1. Capabilities agree with `require`: every declared mode, parallel strategy, precision,
   compression and checkpointable strategy is accepted (in some combination the backend's
   own `check` allows); every value of the shared vocabulary it does not declare is refused
   with a one-line UserError naming what it supports.
2. Every declared parallel strategy trains gpt-tiny (llama-tiny for tp and pp) for 3 steps and returns a complete
   RankResult: every key the runner aggregates, finite losses and gradient norms, and (for
   synchronous strategies) the losses and gradient norms of torch single within the fp32
   tolerance of tests.helpers.

Runs use the cheapest layout a backend accepts: eager where declared, one process with 2
devices where it can, otherwise 2 worker processes. One run per (backend, strategy), shared
by the assertions.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from sextant.backends.base import REGISTRY, available, get_backend, require
from sextant.contracts import RANK_RESULT_KEYS, result_problem
from sextant.core.errors import UserError
from sextant.strategy import COMPRESSIONS, MODES, PARALLEL, PRECISIONS, Strategy
from tests.helpers import PARITY_RTOL, ensure_environment, same_training, short

BACKENDS = sorted(REGISTRY)
STEPS = 3
ASYNCHRONOUS = ("ps",)
"""Strategies whose updates are asynchronous: they train, but not the synchronous losses."""


def installed(name: str) -> bool:
    """Installed here, or (a framework with an environment of its own) as that environment."""
    return available(name)


ENVIRONMENTS = sorted({env for env in (get_backend(n).ENVIRONMENT for n in BACKENDS) if env})
"""Frameworks in environments of their own (sextant.core.envs): the tests make them."""


@pytest.fixture(scope="module", autouse=True)
def framework_environments() -> None:
    """Create the environments that are missing (the first test run pays; CI runs every
    backend), all at once: each is a venv and a pip install, mostly waiting on downloads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(ENVIRONMENTS))) as pool:
        list(pool.map(ensure_environment, ENVIRONMENTS))


def needs(name: str) -> Any:
    return pytest.mark.skipif(not installed(name), reason=f"{name} not installed")


def accepted(strategy_fields: dict[str, Any]) -> Strategy | None:
    """The strategy if it is valid and `require` accepts it, else None."""
    try:
        strategy = Strategy(**strategy_fields)
        require(strategy)
    except UserError:
        return None
    return strategy


def layouts(framework: str, parallel: str) -> list[dict[str, Any]]:
    """Layouts to try for a strategy, cheapest first (at most 2 workers)."""
    if parallel == "single":
        return [{"framework": framework, "parallel": "single"}]
    base: dict[str, Any] = {"framework": framework, "parallel": parallel}
    if parallel in ("tp", "tp-manual"):
        base["tp"] = 2
    if parallel == "pp":
        base.update(pp=2, microbatches=2)
    if parallel == "ps":
        return [{**base, "workers": 1, "ps": 1}, {**base, "workers": 2, "ps": 1}]
    return [{**base, "workers": 1, "devices_per_worker": 2}, {**base, "workers": 2}]


def cheapest(framework: str, parallel: str, **fields: Any) -> Strategy | None:
    for layout in layouts(framework, parallel):
        strategy = accepted({**layout, **fields})
        if strategy is not None:
            return strategy
    return None


def refusal(fields: dict[str, Any]) -> str:
    with pytest.raises(UserError) as info:
        require(Strategy(**fields))
    return str(info.value)


# --- capabilities agree with require -------------------------------------------------------


@pytest.mark.parametrize("name", BACKENDS)
def test_capabilities_match_require(name: str) -> None:
    if not installed(name):
        # Not installed: require names the pip extra, whatever the strategy.
        assert "not installed" in refusal({"framework": name})
        return
    caps = get_backend(name).capabilities()
    default = caps.modes[0]
    for parallel in caps.parallel:
        assert cheapest(name, parallel, mode=default) is not None, (name, parallel)
    for mode in caps.modes:
        assert accepted({"framework": name, "mode": mode}) is not None, (name, mode)
    for precision in caps.precisions:  # on some strategy (deepspeed: bf16 needs ZeRO 1-3)
        assert any(cheapest(name, p, mode=default, precision=precision) is not None
                   for p in caps.parallel), (name, precision)
    for compress in caps.compress:  # compression needs a strategy with an all-reduce
        assert any(cheapest(name, p, mode=default, compress=compress) is not None
                   for p in caps.parallel), (name, compress)
    for parallel in caps.checkpoint:
        assert cheapest(name, parallel, mode=default, checkpoint_every=1,
                        checkpoint_dir="ckpt") is not None, (name, parallel)
    assert (cheapest(name, "single", mode=default, grad_accum=2) is not None) == caps.grad_accum
    assert (cheapest(name, "single", mode=default, activation_checkpointing=True) is not None
            ) == caps.activation_checkpointing
    if not caps.activation_checkpointing:
        message = refusal({"framework": name, "mode": default, "activation_checkpointing": True})
        assert "\n" not in message and "supported by: " in message

    # Refused, in one line naming what is supported.
    for axis, vocabulary, declared, field in (
        ("mode", MODES, caps.modes, "mode"),
        ("parallel", PARALLEL, caps.parallel, "parallel"),
        ("precision", PRECISIONS, caps.precisions, "precision"),
        ("compression", COMPRESSIONS, caps.compress, "compress"),
    ):
        for value in set(vocabulary) - set(declared):
            layout = (layouts(name, "dp")[-1] if field == "compress"
                      else layouts(name, value)[-1] if field == "parallel"
                      else {"framework": name})
            message = refusal({"mode": default, **layout, field: value})
            assert "\n" not in message
            assert f"does not support {axis} {value!r}" in message
            assert message.endswith("supported: " + ", ".join(declared)), message
    for parallel in set(caps.parallel) - set(caps.checkpoint):
        strategy = cheapest(name, parallel, mode=default)
        assert strategy is not None
        message = refusal({**strategy.to_dict(), "checkpoint_every": 1, "checkpoint_dir": "c"})
        assert "\n" not in message and "cannot checkpoint" in message
        assert ", ".join(caps.checkpoint) in message


def test_every_backend_is_installed_in_ci() -> None:
    """CI installs every framework: a conformance run that skipped one proves nothing."""
    import os

    if not os.environ.get("CI"):
        pytest.skip("outside CI a framework may be missing")
    assert [name for name in BACKENDS if not installed(name)] == []


# --- every declared strategy trains and returns a complete result ---------------------------


CELLS = [(name, parallel) for name in BACKENDS
         for parallel in (get_backend(name).capabilities().parallel
                          if installed(name) or get_backend(name).ENVIRONMENT
                          else ("single",))]
"""Every declared strategy of the backends installed here or made by
`framework_environments` (collected before the fixture runs)."""


MODEL_PARALLEL = ("tp", "tp-manual", "pp")
"""Strategies that split a Llama-shaped model: their cells train llama-tiny."""


@pytest.fixture(scope="module")
def workload() -> Any:
    return short("gpt-tiny", STEPS, nosync_steps=0, log_every=STEPS)


@pytest.fixture(scope="module")
def llama_workload() -> Any:
    return short("llama-tiny", STEPS, nosync_steps=0, log_every=STEPS)


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], Any]:
    """(backend, strategy, workload) -> (record, raw rank results), filled as the cells
    run."""
    return {}


def run_cell(name: str, parallel: str, workload: Any, runs: dict, tmp: Path) -> Any:
    """(record, raw rank results) of one cell, run once per module."""
    from sextant.launch.local import launch
    from sextant.runner import execute

    key = (name, parallel, workload.name)
    if key not in runs:
        caps = get_backend(name).capabilities()
        # Eager where declared: no compilation to pay for (the modes are covered above).
        mode = "eager" if "eager" in caps.modes else caps.modes[0]
        strategy = cheapest(name, parallel, mode=mode)
        assert strategy is not None, f"{name} declares {parallel} but refuses every layout"
        raw: list[dict[str, Any]] = []

        def capturing(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            ranks = launch(*args, **kwargs)
            raw.extend(ranks)
            return ranks

        record = execute(workload, strategy, runs_dir=tmp, launcher=capturing)
        runs[key] = (record, raw)
    return runs[key]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "parallel"), CELLS, ids=[f"{n}-{p}" for n, p in CELLS])
def test_every_declared_strategy_trains(name: str, parallel: str, workload: Any,
                                        llama_workload: Any, runs: dict,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    if not installed(name) or not installed("torch"):
        pytest.skip(f"{name} or torch (the reference) not installed")
    if parallel in MODEL_PARALLEL:
        workload = llama_workload
    tmp = tmp_path_factory.mktemp(f"{name}-{parallel}")
    record, raw = run_cell(name, parallel, workload, runs, tmp)
    reference, _ = run_cell("torch", "single", workload, runs, tmp)

    assert raw, "no primary rank returned a result"
    for result in raw:
        assert result_problem(result) is None, f"{name} {parallel}: {result_problem(result)}"
        assert {"rank", "world"} <= result.keys()
        assert len(result["losses"]) == len(result["grad_norms"]) == STEPS
        assert len(result["step_times_s"]) == STEPS
        assert all(math.isfinite(x) for x in itertools.chain(result["losses"],
                                                             result["grad_norms"]))
        assert result["fingerprint"]["framework"] == name
    assert record.status == "ok" and len(record.losses) == STEPS
    assert record.metrics.step_time_median_s > 0
    assert RANK_RESULT_KEYS >= {"losses", "grad_norms", "step_times_s", "fingerprint"}
    if parallel in ASYNCHRONOUS:
        assert record.losses[-1] < record.losses[0]  # it trains
    else:
        same_training(record, reference, rtol=PARITY_RTOL[record.strategy.precision])
