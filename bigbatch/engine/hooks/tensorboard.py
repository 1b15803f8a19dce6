"""TensorBoard events in ``tensorboard/`` (``log.tensorboard``, main process): ``train/<scalar>`` and
``<split>/<metric>``, at the step of the record; the relative update of each layer in ``top_updates`` as
``updates/<layer>``."""

from __future__ import annotations

from bigbatch.engine.events import Record
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS

NOT_PLOTTED = {"train": ("step", "images", "epoch"), "eval": ("step", "split")}
"""Keys of a record that are its position, not a curve."""


class TensorBoard(Hook):
    """TensorBoard's event files: the training and evaluation scalars (``log.tensorboard``)."""

    stage = "write"

    def before_train(self, run: Run) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # Events after the checkpoint's step were written by a run that died: hide them on resume.
        start = run.progress.step
        self.writer = SummaryWriter(str(run.out_dir / "tensorboard"), purge_step=start + 1 if start else None)

    def write(self, record: Record) -> None:
        if record.kind == "event":
            return
        prefix = "train" if record.kind == "train" else record.values["split"]
        step = record.values["step"]
        for key, value in record.values.items():
            if key in NOT_PLOTTED[record.kind]:
                continue
            if key == "top_updates":  # a table: each listed layer's relative update as its own curve
                for layer in value:
                    if layer["relative"] is not None:
                        self.writer.add_scalar(f"updates/{layer['name']}", layer["relative"], step)
            elif isinstance(value, (int, float)):
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self, run: Run) -> None:
        self.writer.close()


HOOKS.register("tensorboard", lambda run: TensorBoard() if run.proc.is_main and run.cfg.log.tensorboard else None)
