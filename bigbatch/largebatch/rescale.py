"""Rescale a recipe to a new global batch, keeping what the seeds say should stay constant.

From batch B to batch B' (ratio r = B' / B):

- the LR follows ``optim.scaling`` from ``optim.ref_batch`` (set to B when it was unset, so the
  LR stated for B is scaled rather than reused);
- lengths stay constant in images: every field typed as a length (``config.Length``, ``Interval``: warmup
  phases, decay points, ``eval.every``, ``checkpoint.every``) given in steps is multiplied by 1 / r, and written
  in images (``"12800 images"``) when it is no longer a whole number of steps; every field typed as a whole
  number of steps (``config.StepCount``, ``Steps``: ``steps``, ``clip.start_step``, Darknet's burn_in, steps, step
  and max_batches) is rounded;
- per-step rates (``config.PerStep``, or a registered part's ``rates``) keep their effect per image:
  ``POWER`` x' = x ** r (the EMA decay: the same half-life in images; Darknet's ``exp`` gamma),
  ``COMPLEMENT`` (1 - x') = (1 - x) ** r (the BatchNorm momentum), ``SLOPE`` x' = x * r (sigmoid slopes);
- the micro-batch stays the same where it can (subdivisions' = B' / (world x micro-batch)), so memory does not
  change; where B' is no whole number of them, it is the largest divisor of the per-device batch below it (and of a
  batch schedule's, whose batches share the micro-batch), so memory does not grow (:func:`micro_batch_within`).
Lengths in epochs or images, and ``norm.half_life_images``, need no change. The fields are found from the
config's types (sections, lists of sections, and the fields parts add), not from a list: a new field typed as a
length is rescaled. A sub-section marked ``UsedWhen`` is left alone unless its choice is made.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from bigbatch.batching import reachable_batches
from bigbatch.config import (
    COMPLEMENT,
    POWER,
    SLOPE,
    InImages,
    PartSection,
    PerStep,
    RunConfig,
    Section,
    Steps,
    UsedWhen,
    parse_length,
    validate_config,
)
from bigbatch.errors import UserError
from bigbatch.largebatch.schedule import scaled_lr

Change = tuple[str, Any, Any]

RATE_RULES: dict[str, Callable[[float, float], float]] = {
    POWER: lambda x, r: x**r,
    COMPLEMENT: lambda x, r: 1.0 - (1.0 - x) ** r,
    SLOPE: lambda x, r: x * r,
}
"""How a per-step rate x becomes x' for the batch ratio r = B' / B."""


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
    images = number * old_batch
    return f"{int(round(images)) if _whole(images) else images!r} images"  # every digit: ':g' kept 6 (2.88001e+07)


def scale_steps(value: int, marker: Steps, old_batch: int, new_batch: int) -> int:
    """A whole number of steps scaled to keep its images: rounded to the nearest (or up), at least the minimum."""
    steps = value * old_batch / new_batch
    return max(marker.minimum, math.ceil(steps - 1e-9) if marker.up else int(round(steps)))


def _markers(annotation: Any) -> list[Any]:
    """The ``Annotated`` metadata of ``annotation`` and of what it holds (``X | None``, ``list[X]``)."""
    if get_origin(annotation) is Annotated:
        base, *metadata = get_args(annotation)
        return metadata + _markers(base)
    return [m for arg in get_args(annotation) for m in _markers(arg)]


def _item(annotation: Any) -> Any:
    """The annotation of one item when ``annotation`` is a list (``list[Length]``, ``list[X] | None``), else None."""
    if get_origin(annotation) is Annotated:
        return _item(get_args(annotation)[0])
    if get_origin(annotation) is list:
        return get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        return next((item for arg in get_args(annotation) if (item := _item(arg)) is not None), None)
    return None


@dataclass(frozen=True)
class Rescaling:
    """From global batch ``old`` to ``new``: the new value of every marked field of a config."""

    old: int
    new: int

    def fields(self, section: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """(dotted key, new value) for every length, step count and per-step rate in ``section`` and what it
        holds: its sections, lists of sections, and the fields its parts add."""
        rates = section.part().info.get("rates", {}) if isinstance(section, PartSection) else {}
        for key, annotation in type(section).keys().items():
            value, path, markers = getattr(section, key), f"{prefix}{key}", _markers(annotation)
            if value is None or any(getattr(section, m.field) != m.value for m in markers if isinstance(m, UsedWhen)):
                continue
            if isinstance(value, list):
                for i, element in enumerate(value):
                    yield from self._value(element, _markers(_item(annotation)), None, f"{path}.{i}")
            else:
                rule = rates.get(key) or next(
                    (rule for m in markers if isinstance(m, PerStep) and (rule := m.rule_in(section))), None)
                yield from self._value(value, markers, rule, path)

    def _value(self, value: Any, markers: list[Any], rule: str | None, path: str) -> Iterator[tuple[str, Any]]:
        if isinstance(value, Section):
            yield from self.fields(value, f"{path}.")
        elif any(isinstance(m, InImages) for m in markers):
            yield path, scale_length(value, self.old, self.new)
        elif steps := next((m for m in markers if isinstance(m, Steps)), None):
            yield path, scale_steps(value, steps, self.old, self.new)
        elif rule is not None:
            yield path, RATE_RULES[rule](value, self.new / self.old)


def micro_batch_within(per_device: int, largest: int) -> int:
    """The largest divisor of ``per_device`` (images per process in every step) that is at most ``largest`` (the
    old micro-batch), in at most min(largest, sqrt(per_device)) trials: counted down from ``largest`` where that is
    the fewer, else every divisor pair d, per_device / d with d <= sqrt(per_device)."""
    root = math.isqrt(per_device)
    if largest <= root:
        return next(m for m in range(largest, 0, -1) if per_device % m == 0)
    pairs = ((d, per_device // d) for d in range(1, root + 1) if per_device % d == 0)
    return max(m for pair in pairs for m in pair if m <= largest)


def rescale(cfg: RunConfig, new_batch: int, world: int = 1) -> tuple[RunConfig, list[Change]]:
    """The recipe for ``new_batch`` and the list of (key, before, after) it changed."""
    if cfg.adaptive is not None:
        raise UserError("batch: an adaptive batch (batch.mode: adaptive) is scaled by AdaScale during the run; "
                        "change batch.max instead of rescaling the recipe")
    old_batch = cfg.batch
    new = copy.deepcopy(cfg.model_dump(mode="json"))
    changes: list[Change] = []

    def put(path: str, value: Any) -> None:
        node = new
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        index = int(last) if isinstance(node, list) else last
        if node[index] != value:
            changes.append((path, node[index], value))
            node[index] = value

    put("batch", new_batch)
    if cfg.optim.ref_batch is None and cfg.optim.scaling != "none":
        put("optim.ref_batch", old_batch)
    for path, value in Rescaling(old_batch, new_batch).fields(cfg):
        put(path, value)
    for i, milestone in enumerate(cfg.schedule.batch):  # a batch schedule's batches grow with the first
        if milestone.batch is not None:
            put(f"schedule.batch.{i}.batch", max(1, round(milestone.batch * new_batch / old_batch)))
    # every batch the new recipe reaches is a whole number of its micro-batches on each process
    reached = [batch for _, batch in reachable_batches(validate_config({**new, "subdivisions": 1}))]
    every = math.gcd(*reached)
    if every % world:
        batches = ", ".join(map(str, reached))
        raise UserError(f"--batch: the new recipe's batches ({batches}) cannot be cut for {world} processes: a "
                        f"whole number of images each, {every} (their common divisor) / {world} is not")
    micro = micro_batch_within(every // world, old_batch // (world * cfg.subdivisions))
    put("subdivisions", new_batch // (world * micro))

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
