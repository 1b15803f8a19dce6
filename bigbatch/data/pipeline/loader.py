"""Loaders: the training stream as one list of micro-batches per optimizer step, and the
validation set in a fixed order, every image exactly once.

Datasets may define ``__getitems__(indices)`` returning an already-collated batch (in-memory
tensors do: one indexing operation instead of one per image) and a ``collate`` function.

Without workers the batches are made in the training process with one torch thread (``one_thread``), as torch's
DataLoader makes them in a worker. A sample's operations are small (a 299 x 299 RGB image is 268,203 values): split
between threads, each operation ends at a barrier that waits for its slowest thread, and on a busy machine that is
a thread not running; at torch's default threads on a loaded 2-core machine the Inception pipeline read 14 images/s
instead of about 200 (``docs/benchmarks.md``, "At torch's default threads"). The training's own operations keep
the process's threads, and a dataset may spread a batch's samples over that many threads of its own
(``batch_threads``; ``data/formats/encoded_images.py`` does), each sample whole in one thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

from bigbatch.data.pipeline.batch_slabs import BatchSlabs, worker_init
from bigbatch.data.pipeline.order import DataOrder
from bigbatch.errors import UserError

SampleKeys = Callable[[int, list[int]], list[Any]]
"""``keys(step, indices)``: the dataset keys of one micro-batch of optimizer step ``step`` (e.g. each index
with the step's multi-scale size and a per-sample augmentation seed)."""


class MicroBatchSampler(Sampler[list[Any]]):
    """Yields this rank's micro-batches (lists of dataset indices, or of ``keys(step, indices)``) for steps
    ``start``..``stop - 1``."""

    def __init__(self, order: DataOrder, start: int, stop: int, rank: int, world: int, subdivisions: Subdivisions,
                 keys: SampleKeys | None = None):
        self.order, self.start, self.stop = order, start, stop
        self.rank, self.world, self.subdivisions = rank, world, per_step(subdivisions)
        self.keys = keys

    def __iter__(self) -> Iterator[list[Any]]:
        for step in range(self.start, self.stop):
            for micro in self.order.micro_batches(step, self.rank, self.world, self.subdivisions(step)):
                indices = micro.tolist()
                yield indices if self.keys is None else self.keys(step, indices)

    def __len__(self) -> int:
        return sum(self.subdivisions(step) for step in range(self.start, self.stop))


Subdivisions = int | Callable[[int], int]
"""Micro-batches per device per step: a number, or one for each step (``BatchPlan.subdivisions_at`` under a batch
schedule)."""


def per_step(subdivisions: Subdivisions) -> Callable[[int], int]:
    return (lambda step: subdivisions) if isinstance(subdivisions, int) else subdivisions


def _collate_of(dataset: Dataset) -> Any:
    return getattr(dataset, "collate", default_collate)


def batches_by_step(
    dataset: Dataset,
    order: DataOrder,
    start: int,
    stop: int,
    rank: int,
    world: int,
    subdivisions: Subdivisions,
    workers: int = 0,
    keys: SampleKeys | None = None,
    pin_memory: bool = False,
    most_subdivisions: int | None = None,
) -> Iterator[list[Any]]:
    """Iterate over steps ``start``..``stop - 1``, yielding each step's ``subdivisions`` micro-batches (a number,
    or a function of the step; ``most_subdivisions``: the most any step takes, for the prefetch).

    With workers, they keep a whole step's micro-batches in preparation (``prefetch_factor`` = subdivisions /
    workers, at least torch's 2): the step takes its micro-batches together, so with torch's default of 2 a
    worker would idle through most of a step and the next step would wait for the rest. The host then holds up
    to two steps' micro-batches: the one training and the next.

    ``pin_memory`` (training on CUDA): batches arrive in page-locked memory, so that their copies to the device
    (``non_blocking``) return at once and the host goes on while they run.

    Without it, workers write their batches into batch slabs they keep (``batch_slabs.py``) where the dataset
    allocates through ``shared_batch_tensor`` (the image folders do), and each batch's slab is freed for reuse
    once nothing here holds it."""
    sampler = MicroBatchSampler(order, start, stop, rank, world, subdivisions, keys)
    prefetch = step_prefetch(most_subdivisions or sampler.subdivisions(start), workers)
    slabs = BatchSlabs(workers, slabs_per_worker(prefetch)) if workers and not pin_memory else None
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=_collate_of(dataset),
        persistent_workers=False,
        generator=own_generator(order.seed, start),
        pin_memory=pin_memory,
        prefetch_factor=prefetch,
        worker_init_fn=None if slabs is None else worker_init(slabs),
    )
    step_batches: list[Any] = []
    done = start
    for micro in one_line_errors(loader if workers else one_thread(loader)):
        if slabs is not None:
            slabs.received(micro)
        step_batches.append(micro)
        if len(step_batches) == sampler.subdivisions(done):
            yield step_batches
            step_batches, done = [], done + 1
    if done != stop:  # a StopIteration raised in a worker's __getitem__ ends a DataLoader quietly
        raise RuntimeError(f"the data loader ended after step {done} of {stop} (a dataset raised StopIteration?)")


