"""The input pipeline's third stage: a step's micro-batches to the device, the next one copied while the current one
computes.

On CUDA the loader hands over batches in page-locked (pinned) memory (``data/pipeline/loader.py``), so a
``non_blocking`` copy returns at once. :class:`DeviceMicroBatches` issues micro-batch ``i + 1``'s copy on a side stream
when micro-batch ``i`` is handed to the step, and the compute stream waits for a copy's event only when it needs that
micro-batch (the pattern of NVIDIA's Apex ``data_prefetcher`` and timm's ``PrefetchLoader``, one micro-batch ahead
instead of one batch): the copy of every micro-batch but the first overlaps the compute of the one before, and at most
two of a step's micro-batches are on the device at once. Host memory is read once, by the copy itself.

On the CPU nothing is copied: the micro-batches are used where they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from bigbatch.floor.tensors import tensors_in


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a (nested) batch to ``device`` (``non_blocking``); on the CPU nothing is copied."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


class DeviceMicroBatches(Sequence):
    """A step's host micro-batches, iterated on a CUDA device: each copied on a side stream one micro-batch ahead.

    Iterating yields device batches in order; the step's compute (the current stream when iteration starts) waits
    for a micro-batch's copy just before it is yielded, and each copied tensor is marked as used by that stream
    (``record_stream``), so that the caching allocator does not hand its memory to the next copy while a kernel
    still reads it. Iterating again (a step re-run after a non-finite gradient) copies again."""

    def __init__(self, host: Sequence[Any], device: torch.device, stream: torch.cuda.Stream) -> None:
        self.host, self.device, self.stream = host, device, stream

    def __len__(self) -> int:
        return len(self.host)

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        return self._finish(self._start(index))

    def __iter__(self) -> Iterator[Any]:
        pending = self._start(0) if len(self.host) else None
        for i in range(len(self.host)):
            batch = self._finish(pending)
            pending = self._start(i + 1) if i + 1 < len(self.host) else None
            yield batch

    def _start(self, index: int) -> tuple[Any, torch.cuda.Event]:
        # No wait for the compute stream: the copy's memory comes from the side stream's own pool (the caching
        # allocator never hands a block freed on one stream to another), so nothing the compute reads is overwritten.
        with torch.cuda.stream(self.stream):
            moved = to_device(self.host[index], self.device)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        return moved, copied

    def _finish(self, pending: tuple[Any, torch.cuda.Event] | None) -> Any:
        assert pending is not None
        moved, copied = pending
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(copied)
        for tensor in tensors_in(moved):
            if tensor.device.type == "cuda":
                tensor.record_stream(compute)
        return moved


class DeviceFeed:
    """Puts a step's micro-batches on ``device``: one ahead on a side stream on CUDA (:class:`DeviceMicroBatches`),
    all at once elsewhere (:func:`to_device`: nothing copied on the CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream: torch.cuda.Stream | None = None

    def __call__(self, micro_batches: Sequence[Any]) -> Sequence[Any]:
        if self.device.type != "cuda":
            return to_device(list(micro_batches), self.device) if self.device.type != "cpu" else micro_batches
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return DeviceMicroBatches(micro_batches, self.device, self._stream)
