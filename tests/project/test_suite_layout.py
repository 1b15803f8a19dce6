"""The suite's own layout and the project's words, read from the files: test modules share code through
``tests/helpers.py`` alone, ``conftest.py`` holds fixtures, every package module imports, and neither the code nor
the docs cite documents a reader does not have (a "seed" document, an "issue N")."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import pkgutil
import re
from pathlib import Path

import pytest

import bigbatch
from tests.helpers import ROOT

pytestmark = pytest.mark.fast

TESTS = ROOT / "tests"
PACKAGE = ROOT / "bigbatch"


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports (inside functions too), with ``from a import b`` counted as ``a.b`` as well, so
    that ``from tests.engine import test_x`` is seen; relative imports are resolved against the package that holds
    ``path`` (``from .. import helpers`` in ``tests/engine/`` is ``tests.helpers``)."""
    package = path.relative_to(root).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = [*package[:len(package) - node.level + 1], node.module] if node.level else [node.module]
            base = ".".join(p for p in parts if p)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_imported_modules_resolves_relative_imports_against_the_modules_own_package(tmp_path):
    room = tmp_path / "tests" / "engine"
    room.mkdir(parents=True)
    (room / "test_x.py").write_text("from . import test_y\nfrom ..helpers import ROOT\nfrom .. import conftest\n")
    assert imported_modules(room / "test_x.py", root=tmp_path) == {
        "tests.engine", "tests.engine.test_y", "tests.helpers", "tests.helpers.ROOT", "tests", "tests.conftest"}


def test_no_test_module_imports_another():
    """A test module imports shared code from ``tests.helpers`` only: never another test module, nor conftest (in
    every folder of ``tests/``)."""
    wrong = {}
    for path in sorted(TESTS.rglob("*.py")):
        others = {m for m in imported_modules(path) if m.startswith("tests.") and m != "tests.helpers"
                  and not m.startswith("tests.helpers.")}
        if others:
            wrong[str(path.relative_to(ROOT))] = sorted(others)
    assert not wrong, f"import these from tests/helpers.py instead: {wrong}"


def test_conftest_holds_fixtures_only():
    """Its top-level functions are all fixtures, and it defines no constants or classes to import (tests/conftest.py,
    and a conftest.py of a folder if one is ever added)."""
    conftests = sorted(TESTS.rglob("conftest.py"))
    assert TESTS / "conftest.py" in conftests
    not_fixtures = []
    for path in conftests:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            where = f"{path.relative_to(ROOT)}: "
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                if not any(d.startswith(("pytest.fixture", "fixture")) for d in decorators):
                    not_fixtures.append(where + node.name)
            elif isinstance(node, ast.ClassDef | ast.Assign | ast.AnnAssign):
                not_fixtures.append(where + ast.unparse(node).splitlines()[0])
    assert not not_fixtures, f"move to tests/helpers.py: {not_fixtures}"


WHOLE = {"cli": "runs of the whole command, end to end", "project": "the project's own rules: layout, docs, wheel"}
"""The folders of tests/ that test no one package of bigbatch/; every other folder of test modules is named after the
package it tests (tests/engine/ for bigbatch/engine/)."""


def test_the_suite_mirrors_the_package():
    """Each test module is in a folder of tests/ named after a package of bigbatch/ (or one of ``WHOLE``), never at
    the top nor deeper; each such folder is a package (an ``__init__.py``, so that two folders may hold modules of the
    same name); tests/fixtures/ holds files to read, no Python."""
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    modules = sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))
    assert modules, "no test module found"
    misplaced = [str(m) for m in modules if len(m.parts) != 2 or m.parts[0] not in packages | WHOLE.keys()]
    assert not misplaced, f"move into tests/<package of bigbatch/>/ (or one of {sorted(WHOLE)}): {misplaced}"
    rooms = {TESTS} | {TESTS / m.parts[0] for m in modules}
    not_packages = sorted(str(r.relative_to(ROOT)) for r in rooms if not (r / "__init__.py").is_file())
    assert not not_packages, f"add an __init__.py to {not_packages}"
    assert not list((TESTS / "fixtures").rglob("*.py")), "tests/fixtures/ holds data files, not code"


