"""A batch schedule (``schedule.batch``; Smith, Kindermans, Ying and Le, "Don't Decay the Learning Rate, Increase
the Batch Size", ICLR 2018): the batch of each phase of the plan (``batching.batch_phases``), served by more
micro-batches of the first phase's size. The LR stays the schedule's at the step; what is defined per step follows
the batch: the weight EMA's decay is ``d ** (batch / first batch)``, as BatchNorm's per-step momentum
(``engine/step.py``). The training record shows the batch of each step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bigbatch.engine.controllers.base import BatchController, StepBatch
from bigbatch.registry import BATCH_CONTROLLERS

if TYPE_CHECKING:
    from bigbatch.batching import BatchPlan
    from bigbatch.config import RunConfig
    from bigbatch.engine.progress import Progress
    from bigbatch.floor.distributed import Process


class ScheduledBatch(BatchController):
    def __init__(self, cfg: RunConfig, plan: BatchPlan, proc: Process) -> None:
        super().__init__(cfg, plan, proc)
        self.first = plan.batch

    def next_step(self, progress: Progress) -> StepBatch:
        batch = progress.plan.batch_at(progress.step)
        return StepBatch(batch, ema_power=batch / self.first)

    def record(self, progress: Progress) -> dict[str, Any]:
        return {"batch": progress.plan.batch_at(progress.step - 1)}  # the batch of the step just done


BATCH_CONTROLLERS.register("scheduled", ScheduledBatch, chooses=lambda cfg: bool(cfg.schedule.batch))
