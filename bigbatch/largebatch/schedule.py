"""The learning rate as a pure function of the optimizer step: ``lr(step)``, step counted from 0.

Scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): ``optim.lr`` is stated for
``optim.ref_batch`` images per step; for the global batch B:

    linear: lr_B = lr * B / ref_batch        sqrt: lr_B = lr * sqrt(B / ref_batch)

The composed schedule (``schedule.preset: none``):

    lr(t) = lr_B * warmup(t) * decay(t)      decay(t) floored at min_lr / lr_B (or min_lr_ratio)

- warmup(t): phases in sequence from step 0 (``linear``: f0 + (1 - f0) * (t - s) / L;
  ``constant``: a fixed factor, the Inception guide's cold epochs; ``power``: Darknet's burn_in,
  ((t - s + 1) / L) ** p), then 1;
- decay(t) at absolute step t: ``constant`` 1; ``step`` gamma ** floor(t / every); ``multistep``
  the product of the scales of the milestones passed; ``exponential`` gamma ** (t / every)
  (floored exponent when staircase); ``cosine`` and ``poly`` anneal from 1 at ``start`` (default:
  the end of the warmup) to the floor at ``end`` (default: the end of the run), as
  torch's CosineAnnealingLR with eta_min; ``sigmoid`` 1 / (1 + exp(gamma * (t - center))).

Presets reproduce their sources' own code, quirks included: ``inception_tpu`` (tensorflow/tpu ``inception_v3.py``) and
``darknet`` (pjreddie/darknet ``src/network.c``, ``get_current_rate``); docs/references.md.
Every length may be given in steps, epochs or images and is converted through the batch plan.

Each preset registers itself in ``SCHEDULES`` (obj(cfg, plan) -> lr) and each decay kind in ``DECAYS``
(obj(decay_cfg, plan, start, floor) -> factor; ``check`` names a field the kind needs, ``rates`` a field that is a
per-step rate); ``build_schedule`` looks the preset up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from bigbatch.batching import BatchPlan
from bigbatch.config import (
    SLOPE,
    DarknetScheduleConfig,
    DecayConfig,
    InceptionTPUConfig,
    OptimConfig,
    RunConfig,
    WarmupPhase,
    parse_length,
)
from bigbatch.errors import UserError
from bigbatch.registry import DECAYS, SCHEDULES

Schedule = Callable[[int], float]


def scaled_lr(optim: OptimConfig, batch: int) -> float:
    """The LR for a global batch of ``batch`` images from ``optim.lr`` stated at ``optim.ref_batch``."""
    if optim.ref_batch is None or optim.scaling == "none":
        return optim.lr
    ratio = batch / optim.ref_batch
    return optim.lr * (ratio if optim.scaling == "linear" else math.sqrt(ratio))


def length_in_steps(length: int | float | str, plan: BatchPlan, key: str = "a length") -> float:
    """Steps from a length in steps, epochs (x train images / batch) or images (/ batch); under a batch schedule,
    the steps that take that many images (``BatchPlan.steps_for_images``). ``key`` names the length in the error
    when epochs cannot be counted (the training set not at hand)."""
    number, unit = parse_length(length)
    if unit == "steps":
        return number
    if unit == "epochs":
        return plan.steps_for_images(number * plan.images_per_epoch(key))
    return plan.steps_for_images(number)


def periods_of(every: int | float | str, plan: BatchPlan, key: str = "a length") -> Callable[[int], float]:
    """t -> the periods of length ``every`` before step t: t / every in steps; under a batch schedule, an ``every``
    in epochs or images counts the images the steps before t took."""
    number, unit = parse_length(every)
    if plan.phases and unit != "steps":
        images = number * plan.images_per_epoch(key) if unit == "epochs" else number
        return lambda t: plan.images_before(t) / images
    steps = length_in_steps(every, plan, key)
    return lambda t: t / steps


def written_for(cfg: RunConfig, plan: BatchPlan) -> tuple[RunConfig, BatchPlan]:
    """The config and plan the LR schedule counts its steps in: the run's own; an adaptive run's, the base recipe's
    (batch ``base``, its ``steps`` base steps: ``largebatch/adascale.py``), which AdaScale advances by r a step."""
    if plan.base is None:
        return cfg, plan
    return cfg.model_copy(update={"batch": plan.base}), plan.base_plan()


def build_schedule(cfg: RunConfig, plan: BatchPlan) -> Schedule:
    """lr(step) of the preset ``schedule.preset`` (as registered in ``SCHEDULES``) for the batch plan; the LR is
    that of the first batch throughout a batch schedule (``check_batch_milestones``). An adaptive run's: the base
    recipe's, lr(base step) at the base batch, which AdaScale multiplies by its gain."""
    if plan.phases and cfg.schedule.preset == "inception_tpu":
        raise UserError("schedule.batch: the inception_tpu preset counts its decay in steps of one batch; give the "
                        "schedule as schedule.warmup and schedule.decay to grow the batch")
    cfg, plan = written_for(cfg, plan)
    lr = SCHEDULES.get(cfg.schedule.preset).obj(cfg, plan)
    check_finite(plan, lr)
    if not cfg.schedule.decay_at_batch_milestones:
        check_batch_milestones(plan, lr)
    return lr


