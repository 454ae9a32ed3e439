"""The articles' deployment claims, judged from the deployment matrix (`sextant compare
deploy`): which formats each framework exported, and whether each artifact served the
trainer's logits.

An artifact *works* when it was exported and served, its logits match the trainer's (or, for
a quantized one, it served at all: its loss change is shown, never a match), and it was not
silently wrong at another shape. A framework's *targets* are those its working artifacts
reach (server, mobile, edge, browser, as each format's record carries them). The
verdicts are counts and sets, not timings, so there is no interval: a format that could not be
tried here (not installed) leaves a verdict it could overturn inconclusive.
"""

from __future__ import annotations

import shlex
from functools import partial
from collections.abc import Mapping, Sequence
from typing import Any

from sextant.claims.check import NOT_MEASURED, Claim
from sextant.measure.intervals import HOLDS, INCONCLUSIVE, NOT_HOLD
from sextant.results.deploy import MISMATCH, OK, SILENTLY_WRONG, UNAVAILABLE, DeployRecord

def deploy_cmd(rows: Sequence[DeployRecord], workload: Mapping[str, Any]) -> str:
    """What reproduces the matrix: the same run's weights again, or (not measured yet) a
    matrix of the workload the runs were made from."""
    source = next((r.source_run for r in rows if r.source_run is not None), None)
    if source is not None:
        return f"sextant compare deploy --from-run {source}"
    name = workload.get("file") or workload.get("name")
    return "sextant compare deploy" + (f" --workload {shlex.quote(str(name))}" if name else "")


def works(r: DeployRecord) -> bool:
    return r.status == OK and r.parity != MISMATCH and r.probe != SILENTLY_WRONG


def _by_framework(rows: Sequence[DeployRecord]) -> dict[str, list[DeployRecord]]:
    out: dict[str, list[DeployRecord]] = {}
    for r in rows:
        out.setdefault(r.framework, []).append(r)
    return out


def _targets(rows: Sequence[DeployRecord]) -> set[str]:
    return {t for r in rows if works(r) for t in r.targets}


def _line(framework: str, rows: Sequence[DeployRecord]) -> str:
    ok = [r.format for r in rows if works(r)]
    not_ok = [f"{r.format} ({r.status if r.status != OK else r.parity or r.probe})"
              for r in rows if not works(r)]
    return (f"{framework}: {len(ok)} working ({', '.join(ok) or 'none'}), reaching "
            f"{', '.join(sorted(_targets(rows))) or 'nothing'}"
            + (f"; not working: {', '.join(not_ok)}" if not_ok else ""))


def _ids(rows: Sequence[DeployRecord]) -> tuple[Any, ...]:
    return tuple(r.id for r in rows if r.id is not None)


def claim_tf_complete(rows: Sequence[DeployRecord], workload: Mapping[str, Any]) -> Claim:
    make = partial(
        Claim,
        id="tf-deploy", claim="TensorFlow has the most complete deployment path",
        compared="the formats each framework's own exporters built from the same weights, "
                 "and the targets its working artifacts reach",
        rule="holds if TensorFlow's working artifacts reach every target another "
             "framework's reach and it has at least as many working formats as each",
        unit="working formats", command=deploy_cmd(rows, workload))
    fw = _by_framework(rows)
    tf = fw.get("tensorflow", [])
    if not any(r.status != UNAVAILABLE for r in tf) or len(fw) < 2:
        return make(verdict=NOT_MEASURED, figure="-",
                     reason="needs TensorFlow's deployment rows and another framework's")
    mine, count = _targets(tf), sum(works(r) for r in tf)
    beaten = [f for f, rs in fw.items() if f != "tensorflow"
              and (_targets(rs) - mine or sum(works(r) for r in rs) > count)]
    verdict = NOT_HOLD if beaten else HOLDS
    reason = ""
    missing = [r.label for r in rows if r.status == UNAVAILABLE]
    if missing and (verdict == HOLDS or any(r.status == UNAVAILABLE for r in tf)):
        verdict, reason = INCONCLUSIVE, (f"not available here: {', '.join(missing)}; they "
                                         f"could change the comparison")
    figure = (f"TensorFlow {count} working formats reaching {', '.join(sorted(mine))}"
              + (f"; more complete: {', '.join(beaten)}" if beaten else ""))
    return make(verdict=verdict, figure=figure, value=float(count),
                 details=tuple(_line(f, rs) for f, rs in fw.items()), reason=reason,
                 run_ids=_ids(rows))


