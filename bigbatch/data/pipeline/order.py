"""The data order: which images make up each global batch and each micro-batch.

The training stream is the concatenation of one random permutation of the training set per
epoch, each drawn from ``(seed, epoch)`` alone. Global batch ``k`` is images
``[k * batch, (k + 1) * batch)`` of that stream, so batches straddle epoch boundaries and no
image is dropped (as in TF's input pipelines, an epoch is ``images / batch`` steps, fractional).
Under a batch schedule (``schedule.batch``) step ``k`` takes the next ``batch_at(k)`` images from
where step ``k - 1`` ended (``BatchPlan.images_before``): the stream is keyed by image offset, so a
change of batch never repeats or skips an image.

Because the order depends only on the seed, the dataset size and the global batch (its schedule),
it is the same whatever the layout of devices and subdivisions, and resuming at step ``k`` needs
nothing but ``k``.

Each global batch is cut into ``world * subdivisions`` equal chunks in order; chunk
``j * world + rank`` is micro-batch ``j`` of ``rank``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


class DataOrder(Protocol):
    """Which dataset indices make each micro-batch: ``GlobalBatchOrder`` for every map-style set; a dataset may
    bring its own (``dataset.order(batch, seed, world)``), as sharded data does, read in shard order."""

    seed: int

    def micro_batches(self, step: int, rank: int, world: int, subdivisions: int) -> list[torch.Tensor]:
        """The ``subdivisions`` micro-batches (dataset indices) of ``rank`` at optimizer step ``step``."""


class Batches(Protocol):
    """The global batch of each step and where in the stream it starts (``batching.BatchPlan`` is one)."""

    def batch_at(self, step: int) -> int: ...

    def images_before(self, step: int) -> int: ...


@dataclass(frozen=True)
class FixedBatches:
    """The same global batch at every step."""

    batch: int

    def batch_at(self, step: int) -> int:
        return self.batch

    def images_before(self, step: int) -> int:
        return step * self.batch


def batches_of(batches: int | Batches) -> Batches:
    return FixedBatches(batches) if isinstance(batches, int) else batches


def order_of(dataset: Any, batches: int | Batches, seed: int, world: int) -> DataOrder:
    """The dataset's own order when it has one, else the global batch order (layout-free, see above); ``batches``
    is the global batch, or the plan of a batch schedule."""
    own = getattr(dataset, "order", None)
    return own(batches_of(batches), seed, world) if own is not None else GlobalBatchOrder(len(dataset), batches,
                                                                                          seed)


class GlobalBatchOrder:
    def __init__(self, num_images: int, batch: int | Batches, seed: int):
        """``batch``: the global batch, or a batch schedule's plan."""
        if num_images <= 0:
            raise ValueError("the training set is empty")
        self.num_images = num_images
        self.batches = batches_of(batch)
        self.seed = seed
        self._cache: dict[int, torch.Tensor] = {}

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of epoch ``epoch``: a permutation drawn from ``(seed, epoch)`` alone."""
        if epoch not in self._cache:
            if len(self._cache) >= 2:  # a batch spans at most a few epochs; keep the recent ones
                self._cache.pop(min(self._cache))
            rng = np.random.default_rng([self.seed, epoch])
            self._cache[epoch] = torch.from_numpy(rng.permutation(self.num_images))
        return self._cache[epoch]

    def global_batch(self, step: int) -> torch.Tensor:
        """Dataset indices of the global batch of optimizer step ``step`` (0-based)."""
        start = self.batches.images_before(step)
        end = start + self.batches.batch_at(step)
        parts = []
        while start < end:
            epoch, offset = divmod(start, self.num_images)
            take = min(self.num_images - offset, end - start)
            parts.append(self.permutation(epoch)[offset : offset + take])
            start += take
        return torch.cat(parts)

    def micro_batches(self, step: int, rank: int, world: int, subdivisions: int) -> list[torch.Tensor]:
        """The ``subdivisions`` micro-batches of ``rank`` at ``step``: chunks ``j * world + rank``."""
        chunks = self.global_batch(step).chunk(world * subdivisions)
        return [chunks[j * world + rank] for j in range(subdivisions)]


def sample_seed(seed: int, step: int, index: int) -> int:
    """A sample's augmentation seed, from (run seed, step, dataset index) alone (numpy's SeedSequence mixing): the
    same crop and colours for that image at that step whatever the devices, subdivisions, workers or a resume."""
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1, np.uint64)[0] >> 1)


@contextmanager
def sample_rng(seed: int) -> Iterator[None]:
    """Inside, torch's CPU RNG is seeded with ``seed`` (a ``sample_seed``); after, it is back as it was.

    Only the CPU generator is touched: ``torch.manual_seed`` would also seed every accelerator's RNG (a call per
    sample, about 0.2 ms here, and on a CUDA machine it would reseed the training's own dropout stream)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(int(seed))
        yield