def step_prefetch(subdivisions: int, workers: int) -> int | None:
    """Micro-batches each worker prepares ahead: together a step's, ``ceil(subdivisions / workers)``, at least 2
    (torch's default); None without workers (torch's rule)."""
    return max(2, -(-subdivisions // workers)) if workers else None


def slabs_per_worker(prefetch: int) -> int:
    """Batch slabs each worker keeps (``batch_slabs.py``): as many of its batches as can be alive at once, ``3 x
    prefetch + 1``: ``prefetch`` in preparation or waiting in the loader, and up to a step's share (``prefetch``)
    in each of the step training and the next step being gathered, and one spare for a release seen late. A worker
    that finds none free allocates afresh, so this bounds the memory kept, not the batches in flight."""
    return 3 * prefetch + 1


def eval_batches(dataset: Dataset, batch: int, rank: int = 0, world: int = 1, workers: int = 0,
                 progress: bool = False) -> Iterable[Any]:
    """The validation set in index order; rank ``r`` of ``world`` takes indices ``r, r + world, ...``. With
    ``progress`` (``bigbatch eval``), a progress bar on a terminal (tqdm; none elsewhere)."""
    indices = list(range(rank, len(dataset), world))  # type: ignore[arg-type]
    chunks = [indices[i : i + batch] for i in range(0, len(indices), batch)]
    loader = DataLoader(dataset, batch_sampler=chunks, num_workers=workers, collate_fn=_collate_of(dataset),
                        generator=own_generator(0, 0))
    batches = one_line_errors(loader if workers else one_thread(loader))
    if not progress:
        return batches
    from tqdm import tqdm

    return tqdm(batches, total=len(chunks), desc=f"evaluating {len(indices)} images", unit="batch",
                leave=False, disable=None, dynamic_ncols=True)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Inside, torch's intra-op operations use ``count`` threads; after, as many as before (changing the count
    costs well under a microsecond)."""
    before = torch.get_num_threads()
    if before == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_thread(batches: Iterable[Any]) -> Iterator[Any]:
    """``batches``, each one made with one torch thread (``torch_threads(1)``), as a DataLoader worker makes it;
    the code that takes a batch runs with the process's threads. While a batch is made, ``batch_threads()`` is the
    process's count: a dataset may spread the batch's samples over that many threads of its own."""
    iterator = iter(batches)
    while True:
        outside = torch.get_num_threads()
        with torch_threads(1):
            _making.threads = outside
            try:
                batch = next(iterator, _END)
            finally:
                _making.threads = 1
        if batch is _END:
            return
        yield batch


_END = object()
_making = threading.local()


def batch_threads() -> int:
    """The torch threads of the process whose batch is being made in this thread by ``one_thread`` (at 0 workers);
    1 anywhere else (in a DataLoader worker, outside a loader)."""
    return getattr(_making, "threads", 1)


WORKER_ERROR = f"\n{UserError.__module__}.{UserError.__qualname__}: "
"""What ends the text torch re-raises for a ``UserError`` of a DataLoader worker (its traceback, then the error)."""


def one_line_errors(batches: Iterable[Any]) -> Iterator[Any]:
    """``batches``, with a ``UserError`` raised in a DataLoader worker one line again: torch re-raises it in this
    process with the worker's traceback as its message; the message is the error's own, its last line."""
    try:
        yield from batches
    except UserError as error:
        text = str(error)
        if WORKER_ERROR not in text:
            raise
        raise UserError(text.rsplit(WORKER_ERROR, 1)[1].strip()) from None


def own_generator(seed: int, start: int) -> torch.Generator:
    """A loader's own generator: creating a DataLoader iterator draws a seed from it, and drawing from
    the global torch RNG instead would shift the training's random stream when a run is resumed."""
    return torch.Generator().manual_seed((seed * 1_000_003 + start) % 2**64)  # torch takes seeds below 2^64


class TensorImages(Dataset):
    """An in-memory dataset of images ``(N, C, H, W)`` and integer labels ``(N,)``."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        if len(images) != len(labels):
            raise ValueError("images and labels differ in length")
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.images[index], self.labels[index]

    @staticmethod
    def collate(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch  # __getitems__ already returned the batch


def split_batch(batch: Any, parts: int, nested: bool = False) -> list[Any]:
    """Cut a collated batch into ``parts`` consecutive pieces: a tensor along its first dimension; a dict key by
    key; a tuple, or a top-level list (``default_collate``'s ``[images, labels]``), component by component; a
    list inside one of those is a list of per-sample items (detection: images of different sizes, targets)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(parts))
    if isinstance(batch, dict):
        pieces = {k: split_batch(v, parts, nested=True) for k, v in batch.items()}
        return [{k: v[i] for k, v in pieces.items()} for i in range(parts)]
    if isinstance(batch, tuple) or (isinstance(batch, list) and not nested):
        return [type(batch)(p) for p in zip(*(split_batch(b, parts, nested=True) for b in batch), strict=True)]
    if isinstance(batch, list):
        size = len(batch) // parts
        return [batch[i * size : (i + 1) * size] for i in range(parts)]
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}")


def split_micro_batches(micro_batches: list[Any], factor: int) -> list[Any]:
    """Each micro-batch cut into ``factor`` consecutive ones (subdivisions x factor, the same images)."""
    if factor == 1:
        return micro_batches
    return [piece for batch in micro_batches for piece in split_batch(batch, factor)]