def own_only(r: DeployRecord) -> bool:
    """Whether the artifact needed nothing but its framework's own package."""
    return bool(r.needs) and set(r.needs) <= {r.framework}


def claim_torch_tools(rows: Sequence[DeployRecord], workload: Mapping[str, Any]) -> Claim:
    make = partial(
        Claim,
        id="torch-tools", claim="PyTorch needs extra tools to deploy",
        compared="the targets PyTorch's working artifacts reach with torch alone, against "
                 "those they reach with other packages (onnx, onnxruntime, executorch)",
        rule="holds if some target is reached only through packages beyond torch",
        unit="targets", command=deploy_cmd(rows, workload))
    torch_rows = [r for r in rows if r.framework == "torch"]
    if not any(works(r) for r in torch_rows):
        return make(verdict=NOT_MEASURED, figure="-",
                     reason="no working PyTorch deployment artifact")
    alone = _targets([r for r in torch_rows if own_only(r)])
    extra = _targets(torch_rows) - alone
    verdict = HOLDS if extra else NOT_HOLD
    reason = ""
    unavailable = [r.label for r in torch_rows if r.status == UNAVAILABLE]
    if verdict == NOT_HOLD and unavailable:
        verdict, reason = INCONCLUSIVE, f"not available here: {', '.join(unavailable)}"
    figure = (f"torch alone reaches {', '.join(sorted(alone)) or 'nothing'}"
              + (f"; only with other packages: {', '.join(sorted(extra))}" if extra else ""))
    return make(verdict=verdict, figure=figure, value=float(len(extra)),
                 details=(_line("torch", torch_rows),), reason=reason,
                 run_ids=_ids(torch_rows))


def _defects(rows: Sequence[DeployRecord]) -> int:
    return sum(r.status != UNAVAILABLE and not works(r) for r in rows)


def claim_jax_maturity(rows: Sequence[DeployRecord], workload: Mapping[str, Any]) -> Claim:
    make = partial(
        Claim,
        id="jax-deploy", claim="JAX deploys through SavedModel or ONNX, less maturely",
        compared="JAX's artifacts (jax.export, jax2tf SavedModel and LiteRT, jax2onnx) against "
                 "TensorFlow's, from the same weights",
        rule="holds if a JAX SavedModel or ONNX artifact works, and JAX has fewer working "
             "formats than TensorFlow or more that fail",
        unit="working formats", command=deploy_cmd(rows, workload))
    fw = _by_framework(rows)
    jax, tf = fw.get("jax", []), fw.get("tensorflow", [])
    if not any(r.status != UNAVAILABLE for r in jax) or not any(
            r.status != UNAVAILABLE for r in tf):
        return make(verdict=NOT_MEASURED, figure="-",
                     reason="needs JAX's and TensorFlow's deployment rows")
    through = [r.format for r in jax if works(r) and r.format in ("savedmodel", "onnx")]
    j_ok, t_ok = sum(works(r) for r in jax), sum(works(r) for r in tf)
    less = j_ok < t_ok or _defects(jax) > _defects(tf)
    verdict = HOLDS if through and less else NOT_HOLD
    reason = ""
    if any(r.status == UNAVAILABLE for r in jax + tf):
        verdict, reason = INCONCLUSIVE, "a JAX or TensorFlow format is not available here"
    figure = (f"JAX {j_ok} working ({', '.join(through) or 'no SavedModel or ONNX'}) and "
              f"{_defects(jax)} failing, TensorFlow {t_ok} working and {_defects(tf)} failing")
    return make(verdict=verdict, figure=figure, value=float(j_ok),
                 details=(_line("jax", jax), _line("tensorflow", tf)), reason=reason,
                 run_ids=_ids(jax + tf))


DEPLOY_CHECKS = (claim_tf_complete, claim_torch_tools, claim_jax_maturity)


def deploy_claims(rows: Sequence[DeployRecord], workload: Mapping[str, Any]) -> list[Claim]:
    """The deployment claims over one deployment group's rows (`workload`: the runs' own, for
    the command that measures them)."""
    return [check(rows, workload) for check in DEPLOY_CHECKS]
