"""Hooks (``engine/hooks/``): a new hook is one class and one registration, and sees every moment of a run in
order; a new output is a hook with ``write``; ``after_backward`` reads each micro-batch's own gradient."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from bigbatch.cli import main
from bigbatch.engine.hooks import Hook
from bigbatch.registry import HOOKS
from tests.helpers import DARKNET_DATA

SETTINGS = ["steps=4", "batch=32", "subdivisions=2", "data.size=8", "model.width=4", "model.norm=group",
            "eval.every=2", "checkpoint.every=2", "log.every=1", "log.tensorboard=false"]


class Moments(Hook):
    """A toy instrument: writes down every moment, and each micro-batch's local gradient as the change of the
    accumulated ``.grad`` after its backward."""

    stage = "write"

    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.records: list[dict] = []
        self.micro_grads: dict[tuple[int, int], torch.Tensor] = {}

    def before_train(self, run):
        self.seen.append(("before_train", run.progress.step))

    def before_step(self, run):
        self.seen.append(("before_step", run.step))
        self.previous = None

    def before_forward(self, run, index):
        self.seen.append(("before_forward", run.step, index))

    def after_backward(self, run, index):
        self.seen.append(("after_backward", run.step, index))
        grad = next(p for p in run.state.model.parameters()).grad.clone()
        self.micro_grads[(run.step, index)] = grad - (self.previous if self.previous is not None else 0)
        self.previous = grad

    def after_step(self, run):
        self.seen.append(("after_step", run.progress.step))

    def after_eval(self, run, split, metrics):
        self.seen.append(("after_eval", run.progress.step, split, sorted(metrics)[:2]))

    def after_train(self, run):
        self.seen.append(("after_train", run.progress.step))

    def write(self, record):
        self.records.append(record.values)


@pytest.fixture
def moments():
    hook = Moments()
    HOOKS.register("toy_moments", lambda run: hook)
    yield hook
    HOOKS.unregister("toy_moments")


def test_a_registered_hook_sees_every_moment_in_order(tmp_path, moments):
    assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", *SETTINGS]) == 0
    expected = [("before_train", 0)]
    for step in range(4):
        expected += [("before_step", step)]
        expected += [(moment, step, i) for i in range(2) for moment in ("before_forward", "after_backward")]
        if (step + 1) % 2 == 0:  # the evaluation hook (stage evaluate) evaluates in its after_step, before this one's
            expected += [("after_eval", step + 1, "val", ["images", "loss"])]
        expected += [("after_step", step + 1)]
    expected += [("after_train", 4)]
    assert moments.seen == expected


def test_a_writer_hook_gets_every_record_of_metrics_jsonl(tmp_path, moments):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS]) == 0
    written = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # the start (world size), train, evals, memory, input, noise, phases
    assert moments.records == written and len(written) == 1 + 4 + 2 + 2 + 2


def test_after_backward_reads_each_micro_batch_local_gradient(tmp_path, moments):
    """The change of ``.grad`` after micro-batch i's backward is grad(loss_i) * scale / S, computed here again from
    the same weights and images (the step's first micro-batches of the data order)."""
    from bigbatch.config import load_config
    from bigbatch.data.pipeline.loader import batches_by_step
    from bigbatch.data.pipeline.order import GlobalBatchOrder
    from bigbatch.engine.trainer import seed_everything
    from bigbatch.tasks import build_task

    assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", *SETTINGS, "steps=1"]) == 0
    cfg = load_config("digits", [*SETTINGS, "steps=1"])
    seed_everything(cfg.seed)
    task = build_task(cfg)
    model = task.build_model(cfg)  # the run's initial weights: the same seed, the same construction
    order = GlobalBatchOrder(len(task.train_set), cfg.batch, cfg.seed)
    micro_batches = next(iter(batches_by_step(task.train_set, order, 0, 1, 0, 1, 2)))
    for i, (images, labels) in enumerate(micro_batches):
        model.zero_grad()
        (F.cross_entropy(model(images), labels) / 2).backward()
        torch.testing.assert_close(moments.micro_grads[(0, i)], next(model.parameters()).grad, rtol=1e-5, atol=1e-7)


class LateRecord(Hook):
    """Ordered after the writers, puts a record at the end: the writers are still open (they close after)."""

    stage = "write"

    def after_train(self, run):
        run.events.event(run.progress.step, "late", {"value": 1.0})


class FailsToClose(Hook):
    stage = "write"

    def after_train(self, run):
        raise RuntimeError("this hook failed to close")


def test_a_record_put_at_the_end_by_a_late_hook_is_written(tmp_path):
    HOOKS.register("toy_late", lambda run: LateRecord())
    try:
        assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", *SETTINGS]) == 0
    finally:
        HOOKS.unregister("toy_late")
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last == {"step": 4, "event": "late", "value": 1.0}


def test_a_hook_failing_at_the_end_of_a_failed_run_does_not_hide_its_error(tmp_path, capsys):
    HOOKS.register("toy_fails", lambda run: FailsToClose())
    try:
        rc = main(["train", "digits", "--out", str(tmp_path / "run"), "--set", *SETTINGS, "debug.nonfinite_at_step=1",
                   "debug.nonfinite_repeats=5", "precision.max_skipped=2"])
    finally:
        HOOKS.unregister("toy_fails")
    err = capsys.readouterr().err
    assert rc == 1 and "error: 2 optimizer steps in a row had non-finite gradients" in err, err
    assert "warning: FailsToClose.after_train failed: this hook failed to close" in err


def test_the_run_ends_with_the_share_of_step_time_spent_waiting_for_data(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["t_data"] >= 0 for r in records if "loss" in r and "split" not in r)
    event = next(r for r in records if r.get("event") == "input_pipeline")
    assert 0 <= event["share"] <= 1 and event["waited_s"] <= event["step_s"]
    assert f"input pipeline: waited {event['share']:.1%} of step time" in capsys.readouterr().out


def test_an_input_bound_run_is_told_what_to_change():
    from types import SimpleNamespace

    from bigbatch.config import load_config
    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.hooks.input_pipeline import InputPipeline

    records = []
    run = SimpleNamespace(cfg=load_config("digits", ["data.workers=0"]), progress=SimpleNamespace(step=10),
                          events=EventStorage([records.append]))
    hook = InputPipeline()
    hook.before_train(run)
    hook.waited, hook.total, hook.steps = 3.0, 10.0, 10  # 30 % of the step time spent waiting
    hook.after_train(run)
    assert records[0].values == {"step": 10, "event": "input_pipeline", "waited_s": 3.0, "step_s": 10.0,
                                 "share": 0.3}
    assert records[0].message.startswith("input pipeline: waited 30.0% of step time (3.0 s of 10.0 s); the run is "
                                         "input-bound: try more DataLoader workers (data.workers=0, as the config "
                                         "sets it;")
    # a Darknet .cfg sets no data.workers: the 0 is bigbatch's default, said so, with the key to set
    run.cfg = load_config(str(DARKNET_DATA / "yolov3-tiny.cfg"))
    records.clear()
    hook.after_train(run)
    assert "(data.workers=0, bigbatch's default, which the config leaves unset; this machine has" in \
        records[0].message and "--set data.workers=" in records[0].message


class LearnsAfterEvaluation(Hook):
    """A hook of the ``evaluate`` stage, after the evaluation's: it changes the weights in its ``after_step``."""

    stage = "evaluate"

    def after_step(self, run):
        with torch.no_grad():
            next(run.state.model.parameters()).add_(1.0)


@pytest.mark.parametrize("between", [False, True])
def test_last_pt_links_best_pt_only_when_nothing_runs_between_them(tmp_path, between):
    """best.pt and last.pt at the same step are one file when the checkpointing hook runs right after the
    evaluation; a hook between them may change the state, so last.pt is then written from the state it leaves."""
    out = tmp_path / "run"
    if between:
        HOOKS.register("toy_learns_after_evaluation", lambda run: LearnsAfterEvaluation())
    try:
        # one evaluation, at the last step, where last.pt is due too: best.pt is written there
        assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS, "eval.every=100"]) == 0
    finally:
        if between:
            HOOKS.unregister("toy_learns_after_evaluation")
    best, last = (torch.load(out / "checkpoints" / name, weights_only=True) for name in ("best.pt", "last.pt"))
    linked = (out / "checkpoints" / "best.pt").samefile(out / "checkpoints" / "last.pt")
    assert best["step"] == last["step"] == 4
    assert linked is not between
    first = next(iter(last["model"]))
    assert torch.equal(best["model"][first] + (1.0 if between else 0.0), last["model"][first])


@pytest.mark.fast
def test_every_hook_of_bigbatch_says_what_it_does():
    """Each hook class of the package has a class docstring (its first statement): a newcomer reads what it does
    before its moments."""
    import ast

    from tests.helpers import ROOT

    package = ROOT / "bigbatch"
    silent = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Hook") for b in node.bases)
                    and ast.get_docstring(node) is None):
                silent.append(f"{path.relative_to(package)}: {node.name}")
    assert silent == []
