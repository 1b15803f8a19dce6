"""Who owns the batch (docs/architecture.md, "Who owns the batch"), read from the source with ``ast``: the batch
layout is checked in one place, ``subdivisions: auto`` is seen only before the boundary, the run's progress is moved
by the loop alone (no hook writes it), and the weight EMA's per-step power has one writer."""

from __future__ import annotations

import ast

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.fast

PACKAGE = ROOT / "bigbatch"
SOURCES = {path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def called(tree: ast.AST, name: str, on: str = "") -> bool:
    """Whether the module calls ``name`` (a function, or a method of a receiver whose source holds ``on``)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if getattr(node.func, "id", None) == name and not on:
            return True
        if isinstance(node.func, ast.Attribute) and node.func.attr == name and on in ast.unparse(node.func.value):
            return True
    return False


def assigned_attributes(tree: ast.AST) -> list[str]:
    """Every ``x.y = ...`` (or ``+=``) of the module, as the source of its target."""
    targets = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets += node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets.append(node.target)
    found = []
    for target in targets:
        for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
            if isinstance(element, ast.Attribute):
                found.append(ast.unparse(element))
    return found


def test_the_batch_layout_is_checked_in_one_place():
    assert [module for module, tree in SOURCES.items() if called(tree, "check_batch")] == ["batching.py"]


BEFORE_THE_BOUNDARY = {"config/run.py", "engine/planner.py", "telemetry/capacity.py", "data/pipeline/bench.py",
                       "engine/relaunch.py", "advisor/command.py"}
"""Where ``subdivisions`` may still be ``auto``: the config, its measurement, the capacity check before any work,
``data bench``, which trains nothing, a resume's layout, which takes the checkpoint's micro-batch for ``auto``, and
``plan --devices``, which takes the memory plan's largest micro-batch for ``auto`` before its measurement."""


def test_auto_subdivisions_are_seen_only_before_the_boundary():
    seeing = set()
    for module, tree in SOURCES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and "subdivisions" in ast.unparse(node) and "'auto'" in ast.unparse(node):
                seeing.add(module)
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                    and ast.unparse(node.args[0]) == "cfg.subdivisions"):
                seeing.add(module)
    assert seeing - BEFORE_THE_BOUNDARY == {"batching.py"}  # subdivisions_of: the guard that it was resolved


def test_no_hook_moves_the_progress_or_the_plan():
    for module, tree in SOURCES.items():
        if not module.startswith("engine/hooks/"):
            continue
        assert not [t for t in assigned_attributes(tree) if ".progress" in t or t.endswith(".plan")], module
        assert not any(called(tree, name, on="progress") for name in ("begin_step", "end_step")), module
        assert not any(called(tree, name, on="plan") for name in ("grown", "set_plan")), module


def test_the_progress_is_moved_by_the_loop_alone():
    movers = {module for module, tree in SOURCES.items()
              if called(tree, "begin_step", on="progress") or called(tree, "end_step", on="progress")}
    assert movers == {"engine/trainer.py"}, movers
    writers = {module for module, tree in SOURCES.items()
               if any(t.endswith(("progress.step", "progress.plan", "self.plan")) for t in assigned_attributes(tree))
               and module.startswith("engine/") and module != "engine/step.py"}  # the step's plan in effect
    assert writers == {"engine/progress.py"}, writers


def test_the_ema_power_has_one_writer():
    writers = {module for module, tree in SOURCES.items()
               if any(t.endswith("per_step_power") for t in assigned_attributes(tree))}
    assert writers == {"engine/step.py", "largebatch/ema.py"}  # the EMA's own default, then each step's
