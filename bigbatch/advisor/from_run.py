"""What a finished run says about the steps to a target (``bigbatch plan --from RUN --target-loss L``): the steps it
took to first reach L at its batch, and the gradient noise scale it measured there; S_min follows
(``model.s_min_from_run``).

The loss is the validation loss of the run's evaluations where they have one (``split: val``, ``loss``), else the
training loss of its training records. B_noise is the run's ``noise_scale`` (the smoothed B_simple of
``log.noise_scale``) in its last training record at or before that step: the noise scale near the target, where
McCandlish et al.'s S(B) takes it (docs/recipe.md).
"""

from __future__ import annotations

import json
import math
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


def _records(path: Path) -> list[dict]:
    records = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by a killed run
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
    return records


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def reached(run: Path, target: float) -> Reached:
    """The first step of ``run`` at which its loss was at most ``target`` (``UserError`` naming ``--from`` or
    ``--target-loss`` where the run has no such record)."""
    metrics, config = run / run_files.METRICS, run / run_files.CONFIG
    if not metrics.is_file() or not config.is_file():
        raise UserError(f"--from: {run} is not a bigbatch run directory (it needs config.yaml and metrics.jsonl)")
    try:
        batch = yaml.safe_load(config.read_text(encoding="utf-8")).get("batch")
    except (yaml.YAMLError, AttributeError, UnicodeDecodeError):
        batch = None
    if not isinstance(batch, int) or batch < 1:
        raise UserError(f"--from: {config} has no fixed global batch (an adaptive batch has no one batch its "
                        "steps were taken at)")
    records = _records(metrics)
    evals = [(r["step"], _number(r.get("loss"))) for r in records if r.get("split") == "val"]
    evals = [(s, v) for s, v in evals if v is not None]
    trains = [(r["step"], _number(r.get("loss"))) for r in records if "lr" in r and "split" not in r]
    trains = [(s, v) for s, v in trains if v is not None]
    points, kind = (evals, "validation") if evals else (trains, "training")
    if not points:
        raise UserError(f"--from: {metrics} holds no loss")
    hit = next((s for s, v in points if v <= target), None)
    if hit is None:
        lowest = min(v for _, v in points)
        raise UserError(f"--target-loss: {run} never reached a {kind} loss of {target:g} (its lowest: {lowest:.4g})")
    noise = [(r["step"], _number(r.get("noise_scale"))) for r in records if "noise_scale" in r and "split" not in r]
    before = [v for s, v in noise if s <= hit and v is not None and v > 0]
    return Reached(hit, batch, kind, before[-1] if before else None)
