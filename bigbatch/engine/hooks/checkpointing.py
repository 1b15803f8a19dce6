"""``checkpoints/last.pt`` every ``checkpoint.every`` (and at the end), written by the main process."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook, is_due
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


class Checkpointing(Hook):
    stage = "checkpoint"

    def before_train(self, run: Run) -> None:
        run.last_checkpoint.step = run.state.step or None  # a resumed run starts from its last checkpoint

    def after_step(self, run: Run) -> None:
        done, last = run.state.step, run.last_checkpoint
        if is_due(done, last.every, run.plan.steps, run.plan):
            if run.proc.is_main:
                run.state.save(last.path)
            last.step = done


HOOKS.register("checkpointing", lambda run: Checkpointing())
