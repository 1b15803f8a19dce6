"""Per-layer size of the weight update of an optimizer step, and a CSV log of it.

The write-up "Darknet/YOLO optimized for Jetson" (docs/references.md) watches the largest weight update of each layer
per iteration (it drives its ``update_ratio`` loss scale, ``largebatch/precision.py``); here, for every named parameter
tensor W, with Delta W = W_after - W_before across one optimizer step:

    max_abs  = max |Delta W|                      (the write-up's per-layer maximum update)
    relative = ||Delta W||_2 / ||W_before||_2     (the update-to-weight ratio, as LARS's trust ratio reads it)

``relative`` is None where ||W_before|| = 0 (a zero-initialised bias, say): the ratio is undefined there, and None
stays valid JSON where ``inf`` would not. A parameter the step did not touch (no gradient) has 0 and 0.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.floor.files import naming


@dataclass(frozen=True)
class LayerUpdate:
    name: str
    """The parameter's name in ``model.named_parameters()``."""
    max_abs: float
    """max |Delta W|."""
    relative: float | None
    """||Delta W|| / ||W_before|| (None when ||W_before|| = 0)."""


class UpdateSizes:
    """``before(model)`` ahead of the optimizer step, ``after(model)`` once it is applied: each parameter's
    :class:`LayerUpdate` (see the module docstring).

    Memory: one float32 copy of the weights (allocated at the first ``before``, reused) and three scalars per
    parameter. Time: ``before`` a copy and a norm over the weights, ``after`` a subtraction and two norms, as batched
    ``torch._foreach`` kernels on the weights' device, and one host transfer for all parameters. Give it the model
    itself, not a DDP wrapper (whose names carry a ``module.`` prefix).
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._snapshots: list[torch.Tensor] = []
        self._before_norms: torch.Tensor | None = None
        self._ready = False

    def before(self, model: nn.Module) -> None:
        """Snapshot the weights (float32) and their norms ||W_before||, on their device, without a host sync."""
        named = [(name, p.detach()) for name, p in model.named_parameters()]
        names, params = [name for name, _ in named], [p for _, p in named]
        if names != self._names or any(s.shape != p.shape or s.device != p.device
                                       for s, p in zip(self._snapshots, params, strict=True)):
            self._names = names
            self._snapshots = [torch.empty(p.shape, dtype=torch.float32, device=p.device) for p in params]
        if params:
            torch._foreach_copy_(self._snapshots, params)
            self._before_norms = _stack(torch._foreach_norm(self._snapshots), params[0].device)
        self._ready = True

    def after(self, model: nn.Module) -> list[LayerUpdate]:
        """Each named parameter's update since ``before``, in ``named_parameters`` order (one host transfer)."""
        named = [(name, p.detach()) for name, p in model.named_parameters()]
        if not self._ready or [name for name, _ in named] != self._names:
            raise RuntimeError("UpdateSizes.after needs UpdateSizes.before on the same model first")
        self._ready = False
        if not named:
            return []
        params = [p for _, p in named]
        device = params[0].device
        torch._foreach_sub_(self._snapshots, params)  # the snapshots now hold W_before - W_after = -Delta W
        delta_norms = _stack(torch._foreach_norm(self._snapshots), device)
        max_abs = _stack(torch._foreach_norm(self._snapshots, float("inf")), device)  # inf-norm = max |x|
        rows = torch.stack([max_abs, delta_norms, self._before_norms]).double().T.tolist()
        return [LayerUpdate(name, m, d / w if w > 0 else None) for name, (m, d, w) in zip(self._names, rows,
                                                                                          strict=True)]


def _stack(scalars: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack([s.to(device=device, dtype=torch.float32) for s in scalars])


def top(updates: Iterable[LayerUpdate], k: int = 10) -> list[dict[str, Any]]:
    """The ``k`` largest updates by ``relative`` (those without a relative size, ||W_before|| = 0, after all
    others), as ``{"name", "relative", "max_abs"}`` dicts."""
    ranked = sorted(updates, key=lambda u: (u.relative is not None, u.relative or 0.0), reverse=True)
    return [{"name": u.name, "relative": u.relative, "max_abs": u.max_abs} for u in ranked[:k]]


class NotAnUpdatesCSV(UserError, ValueError):
    """An existing file that :class:`UpdatesCSV` did not write: it is never appended to."""


def drop_rows_after(path: Path, last_step: int) -> int:
    """Drop the rows of an update-size log past ``last_step`` (a run that died after its last checkpoint wrote
    them; the resumed run writes them again), and a row a kill cut short; the header stays. A file that is not an
    update-size log is left alone (:class:`UpdatesCSV` refuses it). -> the rows dropped."""
    from bigbatch.floor.outputs import keep_lines

    header = ",".join(UpdatesCSV.HEADER)
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        if f.readline(len(header) + 3).rstrip("\r\n") != header:
            return 0

    def keep(line: str) -> bool:
        if line.rstrip("\r\n") == header:
            return True
        step, _, rest = line.partition(",")
        return step.isdigit() and int(step) <= last_step and line.endswith("\n") and rest.count(",") >= 2

    return keep_lines(path, keep)


class UpdatesCSV:
    """Appends ``step,name,max_abs,relative`` rows (one per parameter per written step) to a CSV file, flushed at
    each write. The header is written when the file is created (or found empty). An existing file is appended to
    only when its first line is this header: any other file raises :class:`NotAnUpdatesCSV` (a ``ValueError``)
    naming it, and is left untouched. ``relative`` None is an empty field."""

    HEADER = ("step", "name", "max_abs", "relative")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        header = ",".join(self.HEADER)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if not fresh:
            with open(self.path, encoding="utf-8", errors="replace", newline="") as f:
                first = f.readline(len(header) + 3).rstrip("\r\n")
            if first != header:
                raise NotAnUpdatesCSV(f"{self.path}: the file exists and is not an update-size log (its first line "
                                      f"is not '{header}'); it is not appended to: give another path or remove it")
        self._file = open(self.path, "a", encoding="utf-8", newline="")  # closed by close()
        self._writer = csv.writer(self._file)
        if fresh:
            self._writer.writerow(self.HEADER)
            self._file.flush()

    def write(self, step: int, updates: Iterable[LayerUpdate]) -> None:
        """One row per parameter for optimizer step ``step``."""
        with naming(self.path):  # a full disk: one line naming the file
            self._writer.writerows((step, u.name, repr(u.max_abs), "" if u.relative is None else repr(u.relative))
                                   for u in updates)
            self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> UpdatesCSV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
