"""The engine's wiring is explicit: hooks run by declared stage in the order ``build_hooks`` gives, a hook adds to the
step's record by returning values, a ``TrainStep`` is complete when built, registrations are typed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from bigbatch.config import load_config
from bigbatch.engine.hooks import Hook
from bigbatch.engine.hooks.base import BUILT_IN, STAGES
from bigbatch.engine.trainer import train
from bigbatch.registry import DATASETS, HOOKS, MODELS, TASKS
from tests.helpers import ROOT

PACKAGE = ROOT / "bigbatch"
SETTINGS = ["steps=3", "batch=32", "subdivisions=2", "data.size=8", "model.width=4", "eval.every=3",
            "checkpoint.every=3", "log.every=1", "log.tensorboard=false"]


def sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def test_the_built_in_hooks_are_listed_once_in_the_order_of_their_stages(tmp_path):
    registered = [name for name in HOOKS.names() if HOOKS.get(name).obj.__module__.startswith("bigbatch.")]
    assert sorted(registered) == sorted(BUILT_IN) and len(set(BUILT_IN)) == len(BUILT_IN)
    cfg = load_config("digits", [*SETTINGS, "norm.freeze_during_warmup=true", "model.freeze=1", "memory.limit=100GB",
                                 "debug.oom_at_step=99", "log.tensorboard=true", "log.updates=true",
                                 "batch={mode: adaptive, base: 16, max: 32}"])  # and AdaScale's
    seen: list[tuple[str, str]] = []

    class Spy(Hook):
        stage = "write"

        def before_train(self, run):
            seen.extend((name, hook.stage) for name, hook in zip(run.hooks.names, run.hooks.hooks, strict=True))

    train(cfg, tmp_path / "run", hooks=[Spy()])
    names = [name for name, _ in seen]
    assert names == [*BUILT_IN, "Spy"], "every built-in hook is built here, in BUILT_IN's order"
    stages = [STAGES.index(stage) for _, stage in seen]
    assert stages == sorted(stages)


def test_no_hook_is_ordered_by_a_number():
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "register":
                assert "order" not in [k.arg for k in node.keywords], f"{path}:{node.lineno} orders a hook by number"
    with pytest.raises(TypeError, match="order"):
        HOOKS.register("toy_numbered", lambda run: None, order=5)
    assert "toy_numbered" not in HOOKS


def test_a_misspelled_fact_in_a_registration_is_an_error():
    with pytest.raises(TypeError, match=r"dataset 'toy': .*tsk.*the facts a dataset registers: task, count"):
        DATASETS.register("toy", lambda cfg: None, tsk="classification", count=lambda cfg: 1)
    with pytest.raises(TypeError, match="model 'toy'"):
        MODELS.register("toy", lambda cfg: None, task="classification", min_size=8)
    assert "toy" not in DATASETS and "toy" not in MODELS
    assert TASKS.get("detection").info.model_kind == "detector"  # typed: read as attributes too


def test_no_hook_shares_values_through_the_run():
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "record" and isinstance(node.value, ast.Name):
                assert node.value.id != "run", f"{path}:{node.lineno} uses run.record"
    from bigbatch.engine.run import Run

    assert "record" not in Run.__dataclass_fields__


def test_nothing_outside_the_step_sets_an_attribute_of_a_train_step():
    """A ``TrainStep`` is complete when built: no assignment anywhere in the package to an attribute of something
    called a train step, and its public attributes cannot be set."""
    for path, tree in sources():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and "train_step" in ast.unparse(part.value):
                        raise AssertionError(f"{path}:{node.lineno} sets {ast.unparse(part)}")
    from bigbatch.batching import make_plan
    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.parts import build_parts
    from bigbatch.floor.distributed import Process
    from bigbatch.tasks import build_task

    cfg = load_config("digits", SETTINGS)
    task = build_task(cfg)
    step = build_parts(cfg, task, make_plan(cfg, 1, len(task.train_set)), Process(), EventStorage()).step
    for name in ("model", "optimizer", "scaler", "clock", "skipped", "split"):
        with pytest.raises(AttributeError):
            setattr(step, name, None)


class Measures(Hook):
    """A caller's own instrument: adds a value to every training record."""

    stage = "measure"

    def after_step(self, run):
        return {"toy_measure": run.progress.step * 10}


class LateValues(Hook):
    stage = "evaluate"

    def after_step(self, run):
        return {"too_late": 1}


def test_a_callers_hook_adds_to_the_record_by_returning_values(tmp_path):
    cfg = load_config("digits", SETTINGS)
    train(cfg, tmp_path / "run", hooks=[Measures()])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "loss" in r and "split" not in r]
    assert [(r["step"], r["toy_measure"]) for r in train_records] == [(1, 10), (2, 20), (3, 30)]
    assert list(train_records[0])[0] == "step", "the record hooks' keys first"


def test_values_returned_after_the_record_was_put_are_an_error(tmp_path):
    cfg = load_config("digits", SETTINGS)
    with pytest.raises(RuntimeError, match="LateValues .stage evaluate. returned values for the training record"):
        train(cfg, tmp_path / "run", hooks=[LateValues()])


def test_a_hook_without_a_stage_is_refused(tmp_path):
    cfg = load_config("digits", SETTINGS)
    with pytest.raises(ValueError, match="hook 'Hook' declares stage ''"):
        train(cfg, tmp_path / "run", hooks=[Hook()])
