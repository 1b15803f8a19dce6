"""The run's progress: the one owner of the batch plan in effect and the counters (as Lightning's
``loops/progress.py``).

    plan            the whole run's plan (``batching.py``), with the batch changes made so far (an adaptive batch
                    that grew; an adaptive run's ``steps`` becomes the steps taken once its last step is known)
    step            optimizer steps done
    images, epoch   the images the steps done took, and the epochs they make
    controller      what decides each step's batch and LR gain (``engine/controllers/``)

The loop moves it and nothing else does: ``begin_step()`` before a step (the controller's :class:`StepBatch` for it,
the step's plan), ``end_step(train_step)`` after it (the step counted, the controller told, a new batch planned).
The hooks read it (``run.progress``); the training step is handed the step's plan. Its state is the checkpoint's
``data`` keys it owns (``step``, ``images``, and an adaptive run's ``grown``) and the controller's learned state.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bigbatch.batching import BatchPlan
from bigbatch.engine.controllers.base import BatchController, StepBatch
from bigbatch.errors import UserError
from bigbatch.state_schema import StateError, check_state

if TYPE_CHECKING:
    import torch.nn as nn

    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.step import TrainStep
    from bigbatch.telemetry.noise_scale import NoiseScale


class Progress:
    def __init__(self, plan: BatchPlan, controller: BatchController, events: EventStorage) -> None:
        self.plan = plan
        self.controller = controller
        self.events = events
        self.step = 0
        """Optimizer steps done: the position in the data order and in the schedule."""

    # --- what the hooks read ------------------------------------------------------------------------------------
    @property
    def images(self) -> int:
        """Images the steps done took (the first image of the next step in the data order)."""
        return self.plan.images_before(self.step)

    @property
    def epoch(self) -> float | None:
        return self.plan.epoch_at(self.step)

    @property
    def total(self) -> int:
        """The run's length in :attr:`unit` (steps; an adaptive run's base steps)."""
        return self.controller.total

    @property
    def done(self) -> int:
        """How far the run is, in :attr:`unit`."""
        return self.controller.done(self)

    @property
    def unit(self) -> str:
        return self.controller.unit

    @property
    def finished(self) -> bool:
        return self.controller.finished(self)

    @property
    def schedule_step(self) -> int:
        """Where the base LR schedule stands: ``lr = gain x lr_base(schedule_step)``."""
        return self.controller.schedule_step(self)

    @property
    def noise(self) -> NoiseScale | None:
        """The controller's gradient noise estimates, where it measures them (AdaScale), else None."""
        return self.controller.noise

    def step_plan(self) -> BatchPlan:
        """The plan of the next step: its batch and subdivisions (``BatchPlan.at``)."""
        return self.plan.at(self.step)

    def record(self) -> dict[str, Any]:
        """What the training record shows of the batch (``batch`` under a schedule; AdaScale's gain, progress)."""
        return self.controller.record(self)

    # --- what the loop does -------------------------------------------------------------------------------------
    def begin_step(self) -> StepBatch:
        """The controller's decision for the next step; its last step is planned as the run's."""
        decision = self.controller.next_step(self)
        if decision.last:
            self.plan = dataclasses.replace(self.plan, steps=self.step + 1)
        return decision

    def end_step(self, train_step: TrainStep) -> None:
        """The step is done: counted, and the controller told what it measured; a batch it grows to is planned from
        the next step on (``batch_grown``)."""
        self.step += 1
        grown = self.controller.end_step(self, train_step)
        if grown is not None:
            self.plan = self.plan.grown(self.step, grown)
            values, message = self.controller.grown_event(self.step, grown)
            self.events.event(self.step, "batch_grown", values, message)

    def attach(self, model: nn.Module) -> None:
        self.controller.attach(model)

    def detach(self) -> None:
        self.controller.detach()

    # --- the checkpoint -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``data`` keys the progress owns: ``step``, ``images`` and, for a batch that grows, the
        changes made (``grown``: ``[[step, batch], ...]``)."""
        state: dict[str, Any] = {"step": self.step, "images": self.images}
        if self.plan.grow_to is not None:
            state["grown"] = [[p.step, p.batch] for p in self.plan.phases]
        return state

    def controller_state(self) -> tuple[str, dict[str, Any]] | None:
        """``(name, state)`` of the controller's learned state in a checkpoint's ``hooks`` (None: it keeps none)."""
        state = self.controller.state_dict()
        return None if state is None or self.controller.state_key is None else (self.controller.state_key, state)

    def load_state_dict(self, data: dict[str, Any], hooks: dict[str, Any]) -> None:
        """A checkpoint's ``data`` and ``hooks``: the step, an adaptive batch's changes (each checked), the images
        those steps took (checked against this config's), and the controller's state (checked on its schema)."""
        step = data["step"]
        if self.plan.grow_to is not None:  # an adaptive batch that grew: the changes made so far
            self.plan = grown_plan(self.plan, data.get("grown", []), step)
        images = data.get("images")  # absent before batch schedules
        if isinstance(images, int) and images != self.plan.images_before(step):
            raise UserError(f"schedule.batch: the checkpoint's {step} steps took {images} images, this config's take "
                            f"{self.plan.images_before(step)}; resuming needs the same batch schedule")
        self.step = step
        key = self.controller.state_key
        if key is not None and key in hooks:
            schema = self.controller.state_schema()
            try:
                state = check_state(schema, hooks[key], f"hooks.{key}") if schema is not None else hooks[key]
            except StateError as e:
                raise UserError(f"checkpoint: {e}") from None
            self.controller.load_state_dict(state)


def grown_plan(plan: BatchPlan, grown: Any, steps: int) -> BatchPlan:
    """``plan`` with the batch changes a checkpoint of an adaptive run lists (``[[step, batch], ...]``), each
    checked: at most one per doubling from the first batch to ``grow_to``, in order of step before the
    checkpoint's ``steps``, each batch larger than the one before, at most ``grow_to``, and a whole number of
    micro-batches on every device."""
    assert plan.grow_to is not None
    unit = plan.world * plan.micro_batch
    if not isinstance(grown, list) or len(grown) > max(1, plan.grow_to // plan.batch).bit_length():
        raise UserError(f"checkpoint: data.grown is not a list of batch changes of this run ({str(grown)[:80]})")
    previous_step, previous_batch = 0, plan.batch
    for item in grown:
        if not (isinstance(item, list) and len(item) == 2 and all(type(v) is int for v in item)):
            raise UserError(f"checkpoint: data.grown holds {str(item)[:40]}, not [step, batch]")
        at, batch = item
        if not (previous_step < at <= steps and previous_batch < batch <= plan.grow_to and batch % unit == 0):
            raise UserError(f"checkpoint: data.grown: a batch of {batch} from step {at} does not follow a batch of "
                            f"{previous_batch} from step {previous_step} in a run of this config")
        plan = plan.grown(at, batch)
        previous_step, previous_batch = at, batch
    return plan