def check_finite(plan: BatchPlan, lr: Schedule) -> None:
    """Refuse a schedule whose LR overflows within the run: a ``gamma`` above 1 grows it without bound (``exponential``,
    ``step``, Darknet's ``exp`` and ``step`` policies), which once stopped ``train`` mid-run (or ``schedule`` at once)
    in Python's ``OverflowError``. A growing factor is largest at the run's last step, so that step is asked."""
    for step in {0, max(plan.steps - 1, 0)}:
        try:
            value = lr(step)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise UserError(f"schedule: the learning rate at step {step} is past the largest float (a factor above "
                            "1, such as gamma > 1, raised to the step); give a factor of at most 1, or fewer steps")


STEP_DOWN = 0.99
"""An LR that falls by more than 1 % in one step, after a step where it did not and before one where it does not
(or the run's end), steps down there; a smooth decay falls in the steps around too."""


def check_batch_milestones(plan: BatchPlan, lr: Schedule) -> None:
    """Refuse an LR that steps down within a step of a change of the batch (``schedule.batch``): the schedule of
    Smith et al. grows the batch *instead of* decaying the LR, so both at once is taken for a recipe's decay left
    in by mistake (``schedule.decay_at_batch_milestones: true`` says it is meant). A smooth decay (cosine, poly)
    falls every step and is not a step down (:data:`STEP_DOWN`)."""

    def ratio(step: int) -> float:
        before = lr(step - 1) if 1 <= step < plan.steps else 0.0
        return lr(step) / before if before > 0 else 1.0

    for i, phase in enumerate(plan.phases):
        for step in range(max(1, phase.step - 1), min(plan.steps, phase.step + 2)):
            if ratio(step) < STEP_DOWN and ratio(step - 1) >= STEP_DOWN and ratio(step + 1) >= STEP_DOWN:
                raise UserError(f"schedule.batch[{i}]: the LR also steps down at step {step} ({lr(step - 1):.4g} -> "
                                f"{lr(step):.4g}) where the batch grows to {phase.batch}; growing the batch replaces "
                                "that decay: remove it, or set schedule.decay_at_batch_milestones: true")


NEGLIGIBLE_LR = 0.01
"""A run whose largest LR is under this fraction of the LR its warmup ends at barely trains: it is said at the start."""


def warmup_note(cfg: RunConfig, plan: BatchPlan, start: int = 0) -> str | None:
    """When the warmup outlasts the run (from step ``start``) so that the LR never reaches ``NEGLIGIBLE_LR`` of the
    LR it warms up to (a short trial of a Darknet cfg with ``burn_in=1000``: ``lr * (10 / 1000) ** 4``), one line
    that says so, with the numbers; else None. A warmup only rises, so the run's largest LR is its last step's."""
    if plan.base is not None or plan.steps <= start:
        return None
    end = warmup_steps(cfg, plan)
    if end < plan.steps:
        return None
    lr = build_schedule(cfg, plan)
    largest, warmed = lr(plan.steps - 1), lr(end)
    if warmed <= 0 or largest >= NEGLIGIBLE_LR * warmed:
        return None
    key = "schedule.darknet.burn_in" if cfg.schedule.preset == "darknet" else (
        "schedule.warmup" if cfg.schedule.preset == "none" else f"schedule.{cfg.schedule.preset}")
    return (f"note: the warmup ends at step {end}, after this run's {plan.steps} steps: the LR stays at most "
            f"{largest:.3g}, {largest / warmed:.2g} x the {warmed:.3g} it warms up to, so the weights barely move; "
            f"shorten it ({key}) for a short trial")


