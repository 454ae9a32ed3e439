"""Declared fields: one validator vocabulary, and command-line flags made from dataclasses.

A settings dataclass (the run's Strategy, the planner's options) declares each field once,
with `option(...)`: its default, its validator and its command-line help. From that one
declaration come the checks (`check_fields`, from `__post_init__`), the flags of every command
that sets it (`add_flags`), reading them back (`values_from`) and writing them out
(`to_flags`, which `sextant join` and the Slurm batch script take). A flag's help is never
written twice, and a command cannot forget a field's check.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError

Check = Callable[[str, Any], None]
"""A field validator: (field name, value) -> None, or a UserError that says what was wrong
and what is allowed."""


def one_of(choices: tuple[str, ...], what: str) -> Check:
    """The value is one of `choices` ("unknown <what> 'x'; allowed: a, b")."""

    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise UserError(f"unknown {what} {value!r}; allowed: {', '.join(choices)}")

    return check


def int_at_least(low: int, *, optional: bool = False, at_most: int | None = None) -> Check:
    """The value is an integer (not a bool) >= `low` (and <= `at_most`, when given); with
    `optional`, None passes too."""

    def check(name: str, value: Any) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"{name} must be an integer >= {low}. Received: {value!r}")
        if at_most is not None and value > at_most:
            raise UserError(f"{name} must be an integer from {low} to {at_most}. "
                            f"Received: {value!r}")

    return check


def number_in(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
               optional: bool = False) -> Check:
    """The value is a finite number (not a bool) in [low, high], either end open; with
    `optional`, None passes too. The message shows the interval as it is written."""
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def check(name: str, value: Any) -> None:
        if optional and value is None:
            return
        ok = (not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value) and (value > low if low_open else value >= low)
              and (value < high if high_open else value <= high))
        if not ok:
            raise UserError(f"{name} must be in {shown}. Received: {value!r}")

    return check


def number_at_least(low: float, *, above: bool = False, optional: bool = False) -> Check:
    """The value is a finite number (not a bool) >= low (> low with `above`)."""
    def check(name: str, value: Any) -> None:
        if optional and value is None:
            return
        ok = (not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value) and (value > low if above else value >= low))
        if not ok:
            raise UserError(f"{name} must be a number {'>' if above else '>='} {low:g}. "
                            f"Received: {value!r}")

    return check


def boolean(name: str, value: Any) -> None:
    """The value is True or False (not 1, not "yes")."""
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false. Received: {value!r}")


def flag_of(field_name: str) -> str:
    """The command-line flag of a field: `grad_accum` -> `--grad-accum`."""
    return "--" + field_name.replace("_", "-")


_UNSET: Any = object()


def option(default: Any, check: Check | None = None, *, help: str | None = None,
           group: str = "", flag_default: Any = _UNSET, choices: tuple[Any, ...] | None = None,
           metavar: str | None = None, aliases: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its default (dataclasses.MISSING: required), its validator and
    its flag.

    `help`: the flag's help (None: the field has no flag). `group`: which commands take it
    (add_flags selects by group). `flag_default`: the flag's default where the command line
    resolves it later (None for "the framework's usual mode", "auto" for the device), else
    the field's default. `choices`: argparse's, where the command line lists them.
    `aliases`: other spellings of the flag."""
    meta: dict[str, Any] = {"group": group}
    if check is not None:
        meta["check"] = check
    if help is not None:
        meta["flag"] = {"help": help, "default": default if flag_default is _UNSET
                        else flag_default, "choices": choices, "metavar": metavar,
                        "aliases": aliases}
    if default is dataclasses.MISSING:  # a required field: its flag needs flag_default
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def check_fields(obj: Any) -> None:
    """Run every declared validator of a dataclass instance (call from __post_init__)."""
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        if check is not None:
            check(f.name, getattr(obj, f.name))


def _flagged(cls: type, groups: Iterable[str]) -> list[dataclasses.Field[Any]]:
    wanted = set(groups)
    return [f for f in dataclasses.fields(cls)
            if "flag" in f.metadata and f.metadata["group"] in wanted]


def _parse_type(annotation: Any) -> Callable[[str], Any]:
    text = str(annotation)
    for name, kind in (("int", int), ("float", float), ("Path", Path)):
        if text.startswith(name):
            return kind
    return str


def add_flags(p: argparse.ArgumentParser, cls: type, groups: Iterable[str], *,
              defaults: Mapping[str, Any] | None = None,
              helps: Mapping[str, str] | None = None) -> None:
    """The flags of `cls`'s fields in `groups`, each from its declaration. `defaults` and
    `helps` override a field's flag default and help for one command (a check's default
    is data parallel over two workers; a comparison's precision follows its device)."""
    defaults, helps = defaults or {}, helps or {}
    for f in _flagged(cls, groups):
        flag = f.metadata["flag"]
        default = defaults.get(f.name, flag["default"])
        text = helps.get(f.name, flag["help"]).replace("{default}", str(default))
        names = (flag_of(f.name), *flag.get("aliases", ()))
        if str(f.type) == "bool":
            p.add_argument(*names, dest=f.name, action="store_true", help=text)
            continue
        p.add_argument(*names, dest=f.name, type=_parse_type(f.type), default=default,
                       choices=flag["choices"], metavar=flag["metavar"], help=text)


def flag_defaults(cls: type, groups: Iterable[str]) -> dict[str, Any]:
    """Each flag's default as declared (before a command's own overrides), by field name."""
    return {f.name: f.metadata["flag"]["default"] for f in _flagged(cls, groups)}


def values_from(args: argparse.Namespace, cls: type, groups: Iterable[str]) -> dict[str, Any]:
    """The values of `cls`'s flags in `groups`, as parsed, by field name."""
    return {f.name: getattr(args, f.name) for f in _flagged(cls, groups)}


def to_flags(obj: Any) -> list[str]:
    """The command-line flags that rebuild `obj`, every field spelled out (so the result does
    not depend on the CLI's defaults): `--field-name VALUE`, a true boolean as its bare flag,
    a false one and a None value left out."""
    flags: list[str] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None or value is False:
            continue
        flags += [flag_of(f.name)] if value is True else [flag_of(f.name), str(value)]
    return flags
