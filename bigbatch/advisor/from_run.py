"""What a finished run says about the steps to a target (``bigbatch plan --from RUN --target-loss L``): the steps it
took to first reach L at its batch, and the gradient noise scale it measured there; S_min follows
(``model.s_min_from_run``).

The run must have taken its steps at one batch: a run whose batch changes (``batch: {mode: adaptive}``, a
``schedule.batch``) is refused, since S(B) = S_min (1 + B_noise / B) holds at a fixed B, and counting the steps of a
grown batch as steps of the first understates S_min: 2.6x for a run at 4x its first batch from step 20 of
150, with B_noise 300.

The loss is the validation loss of the run's evaluations where they have one (``split: val``, ``loss``), else the
training loss of its training records. B_noise is the run's ``noise_scale`` (the smoothed B_simple of
``log.noise_scale``) in its last training record at or before that step: the noise scale near the target, where
McCandlish et al.'s S(B) takes it (docs/recipe.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from bigbatch.errors import UserError
from bigbatch.floor import run_files


@dataclass(frozen=True)
class Reached:
    steps: int
    batch: int
    loss_kind: str
    """``validation`` or ``training``."""
    noise_scale: float | None


MAX_LINE = 1 << 20
"""The longest ``metrics.jsonl`` line read (a record is a few hundred bytes); a longer one is skipped unread."""


def _records(path: Path) -> Iterator[dict]:
    """The step records of ``metrics.jsonl``, one at a time, each line read only up to :data:`MAX_LINE` bytes: the
    file is never held, so its size costs time, not memory."""
    with path.open("rb") as f:
        while line := f.readline(MAX_LINE + 1):
            if len(line) > MAX_LINE:  # skip the rest of an overlong line, unread
                while (rest := f.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                    pass
                continue
            try:
                record = json.loads(line.decode("utf-8", errors="replace"))
            except (ValueError, RecursionError):  # a line cut by a killed run; nested too deeply
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                yield record


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def reached(run: Path, target: float) -> Reached:
    """The first step of ``run`` at which its loss was at most ``target`` (``UserError`` naming ``--from`` or
    ``--target-loss`` where the run has no such record)."""
    from bigbatch.config.loading import MAX_CONFIG_BYTES, load_yaml, read_config_bytes
    from bigbatch.engine.run_dir import run_file

    # each read only from inside the run and from a regular file (a link out of it, a FIFO: one error line)
    metrics, config = run_file(run, run_files.METRICS, "--from"), run_file(run, run_files.CONFIG, "--from")
    if metrics is None or config is None:
        raise UserError(f"--from: {run} is not a bigbatch run directory (it needs config.yaml and metrics.jsonl)")
    try:
        # bigbatch's loader, as for any config
        settings = load_yaml(read_config_bytes(config, MAX_CONFIG_BYTES).decode("utf-8"))
    except OSError as error:
        raise UserError(f"--from: {config}: {error}") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"--from: {config} is not a config bigbatch reads ({first})") from None
    batch = settings.get("batch") if isinstance(settings, dict) else None
    if not isinstance(batch, int) or batch < 1:
        raise UserError(f"--from: {config} has no fixed global batch (an adaptive batch has no one batch its "
                        "steps were taken at)")
    schedule = settings.get("schedule") if isinstance(settings, dict) else None
    if isinstance(schedule, dict) and schedule.get("batch"):
        raise UserError(f"--from: {config} has no fixed global batch (its schedule.batch changes the batch during "
                        "the run: its steps were not all taken at one batch)")
    # first pass: of each kind of loss, the first step at or under the target and the lowest loss
    first: dict[str, int | None] = {"validation": None, "training": None}
    lowest: dict[str, float | None] = {"validation": None, "training": None}
    for r in _records(metrics):
        kind = "validation" if r.get("split") == "val" else "training" if "lr" in r and "split" not in r else None
        loss = _number(r.get("loss"))
        if kind is None or loss is None:
            continue
        low = lowest[kind]
        lowest[kind] = loss if low is None else min(low, loss)
        if first[kind] is None and loss <= target:
            first[kind] = r["step"]
    kind = "validation" if lowest["validation"] is not None else "training"
    hit, low = first[kind], lowest[kind]
    if low is None:
        raise UserError(f"--from: {metrics} holds no loss")
    if hit is None:
        raise UserError(f"--target-loss: {run} never reached a {kind} loss of {target:g} (its lowest: {low:.4g})")
    # second pass, the step known: the last noise scale at or before it, in the file's order
    noise = None
    for r in _records(metrics):
        value = _number(r.get("noise_scale")) if "split" not in r and r["step"] <= hit else None
        if value is not None and value > 0:
            noise = value
    return Reached(hit, batch, kind, noise)
