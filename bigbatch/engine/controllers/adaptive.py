"""The adaptive batch (``batch: {mode: adaptive, ...}``): AdaScale's gain and progress, and a batch that grows
(``largebatch/adascale.py`` has the formulas).

Before each step: the gain r from the estimates so far; the step's LR is ``r x lr_base(floor(tau))``, the EMA's decay
``d ** r``; where the step finishes the base schedule, it is the run's last. Each micro-batch's gradient norms are
taken as autograd hands them over (hooks on the parameters, ``telemetry/noise_scale.py``); after the step every
process's sums are all-reduced in one fixed collective, so that every process updates the same estimates, takes the
same steps and grows the batch at the same step. The training record gets ``gain`` (r), ``scale`` (B / B0),
``batch`` and ``progress`` (base steps done). The estimates and the progress are the controller's state, kept in the
checkpoint's ``hooks`` under ``adascale``: a resumed run goes on from them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from bigbatch.engine.controllers.base import BatchController, StepBatch
from bigbatch.largebatch.adascale import AdaScale
from bigbatch.registry import BATCH_CONTROLLERS
from bigbatch.telemetry.noise_scale import MicroBatchGradients, batch_sizes

if TYPE_CHECKING:
    import torch.nn as nn

    from bigbatch.batching import BatchPlan
    from bigbatch.config import RunConfig
    from bigbatch.engine.progress import Progress
    from bigbatch.engine.step import TrainStep
    from bigbatch.floor.distributed import Process
    from bigbatch.state_schema import Schema


class AdaptiveBatch(BatchController):
    unit = "base step"
    state_key = "adascale"
    measures = True

    def __init__(self, cfg: RunConfig, plan: BatchPlan, proc: Process) -> None:
        super().__init__(cfg, plan, proc)
        assert plan.base is not None
        self.adascale = AdaScale(plan.base, plan.steps, grow_to=plan.grow_to, unit=proc.world * plan.micro_batch)
        self.noise = self.adascale.noise
        self.world, self.device = plan.world, proc.device
        self.tracker = MicroBatchGradients(world=plan.world)
        self.reduce = torch.distributed.all_reduce if plan.world > 1 else None

    def next_step(self, progress: Progress) -> StepBatch:
        adascale = self.adascale
        r = adascale.begin_step(progress.plan.batch_at(progress.step))
        return StepBatch(adascale.batch, gain=r, ema_power=r, last=adascale.last_step)

    def schedule_step(self, progress: Progress) -> int:
        return min(math.floor(self.adascale.progress), self.total - 1)

    def end_step(self, progress: Progress, step: TrainStep) -> int | None:
        norms = self.tracker.end_step(self.reduce)
        small, big = batch_sizes(step.plan.micro_batch // step.split, step.subdivisions, self.world)
        adascale = self.adascale
        adascale.end_step(norms, small, big)
        grown = adascale.grown_batch()  # grow: true, the same on every process (all-reduced measurements)
        return None if adascale.finished else grown

    def finished(self, progress: Progress) -> bool:
        return self.adascale.finished

    def done(self, progress: Progress) -> int:
        return int(self.adascale.progress)

    def record(self, progress: Progress) -> dict[str, Any]:
        adascale = self.adascale
        return {"gain": round(adascale.gain, 6), "scale": round(adascale.scale, 6), "batch": adascale.batch,
                "progress": round(adascale.progress, 6)}

    def summary(self, progress: Progress) -> list[tuple[str, dict[str, Any], str]]:
        adascale, steps = self.adascale, progress.step
        if self.world > 1 and adascale.finished:  # every process took the same steps (else they diverged)
            mine = torch.tensor([float(steps), adascale.progress], dtype=torch.float64,
                                device=self.device)  # NCCL gathers device tensors only
            gathered = [torch.empty_like(mine) for _ in range(self.world)]
            torch.distributed.all_gather(gathered, mine)
            if any(not torch.equal(g, gathered[0]) for g in gathered):
                raise RuntimeError(f"AdaScale: the processes disagree on (steps, progress): "
                                   f"{[g.tolist() for g in gathered]}")
        return [("adascale", {"steps": steps, "progress": adascale.progress, "base_steps": adascale.total},
                 f"AdaScale: {steps} steps of {adascale.batch} images made {adascale.progress:.1f} base steps of "
                 f"{adascale.base} (the base recipe's {adascale.total}): "
                 f"{adascale.progress / max(steps, 1):.2f} base steps per step")]

    def grown_event(self, step: int, batch: int) -> tuple[dict[str, Any], str]:
        """The ``batch_grown`` event of a growth to ``batch`` from step ``step``."""
        adascale = self.adascale
        b_simple = adascale.noise.b_simple
        return ({"batch": batch, "noise_scale": b_simple},
                f"step {step}: the gradient noise scale, ~{b_simple:,.0f} images, is at least twice the batch: the "
                f"batch doubles to {batch} (AdaScale scale {batch / adascale.base:g})")

    def attach(self, model: nn.Module) -> None:
        self.tracker.attach(model.parameters())

    def detach(self) -> None:
        self.tracker.detach()

    def before_forward(self, index: int, step: TrainStep) -> None:
        if index == 0:  # every attempt starts afresh: a re-run or re-cut step measures its own gradients
            self.tracker.begin_step(step.scaler.scale, step.attempt_micro_batches)

    def after_backward(self, index: int) -> None:
        self.tracker.after_backward(index)

    def state_dict(self) -> dict[str, Any]:
        return self.adascale.state_dict()

    def state_schema(self) -> Schema:
        return self.adascale.state_schema()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adascale.load_state_dict(state)


BATCH_CONTROLLERS.register("adaptive", AdaptiveBatch, chooses=lambda cfg: cfg.adaptive is not None)
