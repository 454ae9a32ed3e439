"""The advisor's fixed vocabulary: candidate stacks and the values a profile may take.

Kept in one module so that the profile parser, the rule loader and the condition language
agree on spelling; every UserError about a bad value lists these tuples.
"""

from __future__ import annotations

CANDIDATES = (
    "pytorch",
    "pytorch+deepspeed",
    "jax",
    "tensorflow",
    "paddle",
    "mindspore",
    "mlx",
)
"""Candidate stacks, in the order used to break exact ties (so ranking is deterministic)."""

FRAMEWORKS = ("pytorch", "jax", "tensorflow", "paddle", "mindspore", "mlx")
"""Frameworks a team can know or a code base can be written in."""

BASE_FRAMEWORK = {
    "pytorch": "pytorch",
    # DeepSpeed/Megatron are PyTorch libraries: PyTorch experience and code carry over.
    "pytorch+deepspeed": "pytorch",
    "jax": "jax",
    "tensorflow": "tensorflow",
    "paddle": "paddle",
    "mindspore": "mindspore",
    "mlx": "mlx",
}
"""The framework whose experience and code a candidate stack builds on."""

HARDWARE = ("nvidia", "amd", "tpu", "ascend", "apple", "cpu")
LEVELS = ("none", "some", "expert")
DEPLOYMENTS = ("server", "mobile", "browser", "edge")
PARALLELISM = ("auto", "manual", "none")
PURPOSES = ("research", "production", "finetune")
EXISTING_CODE = FRAMEWORKS + ("none",)

MEASURED = "measured"
RULE_OF_THUMB = "rule of thumb"
PLANNED = "planner"
"""The labels evidence carries in every output: measured on this workload, assumed from the
rules file, or computed by sextant's planner for the target scale."""
SOURCES = (MEASURED, RULE_OF_THUMB, PLANNED)


def allowed(values: tuple[str, ...]) -> str:
    """'a, b, c' for error messages."""
    return ", ".join(values)
