"""Is the step waiting for its input? The share of step time spent waiting for data, and what to change.

Per step, ``t_data`` (the loop's wait for the next micro-batches, ``run.t_data``) against the step's time: that
wait plus the time from the batch's arrival to the end of the optimizer step (evaluation and checkpoints are
not counted: they are not the input pipeline's to hide). At the end of the run an ``event: input_pipeline``
record and the line ``input pipeline: waited X% of step time``; over ``INPUT_BOUND`` (10 %), what to change.
On CUDA the step's time is the host's (kernels run asynchronously), so a GPU-bound step reads as short: the
share is then an upper bound.
"""

from __future__ import annotations

import os
import time

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS

INPUT_BOUND = 0.10
"""Above this share of step time spent waiting for data, the run is input-bound and says what to change."""


class InputPipeline(Hook):
    """The share of the step time spent waiting for data, and what to change when a run is bound by it."""

    stage = "measure"

    def before_train(self, run: Run) -> None:
        self.waited = self.total = 0.0
        self.steps = 0

    def before_step(self, run: Run) -> None:
        self.started = time.perf_counter()

    def after_step(self, run: Run) -> None:
        self.waited += run.t_data
        self.total += run.t_data + time.perf_counter() - self.started
        self.steps += 1

    def after_train(self, run: Run) -> None:
        if not self.steps:
            return
        share = round(self.waited / max(self.total, 1e-12), 4)  # the record's value; the line is printed from it
        message = f"input pipeline: waited {share:.1%} of step time ({self.waited:.1f} s of {self.total:.1f} s)"
        if share > INPUT_BOUND:
            message += "; " + advice(run)
        run.events.event(run.progress.step, "input_pipeline", {"waited_s": round(self.waited, 3),
                                                            "step_s": round(self.total, 3),
                                                            "share": share}, message)


def advice(run: Run) -> str:
    """What to change when the steps wait for data."""
    data, cores = run.cfg.data, os.cpu_count() or 1
    hints = []
    if data.workers < cores:
        given = "workers" in data.model_fields_set  # else the default: a .cfg, or a recipe that does not say
        where = "as the config sets it" if given else "bigbatch's default, which the config leaves unset"
        hints.append(f"more DataLoader workers (data.workers={data.workers}, {where}; this machine has {cores} cores: "
                     f"--set data.workers={min(cores, 8)})")
    if data.name == "folder":
        hints.append("image files packed into shards (bigbatch pack), read in large sequential blocks")
    hints.append(f"less decoding per image (a smaller data.size than {data.size}, or smaller stored images)")
    return "the run is input-bound: try " + "; ".join(hints)


HOOKS.register("input_pipeline", lambda run: InputPipeline() if run.proc.is_main else None)
