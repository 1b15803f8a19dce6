"""``log.noise_scale``: the gradient noise scale of the run, from the micro-batch gradients accumulation computes.

McCandlish et al. 2018 (``telemetry/noise_scale.py`` has the estimators): the tracker hooks the model's parameters
for the run; at the first micro-batch of each attempt it starts (the loss scale and the micro-batch count of that
attempt), after every backward it sums the norms of the micro-batch's gradient as autograd handed it over, and after
an applied step the two squared norms update the smoothed |G|^2 and tr(Sigma). The training record gets
``noise_scale`` = B_simple in images (absent until it is defined, and in runs whose steps have a single micro-batch
per process). The run's end says where the batch stands. The two averages are the hook's state: a resumed run goes
on averaging from the checkpoint's. Where the batch controller measures the same on every process (AdaScale's,
``engine/controllers/adaptive.py``), this hook reports its estimates (``run.progress.noise``) and measures nothing
itself.
"""

from __future__ import annotations

from typing import Any

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS
from bigbatch.state_schema import Schema
from bigbatch.telemetry.noise_scale import MicroBatchGradients, NoiseScale, batch_sizes


class NoiseScaleHook(Hook):
    """The gradient noise scale ``B_simple`` from the micro-batch gradients (``log.noise_scale``)."""

    stage = "measure"

    def __init__(self, run: Run) -> None:
        # a batch controller that measures the same on every process (AdaScale's): its estimates are reported
        shared = run.progress.noise
        self.shared = shared is not None
        self.tracker = None if self.shared else MicroBatchGradients(world=run.plan.world)  # one step's: not kept
        self.noise = shared if shared is not None else NoiseScale()

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.shared else self.noise.state_dict()  # shared: AdaScale's state holds it

    def state_schema(self) -> Schema | None:
        return None if self.shared else NoiseScale.STATE_SCHEMA

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.shared:
            self.noise.load_state_dict(state)

    def before_train(self, run: Run) -> None:
        if self.tracker is not None:
            self.tracker.attach(run.model.parameters())

    def before_forward(self, run: Run, index: int) -> None:
        if self.tracker is not None and index == 0:  # every attempt starts afresh: a re-run or re-cut step
            self.tracker.begin_step(run.train_step.scaler.scale, run.train_step.attempt_micro_batches)

    def after_backward(self, run: Run, index: int) -> None:
        if self.tracker is not None:
            self.tracker.after_backward(index)

    def after_step(self, run: Run) -> dict[str, Any] | None:
        if self.tracker is None:  # shared: updated by the batch controller at the end of the step
            return {"noise_scale": round(self.noise.b_simple, 1)} if self.noise.b_simple is not None else None
        norms = self.tracker.end_step()
        if norms is None:
            return None
        step = run.train_step
        small, big = batch_sizes(run.plan.micro_batch // step.split, step.subdivisions, run.plan.world)
        self.noise.update(norms.small_sq, small, norms.big_sq, big)
        if self.noise.b_simple is None:
            return None
        return {"noise_scale": round(self.noise.b_simple, 1)}

    def after_train(self, run: Run) -> None:
        if self.tracker is not None:
            self.tracker.detach()
        b_simple = self.noise.b_simple
        if b_simple is None:
            return
        batch = run.plan.batch_at(max(0, run.progress.step - 1))  # the last step's, under a batch schedule
        where = ("below it: a larger batch would still cut the steps nearly in proportion" if batch < b_simple else
                 "above it: a larger batch would cut the steps less than in proportion")
        which = f"its last batch, {batch}," if run.plan.phases else f"this run's batch of {batch}"
        run.events.event(run.progress.step, "noise_scale", {"noise_scale": round(b_simple, 1), "batch": batch},
                         f"gradient noise scale: ~{b_simple:,.0f} images (the critical batch, McCandlish et al. "
                         f"2018); {which} is {where}")


HOOKS.register("noise_scale", lambda run: NoiseScaleHook(run) if run.cfg.log.noise_scale and run.proc.is_main
               else None)