def test_every_package_module_imports():
    """Each module under bigbatch/, found by pkgutil (which must find every .py file and built extension there),
    imports; a ``__main__`` module, which runs the program when imported, is compiled instead."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in PACKAGE.rglob("*.py")}
    files |= {".".join((*p.parent.relative_to(ROOT).parts, p.name.split(".")[0]))  # built C extensions (csrc/)
              for p in PACKAGE.rglob("*") if p.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))}
    walked = {"bigbatch"} | {m.name for m in pkgutil.walk_packages(bigbatch.__path__, "bigbatch.")}
    assert walked == files, f"only on disk: {sorted(files - walked)}; only walked: {sorted(walked - files)}"
    failed = {}
    for name in sorted(walked):
        try:
            if name.endswith(".__main__"):
                path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
                compile(path.read_text(encoding="utf-8"), str(path), "exec")
            else:
                importlib.import_module(name)
        except Exception as e:  # every failure is reported, with its module
            failed[name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


# --- references a reader can open ----------------------------------------------------------------------------------

SEED_DOCUMENT = re.compile(
    r"\b(?:Darknet/Jetson|Jetson|Inception|MegDet|Darknet|TPU|subdivisions)\W{0,2}seed\b"  # "the Inception seed"
    r"|\bseed\W{0,2}(?:darknet|inception|megdet)-"  # "the seed darknet-batch-subdivisions"
    r"|\b(?:darknet-batch-subdivisions|darknet-yolov3-jetson-memory|inception-v3-tpu-advanced-guide"
    r"|megdet-large-minibatch-detector)\b"  # a seed document's name
    r"|\b(?:the|a) seed(?:'s| (?:is|wants|asks|says|states|runs|uses|describes|documents?|recipe|text))\b"
    r"|\bseeds'|\bseeds?/|\bseed (?:documents?|texts?|files?)\b|\bas the seed\b",  # "the seed's nvprof question"
    re.IGNORECASE)
"""How a source document was cited as "a seed": by its name (``the Inception seed``, ``the Jetson seed's rule``), by
the file's name, or as ``the seed's ...``/``the seed wants``. The random seed is written otherwise: ``the run's seed``,
``seed=``, ``the same seed gives``, ``the seed and the step`` (test_the_seed_pattern_leaves_the_random_seed)."""

SEED_CITATIONS_LEFT: list[str] = []
"""Files and folders whose comments still cite a seed document: they were being moved or rewritten when the
citations elsewhere were replaced by docs/references.md's sources. Whoever changes one replaces its citations and
takes it off this list (a listed path without a citation fails the test too); the list ends empty."""


def seed_citations(path: Path) -> list[str]:
    """Each line of ``path`` that cites a seed document, alone or with the start of the next line (a citation
    broken across two lines of a comment)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for n, line in enumerate(lines):
        after = lines[n + 1].lstrip(" #*-") if n + 1 < len(lines) else ""
        if SEED_DOCUMENT.search(line) or (SEED_DOCUMENT.search(f"{line} {after}") and not SEED_DOCUMENT.search(after)):
            found.append(f"{path.relative_to(ROOT)}:{n + 1}: {line.strip()}")
    return found


def is_left(path: Path) -> bool:
    relative = path.relative_to(ROOT).as_posix()
    return any(relative == left or (left.endswith("/") and relative.startswith(left)) for left in SEED_CITATIONS_LEFT)


def test_the_package_cites_sources_not_seed_documents():
    """Comments and docstrings name the paper, repository or file (docs/references.md), not a "seed"."""
    files = sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".yaml", ".cfg") and p.is_file())
    found = [hit for path in files if not is_left(path) for hit in seed_citations(path)]
    assert not found, "cite the source (docs/references.md) instead:\n" + "\n".join(found)
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    in_docs = [hit for path in documents for hit in seed_citations(path)]
    assert not in_docs, "cite the source (docs/references.md) instead:\n" + "\n".join(in_docs)
    stale = [left for left in SEED_CITATIONS_LEFT
             if not any(seed_citations(path) for path in files if is_left(path) and
                        path.relative_to(ROOT).as_posix().startswith(left))]
    assert not stale, f"no seed citation left in {stale}: take them off SEED_CITATIONS_LEFT"


@pytest.mark.parametrize("text", [
    "the run's seed, from which each sample's augmentation seed is drawn",
    "The data order depends on the seed and the global batch",
    "the same seed gives the same bytes", "seed=0", "split seed 0", "the seed must be >= 0",
    "a DataLoader iterator draws a seed from it", "--seed: the generator's seed",
])
def test_the_seed_pattern_leaves_the_random_seed(text):
    assert not SEED_DOCUMENT.search(text)


@pytest.mark.parametrize("text", [
    "the Inception seed", "as the Darknet/Jetson seed's rule", "the seed darknet-batch-subdivisions",
    "the seed's nvprof question", "where the seed is ambiguous", "(``darknet-yolov3-jetson-memory``)",
    "eps 1.0 unless given, as the Inception seed", "the Jetson seed's per-layer maximum",
    "or a seed's preset", "the seeds' presets", "as the seed states it for batch 256",
])
def test_the_seed_pattern_finds_a_seed_citation(text):
    assert SEED_DOCUMENT.search(text)


ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w-])#\d+\b", re.IGNORECASE)
"""A reference to the project's own issue tracker (``issue 24``, ``issues 11 and 12``, ``#24``); an upstream one
names its project (``pytorch#135712``)."""


def test_the_docs_describe_the_product_without_issue_numbers():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in documents
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if ISSUE.search(line)]
    assert not found, "describe what the product does, without the issue that asked for it:\n" + "\n".join(found)


@pytest.mark.parametrize(("text", "names_an_issue"), [
    ("## Memory on a GPU (issue 4)", True), ("Issue 23's review", True), ("see #24", True),
    ("Gloo's error (pytorch#135712)", False), ("[the table](#results)", False), ("a known issue: 4 GB", False),
])
def test_the_issue_pattern(text, names_an_issue):
    assert bool(ISSUE.search(text)) == names_an_issue


# --- the front page's links ---------------------------------------------------------------------------------------


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_to_files_and_headings_that_exist():
    """Each relative link of README.md names a file of the project and, after ``#``, one of that file's headings
    (the results table links each number to its section of docs/benchmarks.md)."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert ("docs/benchmarks.md", "the-digits-demo-make-demo") in links
    broken = []
    for target, anchor in links:
        if "://" in target:
            continue
        path = ROOT / target
        if not path.exists():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.*)$", path.read_text(encoding="utf-8"), re.M)
            if anchor not in {heading_anchor(h) for h in headings}:
                broken.append(f"{target}#{anchor}")
    assert not broken, broken
