"""``bigbatch data bench``: the input pipeline alone (no model), in images per second per number of workers.

The training set of the config is read exactly as training reads it (the same data order, micro-batches,
sample keys, decoding and augmentation), in one process, with 0, 1, 2, 4, ... DataLoader workers up to the
machine's cores. Each measurement starts a fresh loader; its first step (the workers' start-up) is not timed.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from bigbatch.config import RunConfig
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import order_of


@dataclass
class Measurement:
    workers: int
    images: int
    seconds: float

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds


def worker_counts(cores: int) -> list[int]:
    """0, 1, 2, 4, ... and the number of cores itself."""
    counts, n = [0, 1], 2
    while n < cores:
        counts.append(n)
        n *= 2
    return sorted({*counts, cores})


def images_in(micro_batches: list[Any]) -> int:
    return sum(len(batch[0]) for batch in micro_batches)


def measure(cfg: RunConfig, task: Any, workers: int, images: int) -> Measurement:
    """Read at least ``images`` training images (after a first, untimed step) with ``workers`` workers."""
    subdivisions = cfg.subdivisions if isinstance(cfg.subdivisions, int) else 1
    order = order_of(task.train_set, cfg.batch, cfg.seed, 1)
    steps = 1 + math.ceil(images / cfg.batch)
    stream = batches_by_step(task.train_set, order, 0, steps, 0, 1, subdivisions, workers, task.sample_keys)
    next(stream)  # start-up: the workers fork and fill their first batches
    start, read = time.perf_counter(), 0
    for micro_batches in stream:
        read += images_in(micro_batches)
    return Measurement(workers, read, time.perf_counter() - start)


def bench(cfg: RunConfig, task: Any, images: int, counts: list[int] | None = None) -> list[Measurement]:
    return [measure(cfg, task, workers, images) for workers in (counts or worker_counts(os.cpu_count() or 1))]


def table(measurements: list[Measurement]) -> str:
    base = measurements[0].images_per_s
    lines = [f"{'workers':>7s}  {'images/s':>9s}  {'vs 0 workers':>12s}"]
    lines += [f"{m.workers:7d}  {m.images_per_s:9.1f}  {m.images_per_s / base:12.2f}" for m in measurements]
    return "\n".join(lines)
