"""A resumed run remembers what its hooks learned: after an interruption and ``--resume``, the noise scale's running
averages and the memory log's baseline (the first evaluation's step) are the uninterrupted run's, and so is every
deterministic field of every training and evaluation record. An older checkpoint, without hook states, still
resumes: its hooks start fresh."""

from __future__ import annotations

import fnmatch
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from bigbatch.cli import main
from bigbatch.engine.controllers.base import BatchController
from bigbatch.engine.events import EventStorage
from bigbatch.engine.hooks import Hook, Hooks
from bigbatch.engine.hooks.memory import MemoryLog
from bigbatch.engine.progress import Progress
from bigbatch.errors import UserError
from bigbatch.registry import BATCH_CONTROLLERS, HOOKS
from tests.helpers import run_main

STEPS, INTERRUPT_AT, CHECKPOINT_EVERY = 20, 12, 5  # the run resumes from step 10: steps 11 and 12 are run twice
ARGS = ["digits", "--set", f"steps={STEPS}", "batch=32", "subdivisions=2", "data.size=16", "model.width=8",
        "log.tensorboard=false", "log.every=1", "log.noise_scale=true", "eval.every=5",
        f"checkpoint.every={CHECKPOINT_EVERY}", "memory.interval=60"]

NOT_DETERMINISTIC = ("images_per_s", "t_*")
"""Record fields that are wall-clock readings (throughput, the phase and data-wait times): left out of the
comparison. The training records hold no memory readings (those are in memory.csv and the end-of-run events)."""


class Interrupt(Hook):
    """Ctrl-C once the record of step INTERRUPT_AT is written (after every built-in hook): past the last
    checkpoint, as a real interruption is."""

    stage = "write"

    def after_step(self, run):
        if run.progress.step == INTERRUPT_AT:
            raise KeyboardInterrupt


def train_interrupted(args: list[str], hook: Hook | None = None) -> None:
    """``bigbatch train ARGS`` stopped by Ctrl-C from ``hook`` (default: after step INTERRUPT_AT): exit code 130."""
    HOOKS.register("toy_interrupt", lambda run: hook or Interrupt())
    try:
        assert main(["train", *args]) == 130
    finally:
        HOOKS.unregister("toy_interrupt")


def records(out: Path) -> list[dict]:
    """The training and evaluation records of metrics.jsonl, without their wall-clock fields."""
    kept = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "event" not in record:
            kept.append({k: v for k, v in record.items()
                         if not any(fnmatch.fnmatch(k, pattern) for pattern in NOT_DETERMINISTIC)})
    return kept


def update_rows(out: Path) -> list[tuple[str, str]]:
    """``(step, name)`` of each row of updates.csv, the header first."""
    return [tuple(line.split(",")[:2]) for line in (out / "updates.csv").read_text().splitlines()]


def hook_states(out: Path) -> dict:
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True).get("hooks")


def test_a_resumed_run_keeps_what_its_hooks_learned(tmp_path):
    reference = tmp_path / "reference"
    assert main(["train", *ARGS, "--out", str(reference)]) == 0

    interrupted = tmp_path / "interrupted"
    train_interrupted([*ARGS, "--out", str(interrupted)])
    assert max(r["step"] for r in records(interrupted)) == INTERRUPT_AT
    assert torch.load(interrupted / "checkpoints" / "last.pt", weights_only=True)["step"] == 10
    older = tmp_path / "older"  # the same checkpoint as a bigbatch without hook states wrote it
    shutil.copytree(interrupted, older)
    state = torch.load(older / "checkpoints" / "last.pt", weights_only=True)
    state.pop("hooks", None)
    torch.save(state, older / "checkpoints" / "last.pt")

    assert main(["train", "--resume", str(interrupted)]) == 0
    expected, actual = records(reference), records(interrupted)
    assert [r["step"] for r in actual] == [r["step"] for r in expected]
    assert sum("noise_scale" in r for r in expected) > STEPS - CHECKPOINT_EVERY  # defined after the resume point
    for want, got in zip(expected, actual, strict=True):
        assert got == want, f"step {want['step']}"
    # updates.csv: the rows of the steps run twice are there once, as in the uninterrupted run
    assert update_rows(interrupted) == update_rows(reference)
    saved = hook_states(reference)
    assert saved["noise_scale"]["steps"] == STEPS and saved["memory_log"] == {"first_eval": 5}
    assert hook_states(interrupted) == saved

    # An older checkpoint resumes too, its hooks fresh: the averages count the steps after the resume only, and the
    # memory baseline is the resumed process's first evaluation.
    assert main(["train", "--resume", str(older)]) == 0
    fresh = hook_states(older)
    assert fresh["noise_scale"]["steps"] == STEPS - 10 and fresh["memory_log"] == {"first_eval": 15}


