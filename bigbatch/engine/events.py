"""The event store: every record a run produces goes through it, and the writers consume it.

As detectron2's ``EventStorage`` with its writers, but a record is handed to every writer as it is put: a
writer is a hook (``engine/hooks/``) whose ``write(record)`` turns records into an output (``metrics.jsonl``,
TensorBoard, the progress bar or printed lines). A new output is one hook with a ``write``.

A record is a dict with ``step`` (optimizer steps done, or the 0-based step for what happens inside one) and
one of: the training scalars (``kind`` "train"), an evaluation's metrics with its ``split`` ("eval"), or
``event`` naming something else that happened ("event": skipped steps, out of memory, memory peaks, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    kind: str
    """``train``, ``eval`` or ``event``."""
    values: dict[str, Any]
    """What ``metrics.jsonl`` holds for it, ``step`` first."""
    message: str
    """What a person reads on the terminal."""


@dataclass
class EventStorage:
    writers: list[Callable[[Record], None]] = field(default_factory=list)

    def put(self, record: Record) -> None:
        for write in self.writers:
            write(record)

    def train(self, values: dict[str, Any], steps: int) -> None:
        """The scalars of a training step (``step``, ``images``, ``epoch``, ``lr``, ``loss``, ``images_per_s``,
        ...) of a run of ``steps`` steps (an adaptive run: of ``steps`` base steps, its ``progress``)."""
        where = (f"step {values['step']}/{steps}" if "progress" not in values else
                 f"step {values['step']}  progress {values['progress']:.1f}/{steps}  r {values['gain']:.2f}")
        message = (f"{where}  epoch {values['epoch']:.2f}  loss {values['loss']:.4f}  "
                   f"lr {values['lr']:.4g}  {values['images_per_s']:.0f} img/s"
                   + (f"  batch {values['batch']}" if "batch" in values else ""))
        self.put(Record("train", values, message))

    def evaluation(self, step: int, split: str, metrics: dict[str, float]) -> None:
        shown = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items() if "/" not in k)  # per-class: metrics.jsonl
        self.put(Record("eval", {"step": step, "split": split, **metrics}, f"eval step {step}  {split}  {shown}"))

    def event(self, step: int, name: str, values: dict[str, Any], message: str | None = None) -> None:
        """Something else that happened (``event: name``), e.g. a skipped step or the memory peaks at the end."""
        if message is None:
            shown = "  ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in values.items())
            message = f"{name}: {shown}"
        self.put(Record("event", {"step": step, "event": name, **values}, message))
