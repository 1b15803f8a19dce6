"""The data order: which images make up each global batch and each micro-batch.

The training stream is the concatenation of one random permutation of the training set per
epoch, each drawn from ``(seed, epoch)`` alone. Global batch ``k`` is images
``[k * batch, (k + 1) * batch)`` of that stream, so batches straddle epoch boundaries and no
image is dropped (as in TF's input pipelines, an epoch is ``images / batch`` steps, fractional).

Because the order depends only on the seed, the dataset size and the global batch, it is the
same whatever the layout of devices and subdivisions, and resuming at step ``k`` needs nothing
but ``k``.

Each global batch is cut into ``world * subdivisions`` equal chunks in order; chunk
``j * world + rank`` is micro-batch ``j`` of ``rank``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
import torch


class DataOrder(Protocol):
    """Which dataset indices make each micro-batch: ``GlobalBatchOrder`` for every map-style set; a dataset may
    bring its own (``dataset.order(batch, seed, world)``), as sharded data does, read in shard order."""

    seed: int

    def micro_batches(self, step: int, rank: int, world: int, subdivisions: int) -> list[torch.Tensor]:
        """The ``subdivisions`` micro-batches (dataset indices) of ``rank`` at optimizer step ``step``."""


def order_of(dataset: Any, batch: int, seed: int, world: int) -> DataOrder:
    """The dataset's own order when it has one, else the global batch order (layout-free, see above)."""
    own = getattr(dataset, "order", None)
    return own(batch, seed, world) if own is not None else GlobalBatchOrder(len(dataset), batch, seed)


class GlobalBatchOrder:
    def __init__(self, num_images: int, batch: int, seed: int):
        if num_images <= 0:
            raise ValueError("the training set is empty")
        self.num_images = num_images
        self.batch = batch
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
        start = step * self.batch
        parts = []
        while start < (step + 1) * self.batch:
            epoch, offset = divmod(start, self.num_images)
            take = min(self.num_images - offset, (step + 1) * self.batch - start)
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
