"""docs/extending.md stays true: the files it names exist, and the lists it says are held by
a test agree with the code (no framework is imported)."""

from __future__ import annotations

import dataclasses
import re

from sextant.backends.base import REGISTRY
from sextant.checks.result import CHECKS
from sextant.strategy import FRAMEWORKS, Strategy
from tests.helpers import REPO

EXTENDING = (REPO / "docs" / "extending.md").read_text()
BACKEND_MODULES = ("__init__.py", "model.py", "train.py")
# Strategy fields whose `sextant run` flag is spelt otherwise.
FLAG_OF = {"framework": "--framework"}


def test_every_path_named_exists() -> None:
    paths = set(re.findall(r"`((?:sextant|tests|docs|constraints)/[\w./<>-]+|pyproject\.toml)`",
                           EXTENDING))
    assert len(paths) > 20
    for path in sorted(paths):
        if "<name>" in path:
            for backend in REGISTRY:
                package = REGISTRY[backend].split(":")[0].split(".")[-1]
                concrete = path.replace("<name>_backend", package)
                assert (REPO / concrete).exists(), concrete
        else:
            assert (REPO / path).exists(), path


def test_backend_packages_share_module_names() -> None:
    for target in REGISTRY.values():
        package = REPO / target.split(":")[0].replace(".", "/")
        missing = [m for m in BACKEND_MODULES if not (package / m).is_file()]
        assert missing == [], f"{package.name} lacks {missing}"


def test_registry_and_strategy_vocabulary_agree() -> None:
    assert tuple(REGISTRY) == FRAMEWORKS


def test_levers_table_has_a_column_per_backend() -> None:
    levers = (REPO / "docs" / "levers.md").read_text()
    header = next(line for line in levers.splitlines() if line.startswith("| lever |"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    assert len(columns) == len(REGISTRY), columns


def test_every_strategy_field_has_a_run_flag() -> None:
    from sextant.cli import build_parser

    parser = build_parser()
    run = next(a for a in parser._subparsers._group_actions  # noqa: SLF001 - argparse API
               if hasattr(a, "choices") and a.choices and "run" in a.choices).choices["run"]
    flags = {s for action in run._actions for s in action.option_strings}  # noqa: SLF001
    for field in dataclasses.fields(Strategy):
        flag = FLAG_OF.get(field.name, "--" + field.name.replace("_", "-"))
        assert flag in flags, f"Strategy.{field.name} has no `sextant run` flag {flag}"


def test_every_check_is_described() -> None:
    checks_doc = (REPO / "docs" / "checks.md").read_text()
    for name in CHECKS:
        assert re.search(rf"\b{name}\b", checks_doc), name
