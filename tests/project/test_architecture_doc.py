"""docs/architecture.md is drawn from the code: every package module it names exists, and every package module is
named in it (so that a module added, moved or removed shows up here until the map is redrawn)."""

from __future__ import annotations

import re

from tests.helpers import ROOT

PACKAGE = ROOT / "bigbatch"
DOC = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"(?<![\w./-])(?:bigbatch/)?((?:[a-z_]+/)*[a-z_0-9]+\.py)\b")
"""A module path as the map writes it: relative to ``bigbatch/`` (``engine/step.py``), or with the prefix."""
OUTSIDE = ("tests/", "benchmarks/", "docs/")


def named_modules() -> set[str]:
    return {m for m in NAMED.findall(DOC.read_text()) if not m.startswith(OUTSIDE)}


def package_modules(with_init: bool = False) -> set[str]:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if with_init or p.name not in ("__init__.py", "__main__.py")}


def test_every_module_the_map_names_exists():
    missing = sorted(named_modules() - package_modules(with_init=True))
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_module_is_on_the_map():
    absent = sorted(package_modules() - named_modules())
    assert not absent, f"docs/architecture.md does not name: {absent}"
