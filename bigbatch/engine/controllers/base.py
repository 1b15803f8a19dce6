"""Batch controllers: what decides each step's global batch and LR gain.

A run's batch is fixed (``batch: 256``), scheduled (``schedule.batch``: Smith et al. 2018, the batch grows at
milestones) or adaptive (``batch: {mode: adaptive}``: AdaScale's gain, and a batch that doubles while the measured
noise scale allows). Each is a :class:`BatchController` registered in ``bigbatch.registry.BATCH_CONTROLLERS`` with
the rule that picks it (``chooses(cfg)``); the run's :class:`~bigbatch.engine.progress.Progress` asks its controller
before each step and tells it what the step measured after it, and keeps the counters itself. A controller keeps
no counter of its own and writes nothing of the run's: it answers.

    next_step(progress)          the step's batch, LR gain and EMA power (:class:`StepBatch`)
    schedule_step(progress)      where the base LR schedule stands (lr = gain x lr_base(schedule_step))
    end_step(progress, step)     the step is done (``step``: the ``TrainStep``): a new batch from the next step, or None
    grown_event(step, batch)     what the ``batch_grown`` event says of it
    finished(progress)           no step is left
    total, done(progress), unit  the run's length and how far it is, in ``unit`` (the bar, the records, the warmup)
    record(progress)             what the training record shows of it (``batch``, AdaScale's ``gain``, ...)

A controller that measures the gradients (AdaScale) is called around each micro-batch (``before_forward``,
``after_backward``) between ``attach(model)`` and ``detach()``, and shares its noise estimates (``noise``) with the
noise-scale hook. Its learned state (``state_dict``/``state_schema``/``load_state_dict``) is kept in the checkpoint's
``hooks`` under ``state_key``, where the AdaScale hook kept it before controllers existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bigbatch.batching import BatchPlan
from bigbatch.registry import BATCH_CONTROLLERS

if TYPE_CHECKING:
    import torch.nn as nn

    from bigbatch.config import RunConfig
    from bigbatch.engine.progress import Progress
    from bigbatch.engine.step import TrainStep
    from bigbatch.floor.distributed import Process
    from bigbatch.state_schema import Schema
    from bigbatch.telemetry.noise_scale import NoiseScale


@dataclass(frozen=True)
class StepBatch:
    """What a controller decides for one step."""

    batch: int
    """The step's global batch (a whole number of micro-batches of the plan's size on every device)."""
    gain: float = 1.0
    """The LR gain: the step's LR is ``gain x lr_base(schedule_step)``."""
    ema_power: float = 1.0
    """The weight EMA's decay this step is ``d ** ema_power`` (``d`` per step of the first batch, or per base step)."""
    last: bool = False
    """The step ends the run (an adaptive run, whose length is measured: its last evaluation and checkpoint follow)."""


class BatchController:
    """Fixed behaviour of the base class: the plan's batch, gain 1, the run's steps as its length."""

    unit = "step"
    """What :attr:`total` and :meth:`done` count."""
    state_key: str | None = None
    """The name of the controller's state in a checkpoint's ``hooks`` (None: it keeps none)."""
    noise: NoiseScale | None = None
    """The gradient noise estimates the controller measures (the noise-scale hook reports them), or None."""
    measures = False
    """Whether it is called around each micro-batch (``before_forward``, ``after_backward``)."""

    def __init__(self, cfg: RunConfig, plan: BatchPlan, proc: Process) -> None:
        self.total = plan.steps
        """The run's length, in :attr:`unit`."""

    def next_step(self, progress: Progress) -> StepBatch:
        return StepBatch(progress.plan.batch_at(progress.step))

    def schedule_step(self, progress: Progress) -> int:
        return progress.step

    def end_step(self, progress: Progress, step: TrainStep) -> int | None:
        return None

    def finished(self, progress: Progress) -> bool:
        return progress.step >= progress.plan.steps

    def done(self, progress: Progress) -> int:
        return progress.step

    def record(self, progress: Progress) -> dict[str, Any]:
        return {}

    def grown_event(self, step: int, batch: int) -> tuple[dict[str, Any], str]:
        """The values and message of the ``batch_grown`` event, where :meth:`end_step` grew the batch."""
        return {"batch": batch}, f"step {step}: the batch grows to {batch}"

    def summary(self, progress: Progress) -> list[tuple[str, dict[str, Any], str]]:
        """The events the run's end reports of the controller: ``(name, values, message)``."""
        return []

    def attach(self, model: nn.Module) -> None:
        pass

    def detach(self) -> None:
        pass

    def before_forward(self, index: int, step: TrainStep) -> None:
        pass

    def after_backward(self, index: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def state_schema(self) -> Schema | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def build_controller(cfg: RunConfig, plan: BatchPlan, proc: Process) -> BatchController:
    """The controller of ``cfg``: the first registered one whose ``chooses(cfg)`` holds, a part of the caller's own
    before the built-in ones (adaptive, scheduled, then fixed, which chooses every config)."""
    entries = [BATCH_CONTROLLERS.get(name) for name in BATCH_CONTROLLERS.names()]  # the built-in ones first
    built_in = [e for e in entries if getattr(e.obj, "__module__", None) in BATCH_CONTROLLERS.locations]
    for entry in [*(e for e in entries if e not in built_in), *built_in]:
        if entry.info.chooses(cfg):
            return entry.obj(cfg, plan, proc)
    raise LookupError("no batch controller chooses this config (the fixed one chooses every config)")