def test_a_saved_hook_state_that_does_not_fit_is_one_error_naming_the_hook():
    hooks = Hooks(None, [MemoryLog()], ["memory_log"])
    hooks.load_state_dict({"another_hook": {"x": 1}})  # no state of its own: it starts fresh
    assert hooks.state_dict() == {"memory_log": {"first_eval": None}}
    hooks.load_state_dict({"memory_log": {"first_eval": 7}})
    assert hooks.state_dict() == {"memory_log": {"first_eval": 7}}
    with pytest.raises(UserError, match=r"^checkpoint: hooks\.memory_log\.baseline: unknown key"):
        hooks.load_state_dict({"memory_log": {"baseline": 7}})
    with pytest.raises(UserError, match=r"^checkpoint: hooks\.memory_log\.first_eval: missing$"):
        hooks.load_state_dict({"memory_log": {}})
    with pytest.raises(UserError, match=r"^checkpoint: hooks\.memory_log: expected a dict"):
        hooks.load_state_dict({"memory_log": [7]})


# --- a hostile checkpoint's hook states --------------------------------------------------------------------------

SHORT = ["digits", "--set", "steps=6", "batch=32", "subdivisions=2", "data.size=16", "model.width=8",
         "log.tensorboard=false", "log.noise_scale=true", "eval.every=2", "checkpoint.every=2", "memory.interval=60"]
ADAPTIVE = ["digits", "--set", "batch={mode: adaptive, base: 16, max: 32}", "subdivisions=2", "steps=8",
            "data.size=16", "model.width=8", "log.tensorboard=false", "eval.every=2", "checkpoint.every=2",
            "memory.interval=60"]


class StopAfter(Hook):
    """Ctrl-C once step ``at`` is done: the run's last.pt is of the step before, with steps left to train."""

    stage = "write"

    def __init__(self, at: int) -> None:
        self.at = at

    def after_step(self, run):
        if run.progress.step == self.at:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def interrupted_runs(tmp_path_factory):
    """A plain run (memory log and noise scale) and an adaptive run (AdaScale), each stopped after step 3: last.pt
    at step 2, every hook's state in it."""
    root = tmp_path_factory.mktemp("hook-states")
    runs = {"plain": root / "plain", "adaptive": root / "adaptive"}
    HOOKS.register("toy_stop", lambda run: StopAfter(3))
    try:
        for name, args in (("plain", SHORT), ("adaptive", ADAPTIVE)):
            assert run_main("train", *args, "--out", str(runs[name])).returncode == 130
    finally:
        HOOKS.unregister("toy_stop")
    for name, hooks in (("plain", {"memory_log", "noise_scale"}), ("adaptive", {"memory_log", "adascale"})):
        state = torch.load(runs[name] / "checkpoints" / "last.pt", weights_only=True)
        assert state["step"] == 2 and hooks <= set(state["hooks"]), (name, state["step"], state["hooks"])
    return runs


