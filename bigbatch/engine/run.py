"""What the hooks see of a run: its config and plan, the process, the task, the training state, the events."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.nn as nn

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig
from bigbatch.engine.distributed import Process
from bigbatch.engine.events import EventStorage
from bigbatch.engine.state import TrainingState
from bigbatch.engine.step import StepResult, TrainStep
from bigbatch.recipe.ema import ema_counts

if TYPE_CHECKING:
    from bigbatch.engine.hooks.base import Hooks
    from bigbatch.tasks.base import Task


@dataclass
class Run:
    cfg: RunConfig
    plan: BatchPlan
    proc: Process
    task: Task
    model: nn.Module
    """The model that trains (wrapped in DDP under torchrun); ``state.model`` is the bare one."""
    state: TrainingState
    train_step: TrainStep
    out_dir: Path
    events: EventStorage
    hooks: Hooks | None = None
    step: int = 0
    """The optimizer step being run (0-based); after it, ``state.step`` (steps done) is ``step + 1``."""
    lr: float = 0.0
    """The learning rate of this step."""
    t_data: float = 0.0
    """Seconds this step waited for its micro-batches (the input pipeline's share of the step)."""
    result: StepResult | None = None
    """The last applied step's loss and gradient norm."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The last evaluation's metrics (of the weights that count)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """What hooks leave for the run's result (``memory``: the peaks)."""
    record: dict[str, Any] = field(default_factory=dict)
    """Values hooks ordered before the training record (``training_log``) add to this step's record
    (``noise_scale``, ``top_updates``); emptied once the record is put."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    def evaluate(self, raw_too: bool = True) -> tuple[dict[str, float], dict[str, float] | None]:
        """(metrics of the weights that count, metrics of the raw weights when those are the EMA's, else None).

        The EMA weights count when there is an EMA and ``ema.evaluate`` (the default: ``recipe.ema.ema_counts``); the
        raw ones are then evaluated too (``raw_too``), for comparison."""
        cfg, task, proc, ema = self.cfg, self.task, self.proc, self.state.ema
        if not ema_counts(ema, cfg):
            return task.evaluate(self.model, cfg.eval.batch, proc.rank, proc.world), None
        raw = task.evaluate(self.model, cfg.eval.batch, proc.rank, proc.world) if raw_too else None
        return task.evaluate(ema.module, cfg.eval.batch, proc.rank, proc.world), raw
