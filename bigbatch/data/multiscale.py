"""Multi-scale training: the input size as a pure function of ``(seed, step)``.

Darknet (``random=1`` in a YOLO cfg; ``detector.c``) draws a new network size every 10 iterations,
``dim = (rand() % 10 + 10) * 32``, i.e. 320..608 for 416. Here the sizes default to the multiples of 32
from ``base / 1.4`` to ``base * 1.4`` (:func:`default_sizes`), and :class:`MultiScale` gives

    size_at(step) = max(sizes)                         for period k = step // every = 0
                    sizes[rng(seed, k).integers(len)]  for k >= 1

The first period runs at the largest size, so the allocator reserves the peak memory up front (a later,
larger size would otherwise fragment or exceed what the planner measured). The draw of period ``k``
depends on ``(seed, k)`` alone: every rank computes the same size, and a run resumed at any step continues
the same sequence without saved state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

MULTIPLE = 32  # the stride of Darknet's and most detectors' deepest feature map
_SALT = 0x6D756C7469  # "multi": keeps the (seed, k) draws apart from the data order's (seed, epoch) ones


def default_sizes(base: int, ratio: float = 1.4, multiple: int = MULTIPLE) -> list[int]:
    """The multiples of ``multiple`` in ``[base / ratio, base * ratio]``, bounds rounded inwards:
    ``ceil(base / ratio / m) * m`` to ``floor(base * ratio / m) * m`` in steps of ``m`` (exact arithmetic on
    ``ratio`` as written). 416 -> 320..576 (Darknet: 320..608); 608 -> 448..832; 800 -> 576..1120."""
    if base <= 0 or multiple <= 0:
        raise ValueError(f"base and multiple must be positive, got base={base}, multiple={multiple}")
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1, got {ratio}")
    exact = Fraction(str(ratio))
    low = math.ceil(Fraction(base) / exact / multiple) * multiple
    high = math.floor(Fraction(base) * exact / multiple) * multiple
    if low > high:
        raise ValueError(f"no multiple of {multiple} lies between {base}/{ratio} and {base}*{ratio}")
    return list(range(low, high + 1, multiple))


class MultiScale:
    """The input size of each step: a new draw from ``sizes`` every ``every`` steps, the largest first."""

    def __init__(self, sizes: Sequence[int], every: int = 10, seed: int = 0, multiple: int = MULTIPLE):
        if len(sizes) == 0:
            raise ValueError("multiscale.sizes is empty: give at least one size")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0 or size % multiple:
                raise ValueError(f"multiscale.sizes: {size!r} is not a positive multiple of {multiple}")
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"multiscale.every must be an integer >= 1, got {every!r}")
        if seed < 0:
            raise ValueError(f"the seed must be >= 0, got {seed}")
        self.sizes = [int(s) for s in sizes]
        self.every, self.seed = int(every), int(seed)
        self.largest = max(self.sizes)

    def period(self, step: int) -> int:
        """The index ``k = step // every`` of the period holding ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return step // self.every

    def size_at(self, step: int) -> int:
        """The input size at optimizer step ``step`` (counted from 0); see the module docstring."""
        k = self.period(step)
        if k == 0:
            return self.largest
        rng = np.random.default_rng([self.seed, k, _SALT])
        return self.sizes[int(rng.integers(len(self.sizes)))]
