"""Fault injection for tests (``debug.*``): an out-of-memory error, non-finite gradients."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS
from bigbatch.telemetry.memory import MemoryLimitExceeded


class Faults(Hook):
    """Fault injection for tests (``debug.*``): an out-of-memory error or non-finite gradients at a chosen step."""

    stage = "guard"

    def __init__(self, run: Run) -> None:
        self.debug = run.cfg.debug
        self.oom_done = False
        self.nonfinite_done = 0

    def before_forward(self, run: Run, index: int) -> None:
        """``debug.oom_at_step``: out of memory at the second micro-batch of that step, once."""
        if run.step == self.debug.oom_at_step and index == 1 and not self.oom_done:
            self.oom_done = True
            raise MemoryLimitExceeded("debug.oom_at_step")

    def after_backward(self, run: Run, index: int) -> None:
        """``debug.nonfinite_at_step``: every gradient NaN, in ``debug.nonfinite_repeats`` attempts at that step
        (an attempt counts once its last micro-batch's backward is done: one cut short by out-of-memory does not)."""
        debug = self.debug
        last = index == run.train_step.attempt_micro_batches - 1
        if run.step == debug.nonfinite_at_step and last and self.nonfinite_done < debug.nonfinite_repeats:
            self.nonfinite_done += 1
            for p in run.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))


def _wanted(run: Run) -> Faults | None:
    debug = run.cfg.debug
    return Faults(run) if debug.oom_at_step is not None or debug.nonfinite_at_step is not None else None


HOOKS.register("faults", _wanted)
