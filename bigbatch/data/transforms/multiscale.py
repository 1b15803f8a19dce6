"""Multi-scale training: the input size as a pure function of ``(seed, step)``.

Two ways to draw a size, every ``every`` steps (Darknet: 10):

- **Darknet's rule** (``multiscale.sizes: auto``; AlexeyAB/darknet's ``src/detector.c``), for a base
  size ``b`` and a range ``s`` (the last ``[yolo]`` layer's ``random``: 1 means 1.4, a fraction such as 1.25 is
  the range itself): ``r = rand_scale(s)`` (``u ~ U[1, s]``, then ``u`` or ``1 / u`` with equal odds), and

      size = round(r * b / 32 + 1) * 32,    and  size = b  when r < 1 but the size rounds above b.

  ``round`` is C's ``roundl`` (halves away from zero). So 320 takes 256..480 and 416 takes 320..608
  (:func:`darknet_sizes` lists them); the largest is ``round(s * b / 32 + 1) * 32``.
- **A list** (``multiscale.sizes: [320, 352, ...]``): a size drawn uniformly from it.

Either way :class:`MultiScale` gives

    size_at(step) = largest                    for period k = step // every = 0, and for a period whose first
                                               step k * every > stop - final (Darknet: 100, "to calc rolling
                                               mean/variance")
                    draw(rng(seed, k))         otherwise

as AlexeyAB's ``train_detector`` decides it: only at the top of a period (``count++ % 10 == 0``), the largest when
``get_current_iteration(net) > net.max_batches - 100``. Darknet's iteration there is the number of updates done,
which is bigbatch's ``step`` (counted from 0), and ``max_batches`` is ``stop``. So a run of 1,000 steps ends with 90
steps at the largest size (periods 910..999), not 100, and a ``stop - final`` that is not a multiple of ``every``
never changes the size inside a period (1,005 steps: from step 910 on, 95 steps).

The first period runs at the largest size, so the allocator reserves the peak memory up front (a later,
larger size would otherwise fragment or exceed what the planner measured). The draw of period ``k``
depends on ``(seed, k)`` alone: every rank computes the same size, and a run resumed at any step continues
the same sequence without saved state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bigbatch.config import RunConfig

MULTIPLE = 32  # the stride of Darknet's and most detectors' deepest feature map
_SALT = 0x6D756C7469  # "multi": keeps the (seed, k) draws apart from the data order's (seed, epoch) ones


DARKNET_RANGE = 1.4
"""Darknet's range when ``random=1`` (``rand_coef``)."""


def c_round(x: float) -> int:
    """C's ``roundl``: to the nearest integer, halves away from zero."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def darknet_size(r: float, base: int, multiple: int = MULTIPLE) -> int:
    """Darknet's size for a drawn scale ``r``: ``round(r * base / m + 1) * m``; a scale below 1 that rounds above
    ``base`` gives ``base``; never below ``m`` (AlexeyAB ``detector.c``)."""
    size = c_round(r * base / multiple + 1) * multiple
    if r < 1 and size > base:
        size = base
    return max(size, multiple)


def darknet_sizes(base: int, ratio: float = DARKNET_RANGE, multiple: int = MULTIPLE) -> list[int]:
    """Every size Darknet's rule can draw for ``base`` and range ``ratio``: the multiples of ``m`` from
    ``darknet_size(1 / ratio)`` to ``darknet_size(ratio)`` (the size grows with r and passes every multiple
    between), and ``base`` itself (a scale just below 1 rounds above it), ascending. 320 -> 256..480;
    416 -> 320..608; 608 -> 480..896; 300 -> 256, 288, 300, 320, ..., 448."""
    if base <= 0 or multiple <= 0:
        raise ValueError(f"base and multiple must be positive, got base={base}, multiple={multiple}")
    if ratio < 1:
        raise ValueError(f"the multi-scale range must be >= 1, got {ratio}")
    low, high = darknet_size(1 / ratio, base, multiple), darknet_size(ratio, base, multiple)
    multiples = range(math.ceil(low / multiple) * multiple, high + 1, multiple)
    return sorted({*multiples, max(base, multiple)} if ratio > 1 else {darknet_size(1.0, base, multiple)})


def draw_for(sizes: Sequence[int] | str, base: int, ratio: float = DARKNET_RANGE) -> DarknetDraw | ListDraw:
    """The draw of ``data.multiscale.sizes``: ``"auto"`` is Darknet's rule around ``base``, a list is drawn from."""
    return DarknetDraw(base, ratio) if sizes == "auto" else ListDraw(list(sizes))


