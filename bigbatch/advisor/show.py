"""``bigbatch show``'s line on the predicted time of the configured run, where a measurement exists: an
``advisor.json`` (``plan --devices --out``) in the folder of the config file shown (a run directory's
``config.yaml``). The step's time at the configured batch, world and micro-batch comes from that measurement and
its link by the advisor's model (``model.predict_step``); the run's time is its steps times that."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

from bigbatch.advisor.links import Link
from bigbatch.advisor.model import StepMeasurement, predict_step

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


def predicted_time(config_source: str, batch: int, world: int, micro_batch: int, steps: int) -> str | None:
    """One line, or None where no readable advisor.json lies beside the config file."""
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
    if batch % (world * micro_batch):
        return None
    p = predict_step(measured, batch, world, micro_batch, link)
    total = steps * p.step
    if not (p.step > 0 and math.isfinite(total) and math.isfinite(p.step_sd)):  # e.g. every time measured as 0
        return unreadable
    when = f"{total / 3600:.2f} h" if total >= 3600 else f"{total / 60:.1f} min" if total >= 60 else f"{total:.1f} s"
    return (f"predicted time  {when} +/- {100 * p.step_sd / p.step:.0f} %: {steps} steps of {p.step:.3g} s at batch "
            f"{batch} on {world} device(s) ({file}: measured on {device}, link {link.name})")
