"""``log.timing``: the phases of the logged steps in their training records, and the run's table of phase shares.

The step's clock (``engine/phases.py``) starts with the wait for data (the loop) and runs through the step
(``TrainStep``); this hook, first of the ``after_step`` hooks, ends it: at the steps the training record is written
(``log.every``, the first and the last) the phase times join the record (``t_data`` there is the clock's) and the
totals; at other steps nothing is read, and the sub-phases (``t_bn_sync``) are not timed. The run ends with the
table (MegDet's breakdown of an iteration), which names how the cross-device BN sums went (shared memory, gloo, nccl).
"""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook, is_due
from bigbatch.engine.phases import PhaseTotals
from bigbatch.engine.run import Run
from bigbatch.largebatch.sync_bn import all_reduce_routes
from bigbatch.registry import HOOKS


class PhaseTiming(Hook):
    """Where the step time goes (data, forward, backward, sync, update, other): per record, and a table at the end."""

    stage = "measure"

    def before_train(self, run: Run) -> None:
        self.first = run.progress.step + 1
        self.totals = PhaseTotals()
        all_reduce_routes(clear=True)  # those of this run: named in the table
        run.train_step.clock.time_next_step(True)  # the first step is read

    def measured(self, run: Run, done: int) -> bool:
        return is_due(done, run.cfg.log.every, run.plan.steps) or done == self.first

    def after_step(self, run: Run) -> dict[str, float] | None:
        done = run.progress.step
        clock = run.train_step.clock
        times = clock.end(self.measured(run, done))
        clock.time_next_step(self.measured(run, done + 1))  # its sub-phases (t_bn_sync) are timed
        if times is None:
            return None
        if done != self.first:  # the first step warms up (allocations, first kernels): not in the table
            self.totals.add(times)
        return {k: v for k, v in times.items() if k != "t_data"}  # the record's t_data is the loop's

    def after_train(self, run: Run) -> None:
        if self.totals.steps:
            sums = {key: round(value / self.totals.steps, 6) for key, value in self.totals.sums.items()}
            run.events.event(run.progress.step, "phases", {"steps": self.totals.steps, **sums},
                             "where the step time went:\n" + self.totals.table(all_reduce_routes()))


HOOKS.register("phase_timing", lambda run: PhaseTiming() if run.cfg.log.timing != "off" and run.proc.is_main
               else None)
