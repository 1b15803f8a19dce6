"""What a person sees: on a terminal, a progress bar (step, images/s, loss, lr, ETA) with messages above it, closed
when the steps are over so that the summaries after them print below it, once; otherwise a printed line per record
(main process)."""

from __future__ import annotations

import sys

from bigbatch.engine.events import Record
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


class Console(Hook):
    """What a person sees: a progress bar on a terminal, a printed line per record otherwise."""

    stage = "record"

    def __init__(self) -> None:
        self.bar = None  # records put before before_train (a measure hook's own, at its start) print as lines
        self.run: Run | None = None

    def before_train(self, run: Run) -> None:
        from bigbatch.largebatch.schedule import warmup_note

        note = warmup_note(run.cfg, run.plan, run.progress.step)
        if note is not None:
            print(note, flush=True)
        self.run = run  # for write(): whether the steps are over
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            progress = run.progress  # an adaptive run's bar counts base steps of progress
            self.bar = tqdm(total=progress.total, initial=progress.done, unit=progress.unit, dynamic_ncols=True)

    def after_step(self, run: Run) -> None:
        if self.bar is not None:
            self.bar.update(min(run.progress.done, self.bar.total) - self.bar.n)

    def write(self, record: Record) -> None:
        if self.bar is not None and self.run is not None and self.run.steps_over:
            self.bar.close()  # the summaries (phases, memory, ...) go below the bar, which is not drawn again
            self.bar = None
        if self.bar is None:
            print(record.message, flush=True)
        elif record.kind == "train":
            v = record.values
            self.bar.set_postfix(loss=f"{v['loss']:.4f}", lr=f"{v['lr']:.4g}", img_s=f"{v['images_per_s']:.0f}",
                                 refresh=False)
            self.bar.update(min(self.run.progress.done, self.bar.total) - self.bar.n)
        else:
            self.bar.write(record.message)

    def close(self, run: Run) -> None:
        self.run = None
        if self.bar is not None:
            self.bar.close()


HOOKS.register("console", lambda run: Console() if run.proc.is_main else None)
