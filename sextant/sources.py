"""Where a workload comes from: a bundled name ('gpt-tiny'), a TOML file, or a Hugging Face
config or model folder ('hf:path/config.json', 'hf:DIR'); a workload over the user's own
files gets its tokens made (or found in the cache) here, once, before any worker starts, and
one that starts from pretrained weights has their names and shapes checked here. Above
sextant.workloads.spec, sextant.pretrained.hf, sextant.pretrained.weights and sextant.data, which it ties together. The
one place a workload spec is resolved: `run`, `compare` and `check` load it whole
(resolve_workload); the planner reads its file (workload_file) for the shape alone."""

from __future__ import annotations

from pathlib import Path

from sextant.core.errors import UserError
from sextant.workloads.spec import BUNDLED_DIR, HF_PREFIX, Workload, bundled_workloads, load_workload


def is_hf(spec: str | Path) -> bool:
    """Whether `spec` names a Hugging Face config or model folder ('hf:...')."""
    return str(spec).startswith(HF_PREFIX)


def _bundled(spec: str | Path) -> Path | None:
    path = Path(spec)
    bundled = BUNDLED_DIR / f"{path}.toml"
    return bundled if not path.exists() and path.suffix == "" and bundled.is_file() else None


def workload_file(spec: str | Path) -> Path:
    """The TOML file of `spec`: the path itself, or a bundled workload's file by its name
    ('gpt-tiny'); a one-line UserError naming the bundled ones when it is neither."""
    bundled = _bundled(spec)
    if bundled is not None:
        return bundled
    if not Path(spec).exists():
        raise UserError(f"workload file not found: {spec} (bundled workloads: "
                        f"{', '.join(bundled_workloads())})")
    return Path(spec)


def workload_source(spec: str | Path) -> str:
    """How to name the workload `spec` in a command that reproduces a run: the bundled name
    as given, an hf: spec with its config's absolute path, else the file's absolute path."""
    if is_hf(spec):
        from sextant.pretrained.hf import normalise_spec

        return normalise_spec(str(spec))
    return str(spec) if _bundled(spec) is not None else str(Path(spec).resolve())


def resolve_workload(spec: str | Path) -> Workload:
    """Load a workload from a path, by the name of a bundled one ('gpt-tiny'), or from a
    Hugging Face config ('hf:path/config.json'); a workload over your own files has its
    tokens made (or found in the cache) here, once, before any worker starts."""
    if is_hf(spec):
        from sextant.pretrained.hf import workload_from_spec

        workload = workload_from_spec(str(spec))
    else:
        workload = load_workload(workload_file(spec))
    if workload.weights:  # a checkpoint that does not fit is refused before any worker starts
        from sextant.pretrained.weights import check_weights, weights_digest

        check_weights(workload.model, Path(workload.weights))
        workload = workload.replace(weights_digest=weights_digest(Path(workload.weights)))
    if workload.data.instruction:
        from sextant.data.instruction import with_rows

        return with_rows(workload)
    if workload.data.files:
        from sextant.data.files import with_tokens

        return with_tokens(workload)
    return workload
