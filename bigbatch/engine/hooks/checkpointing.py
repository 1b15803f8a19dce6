"""``checkpoints/last.pt`` every ``checkpoint.every`` (and at the end), written by the main process.

Where the evaluation's ``after_step`` runs just before this one (nothing between them can change the state) and it
wrote ``best.pt`` at the same step, ``last.pt`` is a hard link to that file rather than the same bytes again."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook, is_due
from bigbatch.engine.hooks.evaluation import Evaluation
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


class Checkpointing(Hook):
    """``last.pt`` every ``checkpoint.every`` and at the end (a hard link to ``best.pt`` when written just after it)."""

    stage = "checkpoint"

    def before_train(self, run: Run) -> None:
        run.last_checkpoint.step = run.progress.step or None  # a resumed run starts from its last checkpoint
        self.right_after_evaluation = isinstance(run.hooks.after_step_before(self), Evaluation)

    def after_step(self, run: Run) -> None:
        done, last = run.progress.step, run.last_checkpoint
        if is_due(done, last.every, run.plan.steps, run.plan):
            # every rank: each sends its RNG states to rank 0, which alone writes (TrainingState.save)
            run.state.save(last.path, may_link=self.right_after_evaluation)
            last.step = done


HOOKS.register("checkpointing", lambda run: Checkpointing())
