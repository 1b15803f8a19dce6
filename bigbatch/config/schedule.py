"""The ``schedule`` section: lr(step) as warmup phases, a decay and a floor, or a preset's own settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from bigbatch.config.section import PartSection, Section, registered
from bigbatch.config.values import POWER, SLOPE, Interval, Length, PerStep, StepCount, Steps, UsedWhen
from bigbatch.registry import DECAYS, SCHEDULES


class WarmupPhase(Section):
    """One warmup phase; phases run in sequence from step 0, each a factor on the scheduled LR."""

    kind: Literal["linear", "constant", "power"]
    length: Length
    start_factor: float | None = Field(None, ge=0)
    """linear: the factor at the phase's first step (default: where the previous phase ended, 0 for the first)."""
    start_lr: float | None = Field(None, ge=0)
    """linear: an absolute LR to start from instead of ``start_factor``."""
    factor: float = Field(0.1, gt=0)
    """constant: the factor held for the whole phase (the Inception guide's cold epochs at ~10 %)."""
    power: float = Field(4.0, gt=0)
    """power: factor (t / length) ** power, Darknet's burn_in (t counted from 1, as Darknet does)."""


class BatchMilestone(Section):
    """One change of the global batch (Smith, Kindermans, Ying and Le 2018: where a recipe would divide the LR by
    k, multiply the batch by k): from the first optimizer step at or after ``at`` (steps: steps taken; epochs,
    images: data seen), the batch is ``batch`` images, or the previous batch times ``factor``."""

    at: Length
    batch: int | None = Field(None, gt=0)
    factor: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _batch_or_factor(self) -> BatchMilestone:
        if (self.batch is None) == (self.factor is None):
            raise ValueError("each milestone gives batch (the new global batch) or factor (times "
                             "the previous one), not both or neither")
        return self


class DecayConfig(PartSection):
    """The decay after (and under) the warmup, a factor of the scaled LR at absolute step t."""

    parts = DECAYS

    kind: Annotated[str, registered(DECAYS)] = "constant"
    every: Interval | None = None
    """step: gamma ** floor(t / every); exponential: gamma ** (t / every), floored when ``staircase``."""
    milestones: list[Length] = []
    """multistep: the steps at which the LR is multiplied by the next of ``scales`` (default ``gamma``)."""
    scales: list[float] | None = None
    gamma: float = Field(0.1, gt=0)
    staircase: bool = True
    power: float = Field(1.0, gt=0)
    """poly: (1 - progress) ** power."""
    center: Length | None = None
    """sigmoid: 1 / (1 + exp(gamma * (t - center))), Darknet's ``sigmoid`` policy."""
    start: Length | None = None
    """cosine, poly: where the decay starts (default: the end of the warmup)."""
    end: Length | None = None
    """cosine, poly: where it reaches the floor (default: the end of the run)."""


class InceptionTPUConfig(Section):
    """The learning-rate code of the Inception v3 TPU guide (its flag names and values)."""

    decay_rate: float = Field(0.94, gt=0)
    decay_epochs: float = Field(3.0, gt=0)
    warmup: bool = True
    cold_epochs: float = Field(2.0, ge=0)
    warmup_epochs: float = Field(7.0, ge=0)
    num_train_images: int = Field(1_281_167, gt=0)
    """Epochs of that code are ImageNet's, whatever the data here."""
    final_ratio: float = Field(1e-4, ge=0)


class DarknetScheduleConfig(Section):
    """Darknet's ``get_current_rate`` (its ``[net]`` keys)."""

    policy: Literal["constant", "step", "steps", "exp", "poly", "sig", "sgdr"] = "constant"
    burn_in: StepCount = Field(0, ge=0)
    power: float = Field(4.0, gt=0)
    """Burn-in exponent, and the ``poly`` exponent (one key in Darknet)."""
    steps: list[StepCount] = []
    scales: list[float] = []
    step: Annotated[int, Steps(minimum=1)] = Field(1, gt=0)
    scale: float = Field(1.0, gt=0)
    gamma: Annotated[float, PerStep(on="policy", rules=(("exp", POWER), ("sig", SLOPE)))] = 1.0
    """exp: lr * gamma ** batch_num; sig: lr / (1 + exp(gamma * (batch_num - step))), Darknet's ``sigmoid`` policy
    (src/network.c get_current_rate; a ``.cfg`` names it ``policy=sigmoid``, as Darknet's get_policy reads it)."""
    max_batches: Annotated[int, Steps(minimum=1)] | None = Field(None, gt=0)
    """poly: the horizon (default: the run's steps); sgdr: the first cycle's default."""
    learning_rate_min: float = Field(1e-5, ge=0)
    """sgdr: the LR each cosine cycle falls to (absolute, as Darknet's ``learning_rate_min``)."""
    sgdr_cycle: Annotated[int, Steps(minimum=1)] | None = Field(None, gt=0)
    """sgdr: the first cycle's length in steps (default: max_batches)."""
    sgdr_mult: int = Field(2, ge=1)
    """sgdr: each cycle is this many times the one before (a whole number, as Darknet reads it)."""

    @model_validator(mode="after")
    def _paired(self) -> DarknetScheduleConfig:
        if len(self.steps) != len(self.scales):
            raise ValueError("schedule.darknet.scales: expected one scale per entry of schedule.darknet.steps")
        return self


class ScheduleConfig(PartSection):
    """lr(step) = scaled lr x warmup factor x max(decay factor, floor); or a preset (``inception_tpu``,
    ``darknet``: docs/references.md)."""

    parts = SCHEDULES

    preset: Annotated[str, registered(SCHEDULES)] = "none"
    warmup: list[WarmupPhase] = []
    decay: DecayConfig = Field(default_factory=DecayConfig)
    min_lr: float | None = Field(None, ge=0)
    """Floor of the decayed LR, absolute."""
    min_lr_ratio: float | None = Field(None, ge=0, le=1)
    """Floor of the decayed LR, as a fraction of the scaled LR."""
    batch: list[BatchMilestone] = []
    """Milestones at which the global batch grows (or shrinks); the LR stays that of the initial batch."""
    decay_at_batch_milestones: bool = False
    """True: an LR that steps down at a ``batch`` milestone is meant (refused otherwise: the point of growing
    the batch is to keep the LR)."""
    inception_tpu: Annotated[InceptionTPUConfig, UsedWhen("preset", "inception_tpu")] = InceptionTPUConfig()
    darknet: Annotated[DarknetScheduleConfig, UsedWhen("preset", "darknet")] = DarknetScheduleConfig()

    @model_validator(mode="after")
    def _one_floor(self) -> ScheduleConfig:
        if self.min_lr is not None and self.min_lr_ratio is not None:
            raise ValueError("schedule.min_lr: give schedule.min_lr or schedule.min_lr_ratio, not both")
        return self
