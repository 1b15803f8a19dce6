"""The batch plan: how one global batch is cut across devices and micro-batches.

Darknet's meaning (pjreddie/darknet ``src/parser.c``, ``parse_net_options``; docs/references.md): ``batch``
images make one weight update; each device runs them as ``subdivisions`` micro-batches of forward and backward:

    micro_batch = batch / (world * subdivisions)

Memory is that of the micro-batch; the gradient is that of the whole batch.

A batch schedule (``schedule.batch``; Smith, Kindermans, Ying and Le, "Don't Decay the Learning Rate, Increase the
Batch Size", ICLR 2018) cuts the run into phases, each with its own global batch. The micro-batch stays that of
the first phase (what ``plan`` measured), so a batch of ``b`` is ``b / (world * micro_batch)`` micro-batches per
device. Step ``t`` of a phase that starts at step ``s`` after ``i`` images covers images
``[i + (t - s) b, i + (t - s + 1) b)`` of the data order.

An adaptive batch (``batch: {mode: adaptive, base: B0, max: B}``; AdaScale, ``largebatch/adascale.py``) runs at B
with a recipe written for B0: ``base`` is B0 and ``steps`` the base schedule's length in steps of B0, which is also
the most optimizer steps the run can take (each step advances the schedule by r >= 1 base steps); how many it takes
is measured, not planned.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from bigbatch.config import RunConfig
from bigbatch.errors import UserError

INT64_MAX = 2**63 - 1
"""Images are counted (data order, records, TensorBoard steps) in 64-bit integers."""


@dataclass(frozen=True)
class BatchLayout:
    """How the first global batch is cut, checked (:func:`check_batch`): what a run's boundary settles before any
    work (``engine/preflight.py``'s ``resolve_batch``), for the plan made once the training set is loaded."""

    batch: int
    world: int
    subdivisions: int


@dataclass(frozen=True)
class BatchPhase:
    """From optimizer step ``step`` on (after ``images`` images), the global batch is ``batch``."""

    step: int
    images: int
    batch: int


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
    train_images: int | None
    """Images in the training set (one epoch); None when its data is not at hand (``show``, ``schedule``, ``scale``
    plan without it): the epochs are unknown."""
    phases: tuple[BatchPhase, ...] = ()
    """The batch schedule's changes after the first phase (which starts at step 0 with ``batch``); none: the
    batch is ``batch`` for the whole run."""
    base: int | None = None
    """An adaptive run's base batch B0 (AdaScale); ``steps`` is then the base schedule's length, in steps of B0."""
    grow_to: int | None = None
    """An adaptive run whose batch grows (``grow: true``): its largest batch; ``phases`` are then the changes made
    so far."""

    @property
    def micro_batch(self) -> int:
        return self.batch // (self.world * self.subdivisions)

    @property
    def images(self) -> int:
        """Images seen over the whole run: steps * batch (summed over the phases)."""
        return self.images_before(self.steps)

    @property
    def epochs(self) -> float | None:
        return None if self.train_images is None else self.images / self.train_images

    def images_per_epoch(self, key: str) -> int:
        """The training set's size, to count ``key``'s length in epochs; when it is unknown, a ``UserError`` that
        names ``key`` and ``data.train_images``."""
        if self.train_images is None:
            raise EpochsUnknown(epochs_unknown(key))
        return self.train_images

    @property
    def largest_batch(self) -> int:
        return max([self.batch, *(phase.batch for phase in self.phases), self.grow_to or 0])

    def phase_at(self, step: int) -> BatchPhase:
        """The phase that optimizer step ``step`` (0-based) belongs to."""
        k = bisect.bisect_right([phase.step for phase in self.phases], step)
        return self.phases[k - 1] if k else BatchPhase(0, 0, self.batch)

    def batch_at(self, step: int) -> int:
        """The global batch of optimizer step ``step``."""
        return self.phase_at(step).batch

    def subdivisions_at(self, step: int) -> int:
        """Micro-batches per device in optimizer step ``step``: its batch over ``world x micro_batch``."""
        return self.batch_at(step) // (self.world * self.micro_batch)

    def images_before(self, step: int) -> int:
        """Images of the data order that the steps before ``step`` took (the first image of step ``step``)."""
        phase = self.phase_at(step)
        return phase.images + (step - phase.step) * phase.batch

    def steps_for_images(self, images: float) -> float:
        """The (fractional) optimizer steps that take ``images`` images: the inverse of ``images_before``."""
        phase = BatchPhase(0, 0, self.batch)
        for later in self.phases:
            if later.images > images:
                break
            phase = later
        return phase.step + (images - phase.images) / phase.batch

    def at(self, step: int) -> BatchPlan:
        """The plan of a run whose batch stays that of step ``step`` (its batch and subdivisions, no phases)."""
        if not self.phases:
            return self
        return replace(self, batch=self.batch_at(step), subdivisions=self.subdivisions_at(step), phases=())

    def base_plan(self) -> BatchPlan:
        """The plan of the base recipe an adaptive run follows: ``steps`` steps of ``base`` images (its schedule's
        steps); a fixed run's plan is its own."""
        if self.base is None:
            return self
        return replace(self, batch=self.base, world=1, subdivisions=1, phases=(), base=None, grow_to=None)

    def grown(self, step: int, batch: int) -> BatchPlan:
        """This plan with the batch changed to ``batch`` from optimizer step ``step`` on (an adaptive batch grew)."""
        return replace(self, phases=(*self.phases, BatchPhase(step, self.images_before(step), batch)))

    def epoch_at(self, step: int) -> float | None:
        """Epochs completed after ``step`` optimizer steps (fractional: batches straddle epochs); None when the
        training set's size is unknown."""
        return None if self.train_images is None else self.images_before(step) / self.train_images

    def layout(self) -> list[str]:
        """How one global batch is cut: batch, world size, subdivisions, micro-batch."""
        return [
            f"global batch    {self.batch} images per optimizer step",
            f"world size      {self.world}",
            f"subdivisions    {self.subdivisions} micro-batches per device per step",
            f"micro-batch     {self.micro_batch} images (= {self.batch} / ({self.world} x {self.subdivisions}))",
        ]

    def describe(self) -> str:
        lines = self.layout()
        phases_lines = []
        for phase in self.phases:
            epoch = "" if self.train_images is None else f" (epoch {phase.images / self.train_images:.2f})"
            phases_lines.append(f"batch from step {phase.step}{epoch}: "
                                f"{phase.batch} = {self.world} x {phase.batch // (self.world * self.micro_batch)} x "
                                f"{self.micro_batch}")
        if self.base is not None:
            base_epochs = ("unknown epochs" if self.train_images is None else
                           f"{self.steps * self.base / self.train_images:.2f} epochs")
            how = (f"AdaScale at scale {self.batch / self.base:g} = {self.batch} / base batch {self.base}"
                   if self.batch > self.base else f"AdaScale from the base batch {self.base}, doubling up to "
                   f"{self.grow_to} while the measured noise scale is at least twice the batch")
            return "\n".join([*lines, *phases_lines,
                f"adaptive        {how}",
                f"length          {self.steps} base steps of {self.base} images ({base_epochs} at the base "
                "batch): the run ends when its progress, r per step, reaches them",
                f"steps           measured, not planned: at most {self.steps} (r = 1), at least "
                f"{math.ceil(self.steps * self.base / (self.grow_to or self.batch))} (r = scale)",
            ])
        lines += [*phases_lines,
            f"steps           {self.steps}" + (" optimizer steps" if self.phases else ""),
            f"images seen     {self.images}",
            f"epochs          {self.epochs:.2f} (of {self.train_images} training images)" if self.epochs is not None
            else f"epochs          unknown: {EPOCHS_UNKNOWN}",
        ]
        return "\n".join(lines)


EPOCHS_UNKNOWN = "the training set is not at hand to count (set data.train_images to count the epochs without it)"


class EpochsUnknown(UserError):
    """A length counted in epochs, and the training set's size unknown (:func:`epochs_unknown` is its message)."""


def epochs_unknown(key: str) -> str:
    """The message for ``key``, a length counted in epochs, when the training set's size is unknown."""
    return (f"{key}: counted in epochs, but the training set's size is unknown: its data is not at hand; set "
            f"data.train_images (the training set's size), or give {key} in steps")


def require_length(cfg: RunConfig) -> None:
    """A run needs its length: ``steps`` or ``epochs`` (``show`` prints a config without one, as a Darknet ``.cfg``
    without ``max_batches``)."""
    if cfg.steps is None and cfg.epochs is None:
        raise UserError("steps: missing; give steps (optimizer steps) or epochs")


def subdivisions_of(cfg: RunConfig) -> int:
    """``cfg.subdivisions``, resolved: ``auto`` is measured and chosen at the boundary (``engine/preflight.py``'s
    ``resolve_batch``) before any layout is checked, so past it every config holds a number."""
    if not isinstance(cfg.subdivisions, int):
        raise TypeError("subdivisions: auto must be resolved first (engine/preflight.py, resolve_batch)")
    return cfg.subdivisions


def check_batch(cfg: RunConfig, world: int) -> None:
    """The global batch must cut into ``world * subdivisions`` equal micro-batches, and every other batch the run
    may reach (:func:`reachable_batches`: a batch schedule's, a growing adaptive batch's largest) into a whole number
    of those micro-batches on every device. Called once per config, where its layout is settled
    (:func:`batch_layout`)."""
    subdivisions = subdivisions_of(cfg)
    devices = world * subdivisions
    if cfg.batch % devices:
        raise UserError(
            f"batch: {cfg.batch} is not divisible by world size {world} x subdivisions "
            f"{subdivisions} = {devices}; expected a multiple of {devices}"
        )
    unit = cfg.batch // devices * world  # world x micro-batch
    for key, batch in reachable_batches(cfg)[1:]:
        if batch % unit:
            raise UserError(f"{key}: a batch of {batch} is not a whole number of micro-batches of "
                            f"{unit // world} on each of {world} device(s); expected a multiple of {unit} (the "
                            "micro-batch stays what batch and subdivisions make it)")


def reachable_batches(cfg: RunConfig) -> list[tuple[str, int]]:
    """Every global batch a run of ``cfg`` may reach, with the key that sets it: ``batch`` (the first step's), each
    of ``schedule.batch``'s milestones (:func:`scheduled_batches`), and a growing adaptive batch's ``batch.max``.
    Each goes through the checks a fixed batch passes: :func:`check_batch`, :func:`check_image_count` and
    ``telemetry/capacity.py``'s memory."""
    batches = [("batch", cfg.batch), *((f"schedule.batch[{i}]", batch)
                                       for i, batch in enumerate(scheduled_batches(cfg)))]
    if cfg.adaptive is not None and cfg.adaptive.grow:
        batches.append(("batch.max", cfg.adaptive.max))
    return batches


def largest_batch(cfg: RunConfig) -> tuple[str, int]:
    """The largest batch a run of ``cfg`` may reach and the key that sets it (the first of equal ones)."""
    return max(reachable_batches(cfg), key=lambda reached: reached[1])


def check_image_count(cfg: RunConfig, steps: int, length_key: str) -> None:
    """``steps`` optimizer steps at the largest batch the run may reach must count their images in 64 bits (an
    adaptive run's ``steps`` base steps are also the most optimizer steps it takes). The error names the key of that
    batch, or ``length_key`` (``steps``, ``epochs``) when it is ``batch``."""
    key, largest = largest_batch(cfg)
    if steps * largest > INT64_MAX:
        up_to = "" if largest == cfg.batch and cfg.adaptive is None else "up to "
        raise UserError(f"{length_key if key == 'batch' else key}: {steps} steps of {up_to}{largest} images are "
                        f"{steps * largest:.3g} images, more than a 64-bit count holds ({INT64_MAX:.3g})")


def scheduled_batches(cfg: RunConfig) -> list[int]:
    """The global batch from each of ``schedule.batch``'s milestones on: its ``batch``, or its ``factor`` times the
    batch before it, which must make a whole batch."""
    batches, previous = [], cfg.batch
    for i, milestone in enumerate(cfg.schedule.batch):
        if milestone.batch is not None:
            batch = milestone.batch
        else:
            exact = previous * milestone.factor
            if not math.isfinite(exact) or exact > INT64_MAX:
                raise UserError(f"schedule.batch[{i}].factor: {previous} x {milestone.factor:g} is more images than "
                                f"a 64-bit count holds ({INT64_MAX:.3g})")
            batch = round(exact)
            if abs(exact - batch) > 1e-9 * exact or batch <= 0:
                raise UserError(f"schedule.batch[{i}].factor: {previous} x {milestone.factor:g} is not a whole batch")
        batches.append(batch)
        previous = batch
    return batches


def batch_phases(cfg: RunConfig, train_images: int | None) -> tuple[BatchPhase, ...]:
    """``schedule.batch``'s milestones as phases: each starts at the first optimizer step at or after its ``at``
    (steps: that step; epochs and images: the first step whose images start at or past it), with the batch of
    :func:`scheduled_batches` (which :func:`check_batch` checks against the micro-batch)."""
    from bigbatch.config import parse_length

    phases: list[BatchPhase] = []
    previous = BatchPhase(0, 0, cfg.batch)
    for i, (milestone, batch) in enumerate(zip(cfg.schedule.batch, scheduled_batches(cfg), strict=True)):
        number, kind = parse_length(milestone.at)
        if kind == "steps":
            step = math.ceil(number - 1e-9)
        else:
            if kind == "epochs" and train_images is None:
                raise EpochsUnknown(epochs_unknown(f"schedule.batch[{i}].at"))
            images = number * train_images if kind == "epochs" else number
            step = previous.step + max(0, math.ceil((images - previous.images) / previous.batch - 1e-9))
        if step <= previous.step:
            raise UserError(f"schedule.batch[{i}].at: {milestone.at} is not after the previous change of the batch "
                            f"(step {previous.step}); milestones go in order, the first after step 0")
        previous = BatchPhase(step, previous.images + (step - previous.step) * previous.batch, batch)
        phases.append(previous)
    return tuple(phases)


def total_steps(cfg: RunConfig, train_images: int | None, phases: tuple[BatchPhase, ...] | None = None) -> int:
    """The run's optimizer steps: ``steps``, or the steps that take ``epochs * train_images`` images,
    ``ceil(epochs * train_images / batch)`` at a fixed batch (summed over the phases of a batch schedule, ``phases``
    or those of ``schedule.batch``)."""
    require_length(cfg)
    if cfg.steps is not None:
        return cfg.steps
    assert cfg.epochs is not None
    if train_images is None:
        raise EpochsUnknown(epochs_unknown("epochs"))
    if phases is None:
        phases = batch_phases(cfg, train_images)
    wanted = cfg.epochs * train_images
    phase = BatchPhase(0, 0, cfg.batch)
    for later in phases:
        if later.images >= wanted:
            break
        phase = later
    # 1.1 epochs of 1000 at 100: 11, not 12
    return phase.step + math.ceil((wanted - phase.images) / phase.batch - 1e-9)


def make_plan(cfg: RunConfig, layout: BatchLayout | int, train_images: int | None) -> BatchPlan:
    """Turn ``epochs`` into steps (an adaptive batch: into base steps) and place a batch schedule's milestones.
    ``layout``: the batch layout the run's boundary checked (:func:`batch_layout`), or a world size, whose layout is
    checked here. ``train_images`` None: the training set is not at hand (``show``): a length in epochs is one error
    naming its key."""
    if not isinstance(layout, BatchLayout):
        layout = batch_layout(cfg, layout)
    world = layout.world
    require_length(cfg)
    if train_images is not None and train_images <= 0:
        raise UserError(f"data.name: the {cfg.data.name!r} training set is empty")
    if cfg.adaptive is not None:
        return adaptive_plan(cfg, world, train_images)
    phases = batch_phases(cfg, train_images)
    steps = total_steps(cfg, train_images, phases)
    check_image_count(cfg, steps, "steps" if cfg.steps is not None else "epochs")
    for i, phase in enumerate(phases):
        if phase.step >= steps:
            raise UserError(f"schedule.batch[{i}].at: {cfg.schedule.batch[i].at} is at step {phase.step}, past the "
                            f"run's last step ({steps - 1}); the batch would never change")
    return BatchPlan(
        batch=cfg.batch,
        world=world,
        subdivisions=layout.subdivisions,
        steps=steps,
        train_images=train_images,
        phases=phases,
    )


def batch_layout(cfg: RunConfig, world: int) -> BatchLayout:
    """``cfg``'s batch layout on ``world`` processes, checked (:func:`check_batch`)."""
    check_batch(cfg, world)
    return BatchLayout(cfg.batch, world, subdivisions_of(cfg))


def layout_plan(layout: BatchLayout) -> BatchPlan:
    """The plan of a config without a length (``show`` of a Darknet ``.cfg`` without ``max_batches``): how its batch
    is cut, with no steps."""
    return BatchPlan(layout.batch, layout.world, layout.subdivisions, steps=0, train_images=None)


def adaptive_plan(cfg: RunConfig, world: int, train_images: int | None) -> BatchPlan:
    """An adaptive run's plan: its batch (``batch.max``), cut as ``subdivisions`` says, and the base schedule's
    length, ``steps`` or ``ceil(epochs * train_images / base)`` base steps. Each step must measure the gradient noise
    from two micro-batches or more per process (``telemetry/noise_scale.py``)."""
    assert cfg.adaptive is not None
    subdivisions = subdivisions_of(cfg)
    if subdivisions < 2:
        raise UserError(f"subdivisions: batch.mode: adaptive measures the gradient noise from the micro-batches of "
                        f"each step, so it needs 2 or more per process; got {subdivisions} on each of {world} "
                        f"process(es): raise subdivisions")
    base = cfg.adaptive.base  # batch.max: checked with every batch the run may reach (check_batch, make_plan)
    if cfg.steps is not None:
        steps = cfg.steps
    elif cfg.epochs is not None and train_images is not None:
        steps = math.ceil(cfg.epochs * train_images / base - 1e-9)
    else:
        raise EpochsUnknown(epochs_unknown("epochs"))
    check_image_count(cfg, steps, "steps" if cfg.steps is not None else "epochs")
    return BatchPlan(batch=cfg.batch, world=world, subdivisions=subdivisions, steps=steps,
                     train_images=train_images, base=base, grow_to=cfg.adaptive.max if cfg.adaptive.grow else None)
