"""``log.updates``: how large each layer's update is, every ``log.every`` steps (the per-layer maximum weight update
of the Darknet-on-Jetson write-up, docs/references.md, which the ``update_ratio`` loss scale follows).

At the steps the training record is written, the weights are copied before the step and compared after it
(``telemetry/update_sizes.py``): per parameter tensor max |dW| and ||dW|| / ||W||, one row each in ``updates.csv``
of the run directory (``step,name,max_abs,relative``; a resumed run drops the rows past its checkpoint and appends),
and the ten largest relative updates in the training record as ``top_updates``. Main process only.
"""

from __future__ import annotations

from typing import Any

from bigbatch.engine.hooks.base import Hook, is_due
from bigbatch.engine.run import Run
from bigbatch.engine.step import unwrap
from bigbatch.floor import run_files
from bigbatch.registry import HOOKS
from bigbatch.telemetry.update_sizes import UpdatesCSV, UpdateSizes, drop_rows_after, top


class UpdateSizesHook(Hook):
    """The largest relative weight updates per step into ``updates.csv`` (``log.updates``)."""

    stage = "measure"

    def before_train(self, run: Run) -> None:
        self.sizes = UpdateSizes()
        path = run.out_dir / run_files.UPDATES
        if path.is_file():  # a resumed run: the rows past its checkpoint are written again
            drop_rows_after(path, run.progress.step)
        self.csv = UpdatesCSV(path)
        self.first = run.progress.step + 1
        self.measuring = False

    def before_step(self, run: Run) -> None:
        done = run.step + 1  # as the training record counts
        self.measuring = is_due(done, run.cfg.log.every, run.plan.steps) or done == self.first
        if self.measuring:
            self.sizes.before(unwrap(run.model))

    def after_step(self, run: Run) -> dict[str, Any] | None:
        if not self.measuring:
            return None
        updates = self.sizes.after(unwrap(run.model))
        self.csv.write(run.progress.step, updates)
        return {"top_updates": top(updates)}

    def close(self, run: Run) -> None:
        if hasattr(self, "csv"):
            self.csv.close()


HOOKS.register("update_sizes", lambda run: UpdateSizesHook() if run.cfg.log.updates and run.proc.is_main else None)
