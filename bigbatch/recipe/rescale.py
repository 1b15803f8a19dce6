"""Rescale a recipe to a new global batch, keeping what the seeds say should stay constant.

From batch B to batch B' (ratio r = B' / B):

- the LR follows ``optim.scaling`` from ``optim.ref_batch`` (set to B when it was unset, so the
  LR stated for B is scaled rather than reused);
- lengths stay constant in images: every length given in steps (warmup phases, decay points,
  ``steps``, ``eval.every``, ``checkpoint.every``, ``clip.start_step``, Darknet's burn_in, steps,
  step and max_batches) is multiplied by 1 / r; a length that is no longer a whole number of
  steps is written in images (``"12800 images"``), an integer-only field is rounded;
- per-step rates keep their effect per image: Darknet's ``exp`` gamma' = gamma ** r, the sigmoid
  slopes gamma' = gamma * r;
- the EMA keeps its half-life in images: decay' = decay ** r;
- the BatchNorm momentum per step likewise: (1 - m') = (1 - m) ** r;
- the micro-batch stays the same where it can (subdivisions' = B' / (world x micro-batch)),
  so memory does not change.
Lengths in epochs or images, and ``norm.half_life_images``, need no change.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from bigbatch.config import RunConfig, parse_length, validate_config
from bigbatch.recipe.schedule import scaled_lr

Change = tuple[str, Any, Any]


def _whole(x: float) -> bool:
    return abs(x - round(x)) < 1e-9 * max(1.0, abs(x))


def scale_length(value: Any, old_batch: int, new_batch: int) -> Any:
    """A length in steps scaled to keep its images; other units unchanged."""
    number, unit = parse_length(value)
    if unit != "steps":
        return value
    steps = number * old_batch / new_batch
    if _whole(steps):
        return int(round(steps))
    return f"{number * old_batch:g} images"


def rescale(cfg: RunConfig, new_batch: int, world: int = 1) -> tuple[RunConfig, list[Change]]:
    """The recipe for ``new_batch`` and the list of (key, before, after) it changed."""
    old_batch = cfg.batch
    ratio = new_batch / old_batch
    data = cfg.model_dump(mode="json")
    new = copy.deepcopy(data)
    changes: list[Change] = []

    def put(path: str, value: Any) -> None:
        node = new
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        before = node[int(last)] if isinstance(node, list) else node[last]
        if before != value:
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
            changes.append((path, before, value))

    def length(path: str, value: Any) -> None:
        if value is not None:
            put(path, scale_length(value, old_batch, new_batch))

    def count(path: str, value: int | None, minimum: int = 0) -> None:
        if value is not None:
            put(path, max(minimum, int(round(value * old_batch / new_batch))))

    put("batch", new_batch)
    micro = old_batch // (world * cfg.subdivisions)
    if new_batch % (world * micro) == 0:
        put("subdivisions", new_batch // (world * micro))
    if cfg.optim.ref_batch is None and cfg.optim.scaling != "none":
        put("optim.ref_batch", old_batch)
    if cfg.steps is not None:
        put("steps", max(1, math.ceil(cfg.steps * old_batch / new_batch - 1e-9)))
    length("eval.every", cfg.eval.every)
    length("checkpoint.every", cfg.checkpoint.every)
    count("clip.start_step", cfg.clip.start_step)
    sched = cfg.schedule
    for i, phase in enumerate(sched.warmup):
        length(f"schedule.warmup.{i}.length", phase.length)
    for key in ("every", "center", "start", "end"):
        length(f"schedule.decay.{key}", getattr(sched.decay, key))
    for i, milestone in enumerate(sched.decay.milestones):
        length(f"schedule.decay.milestones.{i}", milestone)
    if sched.preset == "darknet":
        count("schedule.darknet.burn_in", sched.darknet.burn_in)
        count("schedule.darknet.step", sched.darknet.step, minimum=1)
        count("schedule.darknet.max_batches", sched.darknet.max_batches, minimum=1)
        for i, boundary in enumerate(sched.darknet.steps):
            count(f"schedule.darknet.steps.{i}", boundary)
        if sched.darknet.policy == "exp":  # gamma ** batch_num: the same decay per image
            put("schedule.darknet.gamma", sched.darknet.gamma**ratio)
        if sched.darknet.policy == "sig":  # exp(gamma * (batch_num - step)): the same slope per image
            put("schedule.darknet.gamma", sched.darknet.gamma * ratio)
    if sched.decay.kind == "sigmoid":
        put("schedule.decay.gamma", sched.decay.gamma * ratio)
    if cfg.ema.decay is not None:
        put("ema.decay", cfg.ema.decay**ratio)
    if cfg.norm.momentum is not None:
        put("norm.momentum", 1.0 - (1.0 - cfg.norm.momentum) ** ratio)

    rescaled = validate_config(new)
    before_lr, after_lr = scaled_lr(cfg.optim, old_batch), scaled_lr(rescaled.optim, new_batch)
    changes.append(("LR for the global batch", before_lr, after_lr))
    return rescaled, changes


def changes_table(changes: list[Change]) -> str:
    def show(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    rows = [("key", "before", "after")] + [(k, show(b), show(a)) for k, b, a in changes]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
