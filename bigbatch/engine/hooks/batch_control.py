"""What the run's end reports of its batch controller (``engine/controllers/``): AdaScale's steps against the base
steps they made, after checking that every process took the same (a fixed or scheduled batch reports nothing)."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


class BatchControlSummary(Hook):
    """The batch controller's summary at the run's end (AdaScale's steps against the base steps they made)."""

    stage = "measure"

    def after_train(self, run: Run) -> None:
        for name, values, message in run.progress.controller.summary(run.progress):
            run.events.event(run.progress.step, name, values, message)


HOOKS.register("batch_control", lambda run: BatchControlSummary())