HOSTILE_STATES = [  # (run, hook, key path, value): each one error line naming hooks.<hook>.<key>, before any step
    ("plain", "memory_log", ["first_eval"], "x"),  # the issue's: it trained every step, then a TypeError
    ("plain", "memory_log", ["first_eval"], -3),
    ("plain", "memory_log", ["first_eval"], 10**400),
    ("plain", "memory_log", ["first_eval"], 2.5),
    ("plain", "noise_scale", ["decay"], 1.0),
    ("plain", "noise_scale", ["steps"], "many"),
    ("plain", "noise_scale", ["gradient_sq"], math.nan),
    ("plain", "noise_scale", ["trace_sigma"], 10**400),
    ("adaptive", "adascale", ["progress"], -1.0),
    ("adaptive", "adascale", ["gain"], 1e308),
    ("adaptive", "adascale", ["batch"], True),
    ("adaptive", "adascale", ["noise", "ignored"], None),
    ("adaptive", "adascale", ["measured_since_change"], "x"),
]


@pytest.mark.parametrize(("run", "hook", "key", "value"), HOSTILE_STATES,
                         ids=[f"{h}.{'.'.join(k)}={v!r:.12}" for _, h, k, v in HOSTILE_STATES])
def test_a_hostile_hook_state_is_one_line_naming_the_hook_and_key_before_any_step(
        interrupted_runs, tmp_path, run, hook, key, value):
    out = tmp_path / run
    shutil.copytree(interrupted_runs[run], out)
    path = out / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    node = state["hooks"][hook]
    for part in key[:-1]:
        node = node[part]
    assert key[-1] in node
    node[key[-1]] = value
    torch.save(state, path)
    before = path.read_bytes(), (out / "metrics.jsonl").read_bytes()
    done = run_main("train", "--resume", str(out))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint: hooks.{hook}.{'.'.join(key)}: expected "), \
        done.stderr
    assert len(lines[0]) < 200  # a 400-digit value is named by its size, not printed
    assert (path.read_bytes(), (out / "metrics.jsonl").read_bytes()) == before  # no step, nothing written


@pytest.mark.fast
def test_every_hook_with_a_state_declares_its_schema():
    """The kind, not the examples: every hook class of bigbatch's that takes a state back checks it on a schema."""
    import importlib
    import pkgutil

    import bigbatch.engine.hooks as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    classes, stack = [], [Hook]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith("bigbatch."):
                classes.append(sub)
    stateful = [c for c in classes if c.load_state_dict is not Hook.load_state_dict]
    assert {c.__name__ for c in stateful} >= {"MemoryLog", "NoiseScaleHook"}
    assert [c.__name__ for c in stateful if c.state_schema is Hook.state_schema] == []
    # the batch controllers keep theirs in the checkpoint's hooks too (AdaScale's under "adascale")
    controllers = [BATCH_CONTROLLERS.get(name).obj for name in BATCH_CONTROLLERS.names()]
    stateful = [c for c in controllers if c.load_state_dict is not BatchController.load_state_dict]
    assert {c.__name__ for c in stateful} >= {"AdaptiveBatch"}
    assert [c.__name__ for c in stateful if c.state_schema is BatchController.state_schema] == []


HOSTILE_VALUES = ["x", None, True, -1, 0, 7, 2**63, 10**400, -(10**400), 0.5, -0.0, 1.0, 3.0, 1e308, -1e308, math.nan,
                  math.inf, -math.inf, [], {"a": 1}, torch.tensor(1.0)]


class ControllerState:
    """A batch controller's state as a run loads it: through the run's progress, from the checkpoint's ``hooks``."""

    def __init__(self, controller: BatchController, plan) -> None:
        self.controller, self.progress = controller, Progress(plan, controller, EventStorage())

    def state_dict(self):
        return self.controller.state_dict()

    def load(self, states: dict) -> None:
        self.progress.load_state_dict({"step": 0}, states)


