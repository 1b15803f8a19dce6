"""The training step on its own (``engine/step.py``): retries that change nothing, the out-of-memory re-cut,
the owner of the subdivisions; and the training state that a checkpoint holds (``engine/state.py``)."""

from __future__ import annotations

import copy
import shutil
from types import SimpleNamespace

import pytest
import torch

from bigbatch.batching import make_plan
from bigbatch.cli import main
from bigbatch.config import load_config
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import GlobalBatchOrder
from bigbatch.engine import checkpoint
from bigbatch.engine.controllers.base import build_controller
from bigbatch.engine.events import EventStorage, Record
from bigbatch.engine.parts import build_parts
from bigbatch.engine.progress import Progress
from bigbatch.engine.state import TrainingState
from bigbatch.engine.step import NonFiniteTraining, OutOfMemory
from bigbatch.floor.distributed import Process
from bigbatch.tasks import build_task
from bigbatch.telemetry.memory import MemoryLimitExceeded
from tests.helpers import FIXTURES

FORMAT1_RUN = FIXTURES / "run-format1"
"""A run directory written by bigbatch before the engine had a ``TrainingState`` (commit 479d26f): digits,
4 steps of batch 32, EMA on."""

SETTINGS = ["batch=32", "subdivisions=2", "steps=4", "data.size=8", "model.width=4", "norm.running_stats=per_step",
            "optim.name=momentum", "clip.max_norm=1.0", "ema.decay=0.9", "log.tensorboard=false"]


def make_step(*settings: str, world: int = 1, last_good=lambda: ""):
    """(training state, its step, the first step's micro-batches, records put) for a small digits recipe."""
    cfg = load_config("digits", [*SETTINGS, *settings])
    torch.manual_seed(0)
    task = build_task(cfg)
    plan = make_plan(cfg, world, len(task.train_set))
    records: list[Record] = []
    parts = build_parts(cfg, task, plan, Process(), EventStorage([records.append]), last_good=last_good)
    model, step, ema = parts.model, parts.step, parts.ema
    order = GlobalBatchOrder(len(task.train_set), plan.batch, cfg.seed)
    micro_batches = next(iter(batches_by_step(task.train_set, order, 0, 1, 0, 1, cfg.subdivisions, 0,
                                              task.sample_keys)))
    progress = Progress(plan, build_controller(cfg, plan, Process()), EventStorage([records.append]))
    return TrainingState(cfg, model, step, ema, progress), step, micro_batches, records


def hooks(before_forward=lambda index: None, after_backward=lambda index: None) -> SimpleNamespace:
    """What a step calls around each micro-batch (the run's hooks in training)."""
    return SimpleNamespace(before_forward=before_forward, after_backward=after_backward)


def weights(state: TrainingState) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.model.state_dict().items()}


def test_a_step_with_nonfinite_gradients_changes_nothing_and_is_run_again():
    clean_state, clean, batches, _ = make_step()
    state, step, _, records = make_step()
    attempts = []

    def poison_first_attempt(index: int) -> None:
        attempts.append(index)
        if len(attempts) == 1:
            for p in state.model.parameters():
                p.grad.fill_(float("nan"))

    clean(0, copy.deepcopy(batches))
    result = step(0, copy.deepcopy(batches), hooks(after_backward=poison_first_attempt))
    assert result.applied and step.skipped == 1
    assert attempts == [0, 1, 0, 1], "the step ran twice over both micro-batches"
    assert [r.values["event"] for r in records] == ["skipped"]
    expected = weights(clean_state)  # weights, BN running statistics (per step) and EMA as if never poisoned
    assert all(torch.equal(v, expected[k]) for k, v in weights(state).items())
    assert all(torch.equal(a, b) for a, b in zip(state.ema.module.state_dict().values(),
                                                 clean_state.ema.module.state_dict().values(), strict=True))


def test_too_many_nonfinite_steps_in_a_row_stop_the_run_naming_the_last_good_weights():
    state, step, batches, records = make_step("precision.max_skipped=3",
                                              last_good=lambda: "The last checkpoint is here")

    def poison(index: int) -> None:
        for p in state.model.parameters():
            p.grad.fill_(float("inf"))

    before = weights(state)
    with pytest.raises(NonFiniteTraining, match=r"^3 optimizer steps in a row .* step 1; .*The last checkpoint is"):
        step(0, batches, hooks(after_backward=poison))
    assert len(records) == 3 and all(torch.equal(v, before[k]) for k, v in weights(state).items())


def test_out_of_memory_cuts_each_micro_batch_in_two_and_keeps_the_update():
    # GroupNorm: with BatchNorm a smaller micro-batch normalises by other statistics, and so the update differs.
    clean_state, clean, batches, _ = make_step("model.norm=group")
    state, step, _, records = make_step("model.norm=group")
    calls = []

    def out_of_memory_at_the_second_micro_batch(index: int) -> None:
        calls.append(index)
        if len(calls) == 2:
            raise MemoryLimitExceeded("test")

    clean(0, copy.deepcopy(batches))
    step(0, copy.deepcopy(batches), hooks(before_forward=out_of_memory_at_the_second_micro_batch))
    assert (clean.subdivisions, step.subdivisions) == (2, 4) and calls == [0, 1, 0, 1, 2, 3]
    assert records[0].values == {"step": 1, "event": "out_of_memory", "subdivisions": 4, "micro_batch": 8,
                                 "reason": "test"}
    expected = weights(clean_state)
    for key, value in weights(state).items():  # the same mean gradient, summed in another order
        torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-6)
    assert state.state_dict()["data"]["subdivisions"] == 4, "the checkpoint carries the subdivisions reached"


def test_out_of_memory_stops_when_the_micro_batch_cannot_be_halved_or_with_several_processes():
    out_of_memory = hooks(before_forward=lambda index: (_ for _ in ()).throw(MemoryLimitExceeded("test")))
    _, step, batches, _ = make_step("batch=2")
    with pytest.raises(OutOfMemory, match="micro-batches of 1 image"):
        step(0, batches, out_of_memory)
    _, step, batches, _ = make_step(world=2)
    with pytest.raises(OutOfMemory, match="relaunch with subdivisions=4"):
        step(0, batches, out_of_memory)


def test_the_training_state_round_trips_through_a_checkpoint(tmp_path):
    state, step, batches, _ = make_step()
    step(0, batches)
    state.progress.step, state.best.value, state.best.step = 1, 12.5, 1
    step.load_state_dict({"skipped": 3, "subdivisions": 4}, state.progress.step_plan())
    state.save(tmp_path / "last.pt")
    state.finish_writes()  # the save returns once serialized; its writer thread puts the bytes on disk

    other, other_step, _, _ = make_step()
    other.resume(tmp_path / "last.pt")
    assert (other.progress.step, other.best.value, other.best.step, other_step.skipped,
            other_step.subdivisions) == (1, 12.5, 1, 3, 4)
    saved, loaded = state.state_dict(), other.state_dict()
    for key in ("model", "optimizer", "ema", "scaler", "data", "best", "config"):
        assert str(saved[key]) == str(loaded[key]), key
    assert sorted(saved) == sorted(checkpoint.RESUME_KEYS + ("ema", "hooks", "classes"))  # hooks: what they learned


def test_a_run_written_before_the_training_state_existed_resumes(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FORMAT1_RUN, run)
    assert main(["train", "--resume", str(run), "--set", "steps=6"]) == 0
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 6 and state["format"] == checkpoint.FORMAT and state["ema"]["updates"] == 6
