"""``checkpoints/last.pt`` every ``checkpoint.every`` (and at the end), written by the main process."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook, every_steps, is_due
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


class Checkpointing(Hook):
    def __init__(self, run: Run) -> None:
        self.every = every_steps(run.cfg.checkpoint.every, run.plan)
        self.path = run.checkpoint_dir / "last.pt"
        self.last: int | None = None
        """The step of ``last.pt``, once there is one."""

    def before_train(self, run: Run) -> None:
        self.last = run.state.step or None  # a resumed run starts from its last checkpoint
        run.train_step.last_good = self.last_good

    def after_step(self, run: Run) -> None:
        done = run.state.step
        if is_due(done, self.every, run.plan.steps):
            if run.proc.is_main:
                run.state.save(self.path)
            self.last = done

    def last_good(self) -> str:
        """Where the last finite weights are (a step with non-finite gradients is never applied)."""
        if self.last is not None:
            return (f"The last checkpoint, {self.path} at step {self.last}, holds finite weights: resume from it "
                    f"with a lower optim.lr or another precision")
        return f"No checkpoint had been written yet (the first was due at step {self.every})"


HOOKS.register("checkpointing", Checkpointing, order=30)
