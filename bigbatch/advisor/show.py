"""``bigbatch show``'s line on the predicted time of the configured run, where a measurement exists: an
``advisor.json`` (``plan --devices --out``) in the folder of the config file shown (a run directory's
``config.yaml``). The step's time at the configured batch, world and micro-batch comes from that measurement and
its link by the advisor's model (``model.predict_step``); the run's time is its steps times that, summed over a
batch schedule's phases; an adaptive batch's is not predicted (its steps are measured during the run)."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

from bigbatch.advisor.links import Link
from bigbatch.advisor.model import StepMeasurement, predict_step
from bigbatch.batching import BatchPlan

ADVISOR_FILE = "advisor.json"
MAX_COUNT = 2**62
"""The most a count in the file (a micro-batch, bytes, layers) may be: within a float's range, so no division by it
overflows."""
WHOLE = {"micro_batch", "data_workers", "gradient_bytes", "bn_layers"}
"""The measurement's counts; its other numbers are seconds, bytes or fractions (floats, an int read as one)."""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_sound(measured: StepMeasurement, link: Link) -> bool:
    """Whether every number the model divides or multiplies by is what ``measure.py`` writes: counts whole and
    within ``MAX_COUNT``, the micro-batch and the link's bandwidth above 0, every other number finite and >= 0
    (``overlap`` and ``bn_collective_s`` may be None: not measured), ``bn_sync`` a bool. A hand-edited or hostile
    file is then one line, never a division by zero or a string multiplied."""
    for field in fields(measured):
        value = getattr(measured, field.name)
        if field.name == "bn_sync":
            ok = isinstance(value, bool)
        elif field.name in WHOLE:
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
        else:
            ok = (value is None and field.name in ("overlap", "bn_collective_s")) or (
                _is_number(value) and 0 <= value <= MAX_COUNT)
        if not ok:
            return False
    return (measured.micro_batch > 0 and _is_number(link.alpha) and _is_number(link.beta) and link.alpha >= 0
            and link.beta > 0)


def phase_steps(plan: BatchPlan) -> list[tuple[int, int]]:
    """(steps, global batch) of each phase of a fixed or scheduled batch that the run reaches, in order: the first
    batch from step 0, each of ``plan.phases`` from its step, to the next phase's step or the run's end."""
    starts = [(0, plan.batch), *((phase.step, phase.batch) for phase in plan.phases)]
    ends = [start for start, _ in starts[1:]] + [plan.steps]
    return [(min(end, plan.steps) - start, batch) for (start, batch), end in zip(starts, ends, strict=True)
            if start < plan.steps]


def predicted_time(config_source: str, plan: BatchPlan) -> str | None:
    """One line, or None where no readable advisor.json lies beside the config file. The run's time is the sum over
    its batch phases of steps x the step the model predicts at that batch (``model.predict_step``: the world and
    micro-batch stay, the micro-batches per step follow the batch); its uncertainty the sum of the phases' (one
    measurement's spread, the same in every step). An adaptive batch's steps (AdaScale's gain) and a growing one's
    batches are measured during the run, so its time is said not to be predicted."""
    from bigbatch.config.adaptive import MAX_ADVISOR_BYTES
    from bigbatch.floor.user_files import read_regular

    file = Path(config_source).parent / ADVISOR_FILE
    unreadable = f"predicted time: {file} is not a readable advisor file (bigbatch plan --devices --out writes one)"
    if not Path(config_source).is_file() or not (file.exists() or file.is_symlink()):
        return None
    try:  # only a regular file, only within the bound: a FIFO or a link to /dev/zero is never read
        data = json.loads(read_regular(file, MAX_ADVISOR_BYTES, "an advisor file"))
        measured = StepMeasurement(**data["measurement"]["step"])
        link = Link(**data["link"])
        device = str(data["measurement"]["device"])
    except (ValueError, KeyError, TypeError, OSError, RecursionError):
        return unreadable
    if not is_sound(measured, link):
        return unreadable
    source = f"({file}: measured on {device}, link {link.name})"
    if plan.base is not None:
        grows = "and batches " if plan.grow_to is not None else ""
        return (f"predicted time  not predicted for an adaptive batch: its steps {grows}are measured during the run "
                f"(AdaScale's gain), not planned {source}")
    phases = phase_steps(plan)
    if any(batch % (plan.world * plan.micro_batch) for _, batch in phases):
        return None
    predicted = [(steps, batch, predict_step(measured, batch, plan.world, plan.micro_batch, link))
                 for steps, batch in phases]
    total = sum(steps * p.step for steps, _, p in predicted)
    total_sd = sum(steps * p.step_sd for steps, _, p in predicted)
    if not (all(p.step > 0 for _, _, p in predicted) and math.isfinite(total) and math.isfinite(total_sd)):
        return unreadable  # e.g. every time measured as 0
    when = f"{total / 3600:.2f} h" if total >= 3600 else f"{total / 60:.1f} min" if total >= 60 else f"{total:.1f} s"
    steps = ", then ".join(f"{n} steps of {p.step:.3g} s at batch {batch}" for n, batch, p in predicted)
    return f"predicted time  {when} +/- {100 * total_sd / total:.0f} %: {steps} on {plan.world} device(s) {source}"
