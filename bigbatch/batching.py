"""The batch plan: how one global batch is cut across devices and micro-batches.

Darknet's meaning (pjreddie/darknet ``src/parser.c``, ``parse_net_options``; docs/references.md): ``batch``
images make one weight update; each device runs them as ``subdivisions`` micro-batches of forward and backward:

    micro_batch = batch / (world * subdivisions)

Memory is that of the micro-batch; the gradient is that of the whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bigbatch.config import RunConfig
from bigbatch.errors import UserError

INT64_MAX = 2**63 - 1
"""Images are counted (data order, records, TensorBoard steps) in 64-bit integers."""


@dataclass(frozen=True)
class BatchPlan:
    batch: int
    """Global images per optimizer step."""
    world: int
    """Devices (processes) sharing each step."""
    subdivisions: int
    """Micro-batches per device per step."""
    steps: int
    """Optimizer steps of the whole run."""
    train_images: int
    """Images in the training set (one epoch)."""

    @property
    def micro_batch(self) -> int:
        return self.batch // (self.world * self.subdivisions)

    @property
    def images(self) -> int:
        """Images seen over the whole run: steps * batch."""
        return self.steps * self.batch

    @property
    def epochs(self) -> float:
        return self.images / self.train_images

    @property
    def steps_per_epoch(self) -> float:
        return self.train_images / self.batch

    def epoch_at(self, step: int) -> float:
        """Epochs completed after ``step`` optimizer steps (fractional: batches straddle epochs)."""
        return step * self.batch / self.train_images

    def describe(self) -> str:
        return "\n".join(
            [
                f"global batch    {self.batch} images per optimizer step",
                f"world size      {self.world}",
                f"subdivisions    {self.subdivisions} micro-batches per device per step",
                f"micro-batch     {self.micro_batch} images "
                f"(= {self.batch} / ({self.world} x {self.subdivisions}))",
                f"steps           {self.steps}",
                f"images seen     {self.images}",
                f"epochs          {self.epochs:.2f} (of {self.train_images} training images)",
            ]
        )


def check_batch(cfg: RunConfig, world: int) -> None:
    """The global batch must cut into ``world * subdivisions`` equal micro-batches."""
    devices = world * cfg.subdivisions
    if cfg.batch % devices:
        raise UserError(
            f"batch: {cfg.batch} is not divisible by world size {world} x subdivisions "
            f"{cfg.subdivisions} = {devices}; expected a multiple of {devices}"
        )


def total_steps(cfg: RunConfig, train_images: int) -> int:
    """The run's optimizer steps: ``steps``, or ``ceil(epochs * train_images / batch)``."""
    if cfg.steps is not None:
        return cfg.steps
    assert cfg.epochs is not None  # the config guarantees one of them
    return math.ceil(cfg.epochs * train_images / cfg.batch - 1e-9)  # 1.1 epochs of 1000 at 100: 11, not 12


def make_plan(cfg: RunConfig, world: int, train_images: int) -> BatchPlan:
    """Check that the batch divides evenly and turn ``epochs`` into steps."""
    check_batch(cfg, world)
    if train_images <= 0:
        raise UserError(f"data.name: the {cfg.data.name!r} training set is empty")
    steps = total_steps(cfg, train_images)
    if steps * cfg.batch > INT64_MAX:
        key = "steps" if cfg.steps is not None else "epochs"
        raise UserError(f"{key}: {steps} steps of {cfg.batch} images are {steps * cfg.batch:.3g} images, more than a "
                        f"64-bit count holds ({INT64_MAX:.3g})")
    return BatchPlan(
        batch=cfg.batch,
        world=world,
        subdivisions=cfg.subdivisions,
        steps=steps,
        train_images=train_images,
    )
