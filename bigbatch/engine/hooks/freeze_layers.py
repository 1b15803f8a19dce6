"""``model.freeze``, ``model.unfreeze_at`` and a Darknet cfg's freezing keys (``largebatch/freeze.py``): before every
step, the parameters frozen at that step get no gradient and their BatchNorm layers are in eval mode; where the set of
trained parameters changes (a freeze ends, or Darknet's ``burnin_update`` begins one), the step's DDP wrapper is built
again. Set from the step alone, so a resumed run is frozen as an uninterrupted one; evaluation puts the model in eval
mode and back, and this hook sets the frozen layers again before every step.
"""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.engine.step import unwrap
from bigbatch.largebatch.freeze import FrozenGroup, frozen_groups, set_frozen
from bigbatch.registry import HOOKS


class FreezeLayers(Hook):
    """The frozen groups of the run, set before each step."""

    stage = "prepare"

    def __init__(self, groups: list[FrozenGroup]) -> None:
        self.groups = groups

    def before_train(self, run: Run) -> None:
        self.first = run.progress.step

    def before_step(self, run: Run) -> None:
        if run.step == self.first == 0 and run.proc.is_main:  # said here: every writer is open by now
            for group in self.groups:
                until = "for the whole run" if group.until is None else f"until step {group.until}"
                run.events.event(0, "frozen", {"parameters": len(group.names), "until_step": group.until,
                                               "reason": group.reason},
                                 f"frozen: {len(group.names)} parameter tensors {until} ({group.reason})")
        # the layers of a freeze that ended train again; under norm.freeze_during_warmup its hook, just before this
        # one, has set every BatchNorm layer's mode for this step already
        model = unwrap(run.model)
        trained_norm = None if run.cfg.norm.freeze_during_warmup else model.training
        if set_frozen(model, self.groups, run.step, trained_norm):
            run.train_step.trained_set_changed()


def _build(run: Run) -> FreezeLayers | None:
    groups = frozen_groups(unwrap(run.model), run.cfg, run.plan)
    return FreezeLayers(groups) if groups else None


HOOKS.register("freeze_layers", _build)
