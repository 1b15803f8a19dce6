"""What the hooks see of a run: its config, its progress (the plan in effect, the steps done), the process, the
task, the training state, the events, and where its last checkpoint is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch.nn as nn

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig
from bigbatch.engine.events import EventStorage
from bigbatch.engine.progress import Progress
from bigbatch.engine.state import TrainingState
from bigbatch.engine.step import StepResult, TrainStep, unwrap
from bigbatch.floor import run_files
from bigbatch.floor.distributed import Process
from bigbatch.largebatch.ema import ema_counts, share_buffers

if TYPE_CHECKING:
    from bigbatch.engine.hooks.base import EveryImages, Hooks
    from bigbatch.tasks.base import Task


@dataclass
class LastCheckpoint:
    """Where the run's last checkpoint is: the weights a run stopped by non-finite gradients can go back to (a step
    with non-finite gradients is never applied, so every checkpoint holds finite weights)."""

    path: Path
    every: int | EveryImages
    """Steps (or, under a batch schedule, images) between checkpoints."""
    step: int | None = None
    """The step of ``path``, once there is one (a resumed run starts from it)."""

    def last_good(self) -> str:
        """Where the last finite weights are, as the message of a stopped run says it."""
        if self.step is not None:
            return (f"The last checkpoint, {self.path} at step {self.step}, holds finite weights: resume from it "
                    f"with a lower optim.lr or another precision")
        first = f"step {self.every}" if isinstance(self.every, int) else f"{self.every.images:g} images"
        return f"No checkpoint had been written yet (the first was due at {first})"


@dataclass
class Run:
    cfg: RunConfig
    progress: Progress
    """The steps done and the plan in effect (the loop moves it; hooks read it)."""
    proc: Process
    task: Task
    state: TrainingState
    train_step: TrainStep
    out_dir: Path
    events: EventStorage
    last_checkpoint: LastCheckpoint
    """Where the last checkpoint is (the checkpointing hook keeps it up to date)."""
    hooks: Hooks | None = None
    step: int = 0
    """The optimizer step being run (0-based); after it, ``progress.step`` (steps done) is ``step + 1``."""
    lr: float = 0.0
    """The learning rate of this step."""
    t_data: float = 0.0
    """Seconds this step waited for its micro-batches (the input pipeline's share of the step)."""
    result: StepResult | None = None
    """The last applied step's loss and gradient norm."""
    steps_over: bool = False
    """The loop is over (done, stopped or interrupted): the ``after_train`` hooks are running."""

    @property
    def model(self) -> nn.Module:
        """The model that trains (wrapped in DDP under torchrun: the step's, which builds the wrapper again when a
        freeze changes the trained parameters); ``state.model`` is the bare one."""
        return self.train_step.model

    @property
    def plan(self) -> BatchPlan:
        """The whole run's plan in effect (``progress.plan``: with the batch changes made so far)."""
        return self.progress.plan

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / run_files.CHECKPOINTS

    def evaluate(self, raw_too: bool = True) -> tuple[dict[str, float], dict[str, float] | None]:
        """(metrics of the weights that count, metrics of the raw weights when those are the EMA's, else None).

        The EMA weights count when there is an EMA and ``ema.evaluate`` (the default: ``largebatch.ema.ema_counts``);
        the raw ones are then evaluated too (``raw_too``), for comparison. Each rank evaluates its shard of the
        validation set with rank 0's weights: the buffers of the raw model, and of the EMA, are made rank 0's first
        (``largebatch/ema.py``'s ``share_buffers``; each rank's BN statistics are its own without ``norm.sync``), so the
        metrics are those of the weights rank 0 saves. The bare model is evaluated, not the DDP wrapper: the
        wrapper's first forward is a collective itself, which a rank with no validation image to forward never
        joins (a set smaller than the world: a hang). Called on every rank."""
        cfg, task, proc, ema = self.cfg, self.task, self.proc, self.state.ema
        model = unwrap(self.model)
        counts = ema_counts(ema, cfg)
        if not counts or raw_too:
            share_buffers(model)  # a collective under torchrun: every rank is here
        if not counts:
            return task.evaluate(model, cfg.eval.batch, proc.rank, proc.world), None
        raw = task.evaluate(model, cfg.eval.batch, proc.rank, proc.world) if raw_too else None
        ema.share_buffers()  # a collective under torchrun: every rank is here
        return task.evaluate(ema.module, cfg.eval.batch, proc.rank, proc.world), raw
