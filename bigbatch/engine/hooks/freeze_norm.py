"""``norm.freeze_during_warmup``: BatchNorm layers in eval mode until the schedule's warmup ends.

MegDet's loop (Peng et al., arXiv 1711.07240: ``if iter < warmup_iters: bn.eval()``): while the learning
rate ramps up, each BN layer normalises with its running statistics and leaves them as they are; its scale and
shift still learn. From the step the warmup ends on, the layers train as usual. Every process freezes the same steps
(the warmup is a function of the config), so cross-device BN stays in step; evaluation puts the model in eval mode
and back, and this hook sets the layers again before every step.
"""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.engine.step import unwrap
from bigbatch.largebatch.norm import batchnorm_layers
from bigbatch.largebatch.schedule import warmup_steps, written_for
from bigbatch.registry import HOOKS


class FreezeNormDuringWarmup(Hook):
    """BatchNorm layers in eval mode until the schedule's warmup ends (``norm.freeze_during_warmup``)."""

    stage = "prepare"

    def before_train(self, run: Run) -> None:
        # in the steps the schedule counts (AdaScale: the base recipe's, base steps of progress)
        self.until, self.first = warmup_steps(*written_for(run.cfg, run.plan)), run.progress.step

    def before_step(self, run: Run) -> None:
        train = run.progress.schedule_step >= self.until  # an adaptive run's: base steps of progress
        if run.step == self.first and not train and run.proc.is_main:  # said here: every writer is open by now
            run.events.event(run.step, "norm_frozen", {"until_step": self.until},
                             "BatchNorm frozen (eval mode) until the warmup ends at "
                             f"{run.progress.unit} {self.until}")
        for layer in batchnorm_layers(unwrap(run.model)):
            layer.train(train)


HOOKS.register("freeze_norm", lambda run: FreezeNormDuringWarmup() if run.cfg.norm.freeze_during_warmup else None)