def stateful_hooks():
    """``(name, hook)`` of each built-in hook that keeps a state, built as a run would, and the AdaScale controller's
    (at base 16, growing to 64)."""
    from types import SimpleNamespace

    from bigbatch.batching import make_plan
    from bigbatch.config import load_config
    from bigbatch.engine.controllers.adaptive import AdaptiveBatch
    from bigbatch.engine.hooks.noise_scale import NoiseScaleHook
    from bigbatch.floor.distributed import Process

    plain = SimpleNamespace(progress=SimpleNamespace(noise=None), plan=SimpleNamespace(world=1))
    cfg = load_config("digits", ["batch={mode: adaptive, base: 16, max: 64, grow: true}", "subdivisions=2",
                                 "steps=100"])
    plan = make_plan(cfg, 1, 1437)
    adaptive = ControllerState(AdaptiveBatch(cfg, plan, Process()), plan)
    return [("memory_log", MemoryLog()), ("noise_scale", NoiseScaleHook(plain)), ("adascale", adaptive)]


def load(name: str, hook, state: dict) -> None:
    if isinstance(hook, ControllerState):
        hook.load({name: state})
    else:
        Hooks(None, [hook], [name]).load_state_dict({name: state})


def leaves(state: dict, prefix: tuple = ()) -> list[tuple]:
    found = []
    for key, value in state.items():
        found += leaves(value, (*prefix, key)) if isinstance(value, dict) else [(*prefix, key)]
    return found


def works(name: str, hook: Hook) -> None:
    """The hook's state, read back, is one it can go on from (an oracle apart from the schema: the invariants its
    code relies on, written out)."""
    state = hook.state_dict()
    if name == "memory_log":
        first = state["first_eval"]
        assert first is None or (type(first) is int and first >= 0)
        return
    noise = hook.noise if name == "noise_scale" else hook.controller.noise
    assert 0 <= noise.decay < 1 and all(type(n) is int and n >= 0 for n in (noise.steps, noise.ignored))
    assert all(math.isfinite(v) for v in (noise._gradient_sq, noise._trace_sigma))
    noise.b_simple  # noqa: B018 - computed without an error
    if name == "adascale":
        ada = hook.controller.adascale
        assert type(ada.batch) is int and ada.batch >= ada.base and math.isfinite(ada.progress) and ada.progress >= 0
        assert 1 <= ada.gain <= ada.batch / ada.base
        assert 1 <= ada.begin_step(ada.batch) <= ada.batch / ada.base


@pytest.mark.fast
def test_each_value_of_each_hooks_state_is_checked_on_load():
    """Every leaf of every built-in hook's saved state replaced by each of 21 hostile values: loaded into a fresh
    hook that then works, or one ``UserError`` naming the hook and the key; never another error."""
    refused = 0
    for name, hook in stateful_hooks():
        saved = hook.state_dict()
        if name == "memory_log":
            saved = {"first_eval": 5}
        for path in leaves(saved):
            for value in HOSTILE_VALUES:
                state = json.loads(json.dumps(saved))  # a copy
                node = state
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = value
                fresh = dict(stateful_hooks())[name]
                try:
                    load(name, fresh, state)
                except UserError as e:
                    assert str(e).startswith(f"checkpoint: hooks.{name}.{'.'.join(path)}: expected "), str(e)
                    refused += 1
                    continue
                works(name, fresh)
    assert refused > 100


