"""The training record: every ``log.every`` steps (and the first and the last), the step's scalars.

Under torchrun the loss and its terms are the global batch's: at the recorded steps (the same on every process) every
process's means over its micro-batches are averaged in one small all-reduce (``distributed.global_means``), so a
record does not depend on the layout (processes x subdivisions). What a process measures of itself (times, memory)
stays rank 0's. Only rank 0 puts the record."""

from __future__ import annotations

import time
from typing import Any

from bigbatch.engine.hooks.base import Hook, is_due
from bigbatch.engine.run import Run
from bigbatch.floor.distributed import global_means
from bigbatch.largebatch.precision import LossScaler
from bigbatch.registry import HOOKS


class TrainingLog(Hook):
    """The ``train`` record: ``step``, ``images``, ``epoch``, ``lr``, ``loss`` (the step's mean micro-batch loss over
    the global batch) and its terms when the task's loss has some (``loss_box``, ...: each its mean micro-batch value
    over the global batch), ``images_per_s`` (since the previous record), ``skipped``, ``t_data`` (seconds the step
    waited for its data, on rank 0), what the run's progress shows of its batch (``batch``: the step's, under a batch
    schedule; AdaScale's ``gain``, ``scale``, ``batch`` and ``progress``), and ``grad_norm`` (when clipping by norm)
    and ``loss_scale`` (when one is used); the measure hooks' values join it (``engine/hooks/base.py``).

    Built on every process: at each recorded step every process takes part in the loss's all-reduce (the steps are
    decided from the step count and the run's plan, the same everywhere); the other processes then return nothing."""

    stage = "record"

    def __init__(self, main: bool = True) -> None:
        self.main = main
        """Whether this process puts the record (rank 0), or only takes part in its all-reduce."""

    def before_train(self, run: Run) -> None:
        self.first = run.progress.step + 1
        self.last_time, self.last_step = time.perf_counter(), run.progress.step

    def after_step(self, run: Run) -> dict[str, Any] | None:
        progress, result = run.progress, run.result
        done, plan = progress.step, progress.plan
        if not (is_due(done, run.cfg.log.every, plan.steps) or done == self.first):
            return None
        means = global_means(result.means(), result.micro_batches)  # a collective: on every process
        if not self.main:
            return None
        now = time.perf_counter()
        images = plan.images_before(done)
        rate = (images - plan.images_before(self.last_step)) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_step = now, done
        scaler = run.train_step.scaler
        values = {"step": done, "images": images, "epoch": round(plan.epoch_at(done), 4), "lr": run.lr, **means,
                  "images_per_s": round(rate, 1), "skipped": run.train_step.skipped, "t_data": round(run.t_data, 6)}
        values.update(progress.record())  # the batch under a schedule; AdaScale's gain, scale, batch, progress
        if result.grad_norm is not None:
            values["grad_norm"] = result.grad_norm
        if type(scaler) is not LossScaler or scaler.scale != 1.0:
            values["loss_scale"] = scaler.scale
        return values


HOOKS.register("training_log", lambda run: TrainingLog(main=run.proc.is_main))