class DarknetDraw:
    """Darknet's rule for ``base`` and range ``ratio`` (see the module docstring)."""

    def __init__(self, base: int, ratio: float = DARKNET_RANGE, multiple: int = MULTIPLE) -> None:
        self.sizes = darknet_sizes(base, ratio, multiple)  # validates
        self.base, self.ratio, self.multiple = int(base), float(ratio), int(multiple)

    def __call__(self, rng: np.random.Generator) -> int:
        u = rng.uniform(1.0, self.ratio) if self.ratio > 1 else 1.0  # rand_uniform_strong(1, s)
        r = u if rng.integers(2) else 1.0 / u  # rand_scale: the scale or its inverse, even odds
        return darknet_size(r, self.base, self.multiple)


class ListDraw:
    """A size drawn uniformly from ``sizes``."""

    def __init__(self, sizes: Sequence[int], multiple: int = MULTIPLE) -> None:
        if len(sizes) == 0:
            raise ValueError("multiscale.sizes is empty: give at least one size")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0 or size % multiple:
                raise ValueError(f"multiscale.sizes: {size!r} is not a positive multiple of {multiple}")
        self.sizes = [int(s) for s in sizes]

    def __call__(self, rng: np.random.Generator) -> int:
        return self.sizes[int(rng.integers(len(self.sizes)))]


class MultiScale:
    """The input size of each step: a new draw every ``every`` steps; the largest in the first period and in each
    period that starts after step ``stop - final`` (``stop``: the run's steps; unset: no end rule)."""

    def __init__(self, draw: DarknetDraw | ListDraw | Sequence[int], every: int = 10, seed: int = 0,
                 stop: int | None = None, final: int = 0):
        self.draw = draw if isinstance(draw, (DarknetDraw, ListDraw)) else ListDraw(draw)
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"multiscale.every must be an integer >= 1, got {every!r}")
        if seed < 0:
            raise ValueError(f"the seed must be >= 0, got {seed}")
        if final < 0:
            raise ValueError(f"multiscale.final must be >= 0, got {final}")
        self.sizes = self.draw.sizes
        """Every size a step can take."""
        self.every, self.seed, self.stop, self.final = int(every), int(seed), stop, int(final)
        self.largest = max(self.sizes)

    def period(self, step: int) -> int:
        """The index ``k = step // every`` of the period holding ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return step // self.every

    def final_start(self) -> int | None:
        """The first step of the run's final stretch at the largest size (None without ``stop``): the first
        multiple of ``every`` above ``stop - final`` (Darknet: ``iteration > max_batches - 100`` at a period's top)."""
        if self.stop is None:
            return None
        return max(0, ((self.stop - self.final) // self.every + 1) * self.every)

    def size_at(self, step: int) -> int:
        """The input size at optimizer step ``step`` (counted from 0); see the module docstring."""
        k = self.period(step)
        if k == 0 or (self.stop is not None and k * self.every > self.stop - self.final):
            return self.largest
        return self.draw(np.random.default_rng([self.seed, k, _SALT]))


def describe(cfg: RunConfig, steps: int) -> str | None:
    """``bigbatch show``'s line for a detector's multi-scale training over ``steps`` steps (None without it): the
    sizes, how they are drawn, how often, and the steps at the largest size."""
    settings = cfg.data.multiscale
    if not cfg.data.is_detection or settings.sizes is None:
        return None
    draw = draw_for(settings.sizes, cfg.data.size, settings.range)
    final = MultiScale(draw, settings.every, stop=steps, final=settings.final).final_start()
    rule = "Darknet's rule" if settings.sizes == "auto" else "drawn uniformly"
    return (f"multi-scale     {', '.join(map(str, draw.sizes))} ({rule}, a new size every {settings.every} steps; "
            f"the first {settings.every} and the last {max(0, steps - final)} at {max(draw.sizes)})")
