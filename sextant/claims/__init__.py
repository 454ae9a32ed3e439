"""The claims check: what articles say about training stacks, next to what was measured here.

Pure functions over results-store run records (RunRecord); importing this package imports
no ML framework. Rules, thresholds and the runs each claim compares: docs/report.md.
"""

from sextant.claims.check import (
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLD,
    NOT_MEASURED,
    VERDICTS,
    Claim,
    ClaimDict,
    check_claims,
    compute_units,
    conditions,
    speedup,
    unequal,
)

__all__ = [
    "HOLDS",
    "INCONCLUSIVE",
    "NOT_HOLD",
    "NOT_MEASURED",
    "VERDICTS",
    "Claim",
    "ClaimDict",
    "check_claims",
    "compute_units",
    "conditions",
    "speedup",
    "unequal",
]
