"""Batch slabs: shared memory a DataLoader worker writes its batches into again and again, instead of asking the
kernel for fresh shared memory for every batch.

torch hands a batch from a worker to the training process in shared memory: the worker's collate allocates it
(``_new_shared``: a new shared-memory file, ``posix_fallocate``d, so every page is zeroed), writes it (a page fault
per 4 KiB page) and sends the file descriptor; the training process maps it, and frees it with the batch's last
tensor. At 299 px that costs about 0.8 ms an image, more than the crop's decode (``docs/benchmarks.md``). A slab
is allocated once per worker and kept: the worker writes into pages it has already mapped, and the training
process maps the same pages again.

The one rule that keeps this safe: a worker writes into a slab only while its flag is 0, and only the training
process sets a flag back to 0, once it has seen that no tensor of that slab's last batch is left there (a
``StorageWeakRef`` to the batch's storage has expired). So a batch never changes while anything in the training
process can read it, whatever it holds on to (slices, ``.numpy()`` views, a batch kept for a report).

- The flags are one shared ``int64`` tensor, made before the workers start (``workers x per_worker``). A slab in use
  holds the worker's generation number of the batch in it, so a late release of an earlier batch cannot free it.
- A slab's storage starts with a 64-byte header (a magic number, the slab's index, the generation) and the batch
  follows it; the training process reads the header to know which slab a batch is in (``received``). A tensor
  without that header is not a slab's and is left alone.
- A worker with no free slab allocates fresh shared memory, as torch's collate does, so it never waits.
- Under ``pin_memory`` the pin thread copies each batch and drops the shared one before the training process sees
  it, so the slabs are left off there (``batches_by_step``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import get_worker_info

from bigbatch.floor.tensors import tensors_in

HEADER_BYTES = 64
"""The slab header's size (a cache line: the batch after it stays 64-byte aligned)."""

MAGIC = 0x6269_6762_6174_6368  # "bigbatch"


def fresh_shared_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in new shared memory (what torch's ``default_collate`` allocates in a worker)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


class BatchSlabs:
    """The slabs of a DataLoader's workers: ``per_worker`` each. Made in the training process before the loader's
    workers start; ``install`` (the loader's ``worker_init_fn``) makes it the worker's; ``tensor`` (in a worker)
    gives a batch tensor in a free slab; ``received`` (in the training process, for each batch the loader yields)
    frees the slabs whose batches are gone and watches the new one."""

    def __init__(self, workers: int, per_worker: int) -> None:
        if workers < 1 or per_worker < 1:
            raise ValueError(f"batch slabs need a worker and a slab (got {workers} workers, {per_worker} slabs)")
        self.per_worker = per_worker
        self.flags = torch.zeros(workers * per_worker, dtype=torch.int64).share_memory_()
        self._storages: dict[int, torch.UntypedStorage] = {}  # a worker's own slabs, by index
        self._generation = 0  # a worker's count of the batches it has put in slabs
        self._watched: list[tuple[StorageWeakRef, int, int]] = []  # the training process's: (batch, slab, generation)

    # ------------------------------------------------------------------ in a worker

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised ``shape`` tensor in one of this worker's free slabs (marked in use), or in fresh shared
        memory when none is free."""
        worker = get_worker_info()
        if worker is None:
            raise RuntimeError("batch slabs are written in a DataLoader worker")
        nbytes = math.prod(shape) * dtype.itemsize
        first = worker.id * self.per_worker
        for index in range(first, first + self.per_worker):
            if int(self.flags[index]) == 0:
                return self._fill(index, nbytes, shape, dtype)
        return fresh_shared_tensor(shape, dtype)

    def _fill(self, index: int, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        storage = self._storages.get(index)
        if storage is None or storage.nbytes() < HEADER_BYTES + nbytes:
            storage = self._storages[index] = torch.UntypedStorage._new_shared(HEADER_BYTES + nbytes)
        self._generation += 1
        header = torch.empty(0, dtype=torch.int64).set_(storage, 0, (3,))
        header.copy_(torch.tensor([MAGIC, index, self._generation]))
        self.flags[index] = self._generation
        return torch.empty(0, dtype=dtype).set_(storage, HEADER_BYTES // dtype.itemsize, shape)

    # ------------------------------------------------------------------ in the training process

    def received(self, batch: Any) -> None:
        """Free the slabs whose last batch has no tensor left in this process, and watch the slabs of ``batch`` (a
        tensor, or a tuple, list or dict holding tensors)."""
        still = []
        for ref, index, generation in self._watched:
            if not ref.expired():
                still.append((ref, index, generation))
            elif int(self.flags[index]) == generation:
                self.flags[index] = 0
        self._watched = still
        for tensor in tensors_in(batch):
            slab = self._slab_of(tensor)
            if slab is not None:
                self._watched.append((StorageWeakRef(tensor.untyped_storage()), *slab))

    def _slab_of(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        """(slab index, generation) where ``tensor`` is a batch in one of these slabs, else None."""
        storage = tensor.untyped_storage()
        if (tensor.device.type != "cpu" or tensor.storage_offset() * tensor.element_size() != HEADER_BYTES
                or storage.nbytes() < HEADER_BYTES):
            return None
        magic, index, generation = torch.empty(0, dtype=torch.int64).set_(storage, 0, (3,)).tolist()
        if magic != MAGIC or not 0 <= index < len(self.flags) or int(self.flags[index]) != generation:
            return None
        return index, generation


_installed: BatchSlabs | None = None
"""This worker's slabs (``install``); None in the training process and in a worker of a loader without slabs."""


def install(slabs: BatchSlabs, worker_id: int) -> None:
    """A ``worker_init_fn`` (with ``slabs`` bound): this worker's batches go into ``slabs``."""
    global _installed
    _installed = slabs


def worker_init(slabs: BatchSlabs) -> Any:
    """The ``worker_init_fn`` that installs ``slabs`` in each worker."""
    return functools.partial(install, slabs)


def shared_batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A worker's batch tensor: in one of its slabs where the loader has them, else in fresh shared memory."""
    if _installed is not None:
        return _installed.tensor(shape, dtype)
    return fresh_shared_tensor(shape, dtype)
