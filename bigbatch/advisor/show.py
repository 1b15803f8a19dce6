"""``bigbatch show``'s line on the predicted time of the configured run, where a measurement exists: an
``advisor.json`` (``plan --devices --out``) in the folder of the config file shown (a run directory's
``config.yaml``). The step's time at the configured batch, world and micro-batch comes from that measurement and
its link by the advisor's model (``model.predict_step``); the run's time is its steps times that."""

from __future__ import annotations

import json
from pathlib import Path

from bigbatch.advisor.links import Link
from bigbatch.advisor.model import StepMeasurement, predict_step

ADVISOR_FILE = "advisor.json"


def predicted_time(config_source: str, batch: int, world: int, micro_batch: int, steps: int) -> str | None:
    """One line, or None where no readable advisor.json lies beside the config file."""
    from bigbatch.config.adaptive import MAX_ADVISOR_BYTES
    from bigbatch.floor.user_files import read_regular

    file = Path(config_source).parent / ADVISOR_FILE
    if not Path(config_source).is_file() or not (file.exists() or file.is_symlink()):
        return None
    try:  # only a regular file, only within the bound: a FIFO or a link to /dev/zero is never read
        data = json.loads(read_regular(file, MAX_ADVISOR_BYTES, "an advisor file"))
        measured = StepMeasurement(**data["measurement"]["step"])
        link = Link(**data["link"])
        device = str(data["measurement"]["device"])
    except (ValueError, KeyError, TypeError, OSError, RecursionError):
        return f"predicted time: {file} is not a readable advisor file (bigbatch plan --devices --out writes one)"
    if batch % (world * micro_batch):
        return None
    p = predict_step(measured, batch, world, micro_batch, link)
    total = steps * p.step
    when = f"{total / 3600:.2f} h" if total >= 3600 else f"{total / 60:.1f} min" if total >= 60 else f"{total:.1f} s"
    return (f"predicted time  {when} +/- {100 * p.step_sd / p.step:.0f} %: {steps} steps of {p.step:.3g} s at batch "
            f"{batch} on {world} device(s) ({file}: measured on {device}, link {link.name})")
