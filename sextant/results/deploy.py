"""The typed record of one deployment artifact (`sextant compare deploy`): what was exported,
whether it still computes what the trainer computed, and what it costs to serve.

One row per (framework, format) of one deployment group, stored in the results database's
`deployments` table (sextant.results.store) beside the training runs, so that the report, the
claims and the advisor read deployment as they read training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sextant.core.errors import UserError

DEPLOY_SCHEMA = 1

OK = "ok"
FAILED = "failed"
UNAVAILABLE = "unavailable"
STATUSES = (OK, FAILED, UNAVAILABLE)

MATCH = "match"
MISMATCH = "mismatch"
QUANTIZED = "quantized"
"""Parity verdicts: an fp32 artifact matches or not; a quantized one is never a match, it is
judged by its held-out loss change."""

WORKS = "works"
REFUSED = "refused"
SILENTLY_WRONG = "silently wrong"
"""What an artifact does at a shape other than the one it was exported at."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """Per-call latency at one batch size over `n` timed calls (after warm-up)."""

    batch: int
    n: int
    p50_s: float
    p90_s: float
    low_s: float | None = None
    high_s: float | None = None
    """Interval of the median (sextant.measure.intervals.median_interval)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeployRecord:
    framework: str
    format: str
    runtime: str
    status: str
    workload_name: str
    workload_hash: str
    params_sha256: str
    """Digest of the canonical parameters every artifact of the group was exported from."""
    id: int | None = None
    created_at: str | None = None
    group_id: str | None = None
    source_run: int | None = None
    """The stored training run whose final parameters were exported."""
    targets: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    """The packages (import names) its export and serving needed."""
    quantized: bool = False
    error: str | None = None
    """Why the row failed (the exporter's or runtime's own error, one line), or why it is
    unavailable (with what installs it)."""
    export_s: float | None = None
    size_bytes: int | None = None
    cold_start_s: float | None = None
    """From the serving process's start to its first output."""
    load_s: float | None = None
    """Importing the runtime and loading the artifact (part of the cold start)."""
    max_abs: float | None = None
    max_rel: float | None = None
    argmax_agree: float | None = None
    parity: str | None = None
    loss_reference: float | None = None
    loss_artifact: float | None = None
    dynamic: tuple[str, ...] = ()
    """The dimensions the artifact was exported as dynamic."""
    probe_shape: tuple[int, ...] = ()
    probe: str | None = None
    """At probe_shape (another batch and sequence length): works, refused or silently wrong."""
    probe_detail: str | None = None
    latency: tuple[Latency, ...] = ()
    generation_match: bool | None = None
    """Whether greedy decoding gives the training framework's own tokens."""
    peak_rss_bytes: int | None = None
    threads: int = 1
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.framework} {self.format}"

    def latency_at(self, batch: int) -> Latency | None:
        return next((lat for lat in self.latency if lat.batch == batch), None)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": DEPLOY_SCHEMA, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], name: str = "deployment record:") -> DeployRecord:
        doc = dict(doc)
        schema = doc.pop("schema", DEPLOY_SCHEMA)
        if schema != DEPLOY_SCHEMA:
            raise UserError(f"{name} schema {schema!r} is not one this sextant reads "
                            f"({DEPLOY_SCHEMA})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise UserError(f"{name} unknown fields {', '.join(unknown)}")
        if doc.get("status") not in STATUSES:
            raise UserError(f"{name} status {doc.get('status')!r} is not one of "
                            f"{', '.join(STATUSES)}")
        try:
            doc["latency"] = tuple(Latency(**lat) for lat in doc.get("latency", ()))
            for key in ("targets", "needs", "dynamic", "probe_shape"):
                doc[key] = tuple(doc.get(key, ()))
            return cls(**doc)
        except TypeError as exc:
            raise UserError(f"{name} {exc}") from None