def warmup_steps(cfg: RunConfig, plan: BatchPlan) -> int:
    """The optimizer steps before the schedule's warmup ends (rounded up): what the preset registered as its
    ``warmup_steps(cfg, plan)`` (``schedule.warmup``'s phases; the Inception guide's cold and warmup epochs;
    Darknet's ``burn_in``)."""
    steps = SCHEDULES.get(cfg.schedule.preset).info.get("warmup_steps")
    if steps is None:
        raise UserError(f"schedule.preset: {cfg.schedule.preset!r} does not say where its warmup ends (register it "
                        "with warmup_steps=...)")
    return math.ceil(steps(cfg, plan) - 1e-9)


def _phases_steps(cfg: RunConfig, plan: BatchPlan) -> float:
    return sum(max(0.0, length_in_steps(phase.length, plan, f"schedule.warmup[{i}].length"))
               for i, phase in enumerate(cfg.schedule.warmup))


def _inception_warmup_steps(cfg: RunConfig, plan: BatchPlan) -> float:
    p = cfg.schedule.inception_tpu
    return (p.warmup_epochs + p.cold_epochs) * p.num_train_images / plan.batch if p.warmup else 0.0


@SCHEDULES.register("none", warmup_steps=_phases_steps)
def composed(cfg: RunConfig, plan: BatchPlan) -> Schedule:
    """lr(t) = lr_B * warmup(t) * max(decay(t), floor): ``schedule.warmup``, then the ``schedule.decay`` kind."""
    base = scaled_lr(cfg.optim, plan.batch)
    sched = cfg.schedule
    warmup, warmup_end = _warmup(sched.warmup, base, plan)
    if sched.min_lr is not None:
        if sched.min_lr > base:
            raise UserError(f"schedule.min_lr: {sched.min_lr} is above the LR for the global batch ({base:g}); "
                            "expected a floor below it")
        floor = sched.min_lr / base
    else:
        floor = sched.min_lr_ratio or 0.0
    decay = DECAYS.get(sched.decay.kind).obj(sched.decay, plan, warmup_end, floor)

    def lr(step: int) -> float:
        return base * warmup(step) * max(decay(step), floor)

    return lr


# ----------------------------------------------------------------------------- warmup


def _warmup(phases: list[WarmupPhase], base: float, plan: BatchPlan) -> tuple[Callable[[float], float], float]:
    """The warmup factor as a function of the step, and the step where warmup ends."""
    pieces: list[tuple[float, float, Callable[[float], float]]] = []  # (start, length, factor of t - start)
    start, previous_end_factor = 0.0, 0.0
    for i, phase in enumerate(phases):
        length = length_in_steps(phase.length, plan, f"schedule.warmup[{i}].length")
        if length <= 0:
            continue
        if phase.kind == "linear":
            if phase.start_lr is not None:
                f0 = phase.start_lr / base
            elif phase.start_factor is not None:
                f0 = phase.start_factor
            else:
                f0 = previous_end_factor
            pieces.append((start, length, lambda u, f0=f0, n=length: f0 + (1.0 - f0) * u / n))
            previous_end_factor = 1.0
        elif phase.kind == "constant":
            pieces.append((start, length, lambda u, f=phase.factor: f))
            previous_end_factor = phase.factor
        else:  # power: Darknet's burn_in counts the update being made from 1, (batch_num / burn_in) ** power < 1;
            # a length of no whole number of steps (epochs, images) leaves a last step with u + 1 > n: held at 1
            pieces.append((start, length, lambda u, n=length, p=phase.power: min((u + 1) / n, 1.0) ** p))
            previous_end_factor = 1.0
        start += length

    def factor(step: float) -> float:
        for phase_start, length, fn in pieces:
            if step < phase_start + length:
                return fn(step - phase_start)
        return 1.0

    return factor, start


# ----------------------------------------------------------------------------- decay


def _required(key: str) -> Callable[[DecayConfig], None]:
    """A decay kind's check that ``schedule.decay.<key>`` is given."""

    def check(cfg: DecayConfig) -> None:
        if getattr(cfg, key) in (None, []):
            raise ValueError(f"schedule.decay.{key}: required for decay kind {cfg.kind!r}")

    return check


