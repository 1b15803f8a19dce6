"""Tensors of a nested batch (lists, tuples and dicts of tensors): what the loader's slabs and the device copies
walk."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            yield from tensors_in(b)
    elif isinstance(batch, dict):
        for b in batch.values():
            yield from tensors_in(b)
