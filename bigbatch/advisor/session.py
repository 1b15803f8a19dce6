"""The training parts of the advisor's measured steps (``measure.py`` on one process, ``pair.py`` on two): the run's
own model, step, loader and phase clock (``engine/parts.py``, ``engine/phases.py``) at a given batch and micro-batch,
and the sizes of a model's BatchNorm statistics."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from bigbatch.config import RunConfig, validate_config
from bigbatch.errors import UserError


def batchnorm_sizes(model: nn.Module) -> tuple[int, float]:
    """(BN layers, mean bytes of one layer's statistics all-reduce: C sums, C sums of squares and the count, in
    float32: ``largebatch/sync_bn.py``'s forward)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    from bigbatch.largebatch.sync_bn import CrossDeviceBatchNorm

    channels = [m.num_features for m in model.modules() if isinstance(m, (_BatchNorm, CrossDeviceBatchNorm))]
    if not channels:
        return 0, 0.0
    return len(channels), 4.0 * (2 * sum(channels) / len(channels) + 1)


class Session:
    """A config's training parts for a few measured steps on this process (``proc``: one of ``world``), at global
    ``batch`` in micro-batches of ``micro``: the task, its plan (``total`` steps), the model and step, and the loader
    of this process's share of each step (the run's data order)."""

    def __init__(self, cfg: RunConfig, proc: Any, batch: int, micro: int, total: int) -> None:
        from bigbatch.batching import BatchPlan
        from bigbatch.engine.events import EventStorage
        from bigbatch.engine.parts import build_parts
        from bigbatch.engine.trainer import seed_everything
        from bigbatch.tasks import build_task

        seed_everything(cfg.seed)
        self.subdivisions = batch // (proc.world * micro)
        self.cfg = validate_config({**cfg.model_dump(mode="json"), "batch": batch, "subdivisions": self.subdivisions})
        self.proc, self.task = proc, build_task(self.cfg, proc.rank)
        self.plan = BatchPlan(batch=batch, world=proc.world, subdivisions=self.subdivisions, steps=total,
                              train_images=len(self.task.train_set))
        self.task.set_plan(self.plan)
        self.parts = build_parts(self.cfg, self.task, self.plan, proc, EventStorage(), recut_on_oom=False)
        if not self.parts.step.clock.enabled:
            raise UserError("log.timing: the measurement reads the phase clock; it cannot be off here")
        self.parts.model.train()

    def loader(self, start: int, stop: int) -> Any:
        from bigbatch.data.pipeline.loader import batches_by_step
        from bigbatch.data.pipeline.order import order_of

        cfg, proc = self.cfg, self.proc
        order = order_of(self.task.train_set, self.plan, cfg.seed, proc.world)
        return batches_by_step(self.task.train_set, order, start, stop, proc.rank, proc.world, self.subdivisions,
                               cfg.data.workers, self.task.sample_keys, pin_memory=proc.device.type == "cuda")

    def step(self, step: int, batches: Any, hooks: Any) -> dict[str, float] | None:
        """One training step, every phase timed (sub-phases too): the step's times."""
        train_step = self.parts.step
        clock = train_step.clock
        clock.time_next_step(True)
        clock.begin("data")
        micro_batches = next(batches)
        clock.switch("other")
        self.task.observe(micro_batches)
        train_step(step, micro_batches, hooks)
        return clock.end()