@DECAYS.register("constant")
def _constant(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    return lambda t: 1.0


@DECAYS.register("step", check=_required("every"))
def _step(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    """gamma ** floor(t / every)."""
    periods = periods_of(cfg.every, plan, "schedule.decay.every")
    return lambda t: cfg.gamma ** math.floor(periods(t))


def _milestones_and_scales(cfg: DecayConfig) -> None:
    _required("milestones")(cfg)
    if cfg.scales is not None and len(cfg.scales) != len(cfg.milestones):
        raise ValueError("schedule.decay.scales: expected one scale per milestone")


@DECAYS.register("multistep", check=_milestones_and_scales)
def _multistep(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    """The product of the scales (default ``gamma``) of the milestones passed."""
    milestones = [length_in_steps(m, plan, f"schedule.decay.milestones[{i}]") for i, m in enumerate(cfg.milestones)]
    scales = cfg.scales if cfg.scales is not None else [cfg.gamma] * len(milestones)
    return lambda t: math.prod(s for m, s in zip(milestones, scales, strict=True) if t >= m)


@DECAYS.register("exponential", check=_required("every"))
def _exponential(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    """gamma ** (t / every), the exponent floored when ``staircase``."""
    periods = periods_of(cfg.every, plan, "schedule.decay.every")
    if cfg.staircase:
        return lambda t: cfg.gamma ** math.floor(periods(t))
    return lambda t: cfg.gamma ** periods(t)


def _progress(cfg: DecayConfig, plan: BatchPlan, start: float) -> Callable[[int], float]:
    """How far step t is from ``start`` (default: the end of the warmup) to ``end`` (default: the run's end), in
    [0, 1]."""
    begin = length_in_steps(cfg.start, plan, "schedule.decay.start") if cfg.start is not None else start
    end = length_in_steps(cfg.end, plan, "schedule.decay.end") if cfg.end is not None else float(plan.steps)
    span = max(end - begin, 1e-12)
    return lambda t: min(max((t - begin) / span, 0.0), 1.0)


@DECAYS.register("cosine")
def _cosine(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    """floor + (1 - floor) * (1 + cos(pi * progress)) / 2, as torch's CosineAnnealingLR with eta_min."""
    progress = _progress(cfg, plan, start)
    return lambda t: floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress(t)))


@DECAYS.register("poly")
def _poly(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    """floor + (1 - floor) * (1 - progress) ** power."""
    progress = _progress(cfg, plan, start)
    return lambda t: floor + (1.0 - floor) * (1.0 - progress(t)) ** cfg.power


@DECAYS.register("sigmoid", check=_required("center"), rates={"gamma": SLOPE})
def _sigmoid(cfg: DecayConfig, plan: BatchPlan, start: float, floor: float) -> Callable[[int], float]:
    """1 / (1 + exp(gamma * (t - center))), Darknet's ``sig`` policy."""
    center = length_in_steps(cfg.center, plan, "schedule.decay.center")
    return lambda t: logistic_falling(cfg.gamma * (t - center))


def logistic_falling(z: float) -> float:
    """1 / (1 + exp(z)), evaluated without overflow: for z > 0 as exp(-z) / (1 + exp(-z)). Where exp(z) passes
    float's range (z > 709.78) Python raises ``OverflowError``, a crash mid-run, while Darknet's C ``exp`` gives inf
    and the rate 0; this gives that 0 (or the smallest float), and 1 far on the other side."""
    if z > 0:
        small = math.exp(-z)
        return small / (1.0 + small)
    return 1.0 / (1.0 + math.exp(z))


# ----------------------------------------------------------------------------- presets


@SCHEDULES.register("inception_tpu", warmup_steps=_inception_warmup_steps)
def _inception_tpu_preset(cfg: RunConfig, plan: BatchPlan) -> Schedule:
    return inception_tpu(scaled_lr(cfg.optim, plan.batch), plan.batch, cfg.schedule.inception_tpu)


@SCHEDULES.register("darknet", burn_in=lambda schedule: schedule.darknet.burn_in,
                    warmup_steps=lambda cfg, plan: cfg.schedule.darknet.burn_in)
def _darknet_preset(cfg: RunConfig, plan: BatchPlan) -> Schedule:
    return darknet(scaled_lr(cfg.optim, plan.batch), cfg.schedule.darknet, plan.steps)


def inception_tpu(initial: float, batch: int, p: InceptionTPUConfig) -> Schedule:
    """The learning-rate code of the Inception v3 TPU guide ("Adaptation du taux d'apprentissage").

    ``initial`` is lr * batch / 256 (the caller's linear scaling from ref_batch 256). As that code:
      batches_per_epoch = N / batch; epoch = int(float32(step) / float32(batches_per_epoch));
      lr = initial * decay_rate ** floor(step / int(decay_epochs * batches_per_epoch))  (staircase);
      with warmup: adj = initial * decay_rate ** ((warmup_epochs + cold_epochs) / decay_epochs),
        epochs < cold: 0.1 * adj;
        cold <= epoch < warmup + cold + decay_epochs:
          0.1 * adj + (epoch - int(cold - 1)) * 0.9 * adj / (warmup_epochs + decay_epochs - 1);
      finally max(lr, final_ratio * initial).
    Quirks kept: the ramp runs decay_epochs past the warmup and slightly overshoots adj; the
    decay is of ``initial``, not of ``adj``; the epoch is truncated in float32.
    """
    batches_per_epoch = p.num_train_images / batch
    decay_steps = max(1, int(p.decay_epochs * batches_per_epoch))
    final = p.final_ratio * initial
    adj = initial * p.decay_rate ** ((p.warmup_epochs + p.cold_epochs) / p.decay_epochs)
    wlr = 0.1 * adj
    wlr_height = np.float32(0.9 * adj / (p.warmup_epochs + p.decay_epochs - 1))
    epoch_offset = int(p.cold_epochs - 1)
    exp_decay_start = p.warmup_epochs + p.cold_epochs + p.decay_epochs

    def lr(step: int) -> float:
        epoch = int(np.float32(step) / np.float32(batches_per_epoch))
        rate = initial * p.decay_rate ** (step // decay_steps)
        if p.warmup:
            if epoch < p.cold_epochs:
                rate = wlr
            elif epoch < exp_decay_start:
                rate = wlr + float(np.float32(epoch - epoch_offset) * wlr_height)
        return max(rate, final)

    return lr


def darknet(learning_rate: float, p: DarknetScheduleConfig, total_steps: int) -> Schedule:
    """Darknet's ``get_current_rate`` (src/network.c), burn_in then the policy.

    Darknet updates after ``seen`` has counted the step's images, so the k-th update (k from 1)
    uses batch_num = k: for our 0-based step, batch_num = step + 1.
      batch_num < burn_in: lr * (batch_num / burn_in) ** power
      constant: lr;  step: lr * scale ** (batch_num // step);  exp: lr * gamma ** batch_num
      steps: lr times every scales[i] with steps[i] <= batch_num
      poly: lr * (1 - batch_num / max_batches) ** power;  sig: lr / (1 + exp(gamma * (batch_num - step)))
      sgdr (AlexeyAB's): cosine cycles, the first sgdr_cycle steps long, each sgdr_mult times the one before;
        a cycle starting at s of length c: lr_min + (lr - lr_min) (1 + cos(pi (batch_num - s) / c)) / 2, where a
        new cycle starts once s + c < batch_num (so a cycle's last step is its LR's minimum)
    """
    max_batches = p.max_batches or total_steps
    first_cycle = p.sgdr_cycle or max_batches

    def sgdr_cycle_start(batch_num: int) -> tuple[int, int]:
        """(start, length) of the cycle of ``batch_num``: AlexeyAB's loop, in closed form for sgdr_mult 1."""
        start, length = 0, first_cycle
        if p.sgdr_mult == 1:
            cycles = max(0, -(-batch_num // length) - 1)  # the k with k * length < batch_num <= (k + 1) * length
            return cycles * length, length
        while start + length < batch_num:  # lengths grow geometrically: at most 63 turns for 64-bit steps
            start += length
            length *= p.sgdr_mult
        return start, length

    def lr(step: int) -> float:
        batch_num = step + 1
        if batch_num < p.burn_in:
            return learning_rate * (batch_num / p.burn_in) ** p.power
        if p.policy == "constant":
            return learning_rate
        if p.policy == "step":
            return learning_rate * p.scale ** (batch_num // p.step)
        if p.policy == "steps":
            rate = learning_rate
            for boundary, scale in zip(p.steps, p.scales, strict=True):
                if boundary > batch_num:
                    break
                rate *= scale
            return rate
        if p.policy == "exp":
            return learning_rate * p.gamma**batch_num
        if p.policy == "poly":
            return learning_rate * max(1.0 - batch_num / max_batches, 0.0) ** p.power
        if p.policy == "sgdr":
            start, length = sgdr_cycle_start(batch_num)
            return p.learning_rate_min + 0.5 * (learning_rate - p.learning_rate_min) * (
                1.0 + math.cos(math.pi * (batch_num - start) / length))
        return learning_rate * logistic_falling(p.gamma * (batch_num - p.step))  # sig

    return lr
