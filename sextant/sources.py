"""Where a workload comes from: a bundled name ('gpt-tiny'), a TOML file, or a Hugging Face
config or model folder ('hf:path/config.json', 'hf:DIR'); a workload over the user's own
files gets its tokens made (or found in the cache) here, once, before any worker starts, and
one that starts from pretrained weights has their names and shapes checked here. Above
sextant.workload, sextant.hf, sextant.weights and sextant.data, which it ties together."""

from __future__ import annotations

from pathlib import Path

from sextant.workload import BUNDLED_DIR, HF_PREFIX, Workload, load_named


def workload_source(spec: str | Path) -> str:
    """How to name the workload `spec` in a command that reproduces a run: the bundled name
    as given, an hf: spec with its config's absolute path, else the file's absolute path."""
    if str(spec).startswith(HF_PREFIX):
        from sextant.hf import normalise_spec

        return normalise_spec(str(spec))
    path = Path(spec)
    if not path.exists() and (BUNDLED_DIR / f"{path}.toml").is_file():
        return str(spec)
    return str(path.resolve())


def resolve_workload(spec: str | Path) -> Workload:
    """Load a workload from a path, by the name of a bundled one ('gpt-tiny'), or from a
    Hugging Face config ('hf:path/config.json'); a workload over your own files has its
    tokens made (or found in the cache) here, once, before any worker starts."""
    if str(spec).startswith(HF_PREFIX):
        from sextant.hf import workload_from_spec

        workload = workload_from_spec(str(spec))
    else:
        workload = load_named(spec)
    if workload.weights:  # a checkpoint that does not fit is refused before any worker starts
        from sextant.weights import check_weights, weights_digest

        check_weights(workload.model, Path(workload.weights))
        workload = workload.replace(weights_digest=weights_digest(Path(workload.weights)))
    if workload.data.instruction:
        from sextant.data.instruction import with_rows

        return with_rows(workload)
    if workload.data.files:
        from sextant.data.files import with_tokens

        return with_tokens(workload)
    return workload
