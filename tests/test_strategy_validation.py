"""Every Strategy field carries its validator (sextant.strategy: one_of, int_at_least,
boolean), and a bad value is a UserError that names what was received and what is allowed."""

from __future__ import annotations

import dataclasses

import pytest

from sextant.core.errors import UserError
from sextant.strategy import Strategy, boolean, int_at_least, one_of

CHECKED = [f for f in dataclasses.fields(Strategy) if "check" in f.metadata]


def test_every_field_but_the_free_text_ones_is_checked():
    assert {f.name for f in dataclasses.fields(Strategy)} - {f.name for f in CHECKED} == {
        "checkpoint_dir", "resume"}


def bad_value(field: dataclasses.Field) -> object:
    """A value the field's validator must refuse: 1 for a flag, -1 for a count (0 for the
    optional thread count), an unknown word for a vocabulary."""
    if field.name == "threads":
        return 0
    if isinstance(field.default, bool):
        return 1
    return -1 if isinstance(field.default, int) else "bogus"


@pytest.mark.parametrize("field", CHECKED, ids=lambda f: f.name)
def test_a_bad_value_names_the_field_or_its_vocabulary(field):
    bad = bad_value(field)
    with pytest.raises(UserError) as info:
        Strategy(**{"framework": "torch", field.name: bad})
    message = str(info.value)
    assert f"Received: {bad!r}" in message or f"{bad!r}; allowed:" in message, message
    assert "\n" not in message


def test_the_validators_say_what_is_allowed():
    with pytest.raises(UserError, match=r"^unknown colour 'red'; allowed: blue, green$"):
        one_of(("blue", "green"), "colour")("c", "red")
    with pytest.raises(UserError, match=r"^n must be an integer >= 2\. Received: True$"):
        int_at_least(2)("n", True)
    int_at_least(1, optional=True)("threads", None)
    with pytest.raises(UserError, match=r"^flag must be true or false\. Received: 'yes'$"):
        boolean("flag", "yes")