def test_a_resume_drops_log_lines_past_the_checkpoint_and_a_line_a_kill_cut(tmp_path):
    from bigbatch.engine.hooks.jsonl import truncate_metrics
    from bigbatch.telemetry.update_sizes import drop_rows_after

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "lr": 0.1}\n{"step": 2, "lr": 0.2}\n{"step": 3, "lr": 0.3}\n{"step": 4, "l')
    truncate_metrics(metrics, 2)
    assert metrics.read_text() == '{"step": 1, "lr": 0.1}\n{"step": 2, "lr": 0.2}\n'
    updates = tmp_path / "updates.csv"
    updates.write_text("step,name,max_abs,relative\n1,a.weight,0.1,0.01\n1,\"b,c\",0.2,\n3,a.weight,0.1,0.01\n3,a.we")
    assert drop_rows_after(updates, 2) == 2
    assert updates.read_text() == 'step,name,max_abs,relative\n1,a.weight,0.1,0.01\n1,"b,c",0.2,\n'
    mine = tmp_path / "mine.csv"  # not an update-size log: left as it is
    mine.write_text("my,own\n9,rows\n")
    assert drop_rows_after(mine, 2) == 0 and mine.read_text() == "my,own\n9,rows\n"


def test_the_events_of_a_step_run_twice_are_recorded_once(tmp_path):
    """A step's ``skipped`` event is stamped with that step's number (the one its training record has), so a resume
    from the checkpoint before it cuts the event with the rest of the step's records: it used to carry the step's
    0-based index, which the cut kept, and the resumed run wrote it again."""
    args = [*ARGS, "debug.nonfinite_at_step=10", "debug.nonfinite_repeats=2", "precision.loss_scale=dynamic"]

    def skips(out: Path) -> list[dict]:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in r.items() if k != "time"} for r in map(json.loads, lines)
                if r.get("event") == "skipped"]

    reference = tmp_path / "reference"
    assert main(["train", *args, "--out", str(reference)]) == 0
    interrupted = tmp_path / "interrupted"
    train_interrupted([*args, "--out", str(interrupted)])
    assert len(skips(interrupted)) == 2  # the 11th step's two attempts, past the checkpoint of step 10
    assert main(["train", "--resume", str(interrupted)]) == 0
    assert [r["step"] for r in skips(reference)] == [11, 11]
    assert skips(interrupted) == skips(reference)


def test_a_best_pt_the_resumed_checkpoint_does_not_record_is_set_aside(tmp_path):
    """Stopped after step 7, with ``last.pt`` of step 5 and ``best.pt`` of step 6 (evaluations every 2): the resume
    cuts the records back to step 5, so step 6's evaluation is in none, and a resume with another LR does not repeat
    it. ``best.pt`` kept step 6's weights while the run reported another best. It is now kept aside under its step's
    name, and ``best.pt`` is what the run's records show."""

    class StopAfter7(Hook):
        stage = "write"

        def after_step(self, run):
            if run.progress.step == 7:
                raise KeyboardInterrupt

    out = tmp_path / "run"
    args = ["digits", "--set", "steps=10", "batch=64", "subdivisions=2", "data.size=16", "model.width=8",
            "schedule.warmup=[]", "log.tensorboard=false", "eval.every=2", "checkpoint.every=5", "memory.interval=60",
            "--out", str(out)]
    train_interrupted(args, StopAfter7())
    checkpoints = out / "checkpoints"
    before = torch.load(checkpoints / "best.pt", weights_only=True)
    assert before["step"] == 6 and torch.load(checkpoints / "last.pt", weights_only=True)["best"]["step"] == 4

    result = run_main("train", "--resume", str(out), "--set", "optim.lr=30")  # far too high: no later best
    assert result.returncode == 0, result.stderr
    assert (f"note: {checkpoints / 'best.pt'} held step 6, which the checkpoint resumed from (step 5) does not "
            "record (the best it records is step 4's): kept as best-step6-before-resume.pt") in result.stdout
    kept = torch.load(checkpoints / "best-step6-before-resume.pt", weights_only=True)
    assert all(torch.equal(kept["model"][k], v) for k, v in before["model"].items())
    evaluations = {r["step"]: r["top1"] for r in map(json.loads, (out / "metrics.jsonl").open()) if "top1" in r}
    final = torch.load(checkpoints / "last.pt", weights_only=True)["best"]
    assert final["value"] == max(evaluations.values()) and evaluations[final["step"]] == final["value"]
    if (checkpoints / "best.pt").exists():  # only what the records show
        assert torch.load(checkpoints / "best.pt", weights_only=True)["step"] == final["step"] > 5
