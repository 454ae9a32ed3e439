"""The advisor: which training stack should this team choose, and what will it cost?

Rules are data (rules.toml), the engine is plain deterministic Python over them, measured
runs from the results store enter as labelled evidence, and every recommendation carries the
rules that fired, its cost of ownership and the input that would change it. Importing this
package imports no ML framework.
"""

from sextant.advisor.engine import Advice, advise
from sextant.advisor.evidence import Evidence, evidence_from_runs
from sextant.advisor.profile import TeamProfile, load_profile, parse_profile
from sextant.advisor.render import render_markdown, to_dict
from sextant.advisor.rules import RuleSet, load_rules
from sextant.advisor.vocab import CANDIDATES

__all__ = [
    "CANDIDATES",
    "Advice",
    "Evidence",
    "RuleSet",
    "TeamProfile",
    "advise",
    "evidence_from_runs",
    "load_profile",
    "load_rules",
    "parse_profile",
    "render_markdown",
    "to_dict",
]
