"""The training record: every ``log.every`` steps (and the first and the last), the step's scalars."""

from __future__ import annotations

import time
from typing import Any

from bigbatch.engine.hooks.base import Hook, is_due
from bigbatch.engine.run import Run
from bigbatch.largebatch.precision import LossScaler
from bigbatch.registry import HOOKS


class TrainingLog(Hook):
    """The ``train`` record: ``step``, ``images``, ``epoch``, ``lr``, ``loss`` (the step's mean micro-batch loss),
    ``images_per_s`` (since the previous record), ``skipped``, ``t_data`` (seconds the step waited for its data), and
    ``grad_norm`` (when clipping by norm), ``loss_scale`` (when one is used) and ``batch`` (the global batch of the
    step, under a batch schedule); the measure hooks' values join it (``engine/hooks/base.py``)."""

    stage = "record"

    def before_train(self, run: Run) -> None:
        self.first = run.state.step + 1
        self.last_time, self.last_step = time.perf_counter(), run.state.step

    def after_step(self, run: Run) -> dict[str, Any] | None:
        done, plan, result = run.state.step, run.plan, run.result
        if not (is_due(done, run.cfg.log.every, plan.steps) or done == self.first):
            return None
        now = time.perf_counter()
        images = plan.images_before(done)
        rate = (images - plan.images_before(self.last_step)) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_step = now, done
        scaler = run.train_step.scaler
        values = {"step": done, "images": images, "epoch": round(plan.epoch_at(done), 4), "lr": run.lr,
                  "loss": result.loss.item(), "images_per_s": round(rate, 1), "skipped": run.train_step.skipped,
                  "t_data": round(run.t_data, 6)}
        if plan.phases:
            values["batch"] = plan.batch_at(done - 1)  # the batch in effect in the step just done
        if result.grad_norm is not None:
            values["grad_norm"] = result.grad_norm
        if type(scaler) is not LossScaler or scaler.scale != 1.0:
            values["loss_scale"] = scaler.scale
        return values


HOOKS.register("training_log", lambda run: TrainingLog() if run.proc.is_main else None)
