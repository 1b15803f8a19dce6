"""The sections of what a run writes and watches: evaluation (``eval``), checkpoints (``checkpoint``), training
records (``log``), memory sampling (``memory``) and fault injection for tests (``debug``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from bigbatch.config.section import Section
from bigbatch.config.values import Interval, Size


class EvalConfig(Section):
    every: Interval = 50
    """Evaluate every this many optimizer steps (or epochs, images), and always at the end."""
    batch: int = Field(256, gt=0)
    """Images per evaluation forward pass (any size: every validation image is seen once)."""
    metric: str | None = None
    """Metric that selects ``best.pt``: classification ``top1`` (default), ``top5`` or ``loss``; detection ``mAP``
    (default, AP@[.5:.95]), ``mAP50``, ``mAP75``, ``mAP_small``, ``mAP_medium``, ``mAP_large``, ``AP/<class>``."""
    mode: Literal["max", "min"] | None = None
    """Whether a higher or a lower ``metric`` is better; unset: ``min`` for ``loss``, else ``max``."""

    @property
    def better(self) -> str:
        return self.mode or ("min" if self.metric == "loss" else "max")


class CheckpointConfig(Section):
    every: Interval = 50
    """Write ``checkpoints/last.pt`` every this many optimizer steps (or epochs, images), and always at the end."""


class LogConfig(Section):
    every: int = Field(10, gt=0)
    """Write a training record to ``metrics.jsonl`` every this many steps (and the first and last)."""
    tensorboard: bool = True
    timing: Literal["off", "events", "exact"] = "events"
    """Phase times of the logged steps in the training records (``t_data``, ``t_forward``, ``t_backward``, ``t_sync``,
    ``t_update``, ``t_other``, ``t_step``) and the table of their shares at the end (``engine/phases.py``): ``events``
    (the host clock; CUDA events on a GPU, read at the logged steps only), ``exact`` (the device synchronised at
    every phase), ``off``."""
    noise_scale: bool = True
    """Estimate the gradient noise scale (McCandlish et al. 2018) from the micro-batch gradients every step and put it
    in the training records as ``noise_scale`` (images); absent when a step has one micro-batch in all."""
    updates: bool = True
    """Every ``every`` steps, each parameter tensor's largest update and relative update size, in ``updates.csv``
    of the run directory, and the ten largest relative updates in the training record as ``top_updates``."""

    @field_validator("timing", mode="before")
    @classmethod
    def _off_is_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads an unquoted ``off`` as false


class MemoryConfig(Section):
    interval: float = Field(5.0, ge=0.001)
    """Seconds between two samples of ``memory.csv`` (the tegrastats interval of the Darknet-on-Jetson write-up,
    docs/references.md); at least 1 ms, at most 1,000 rows a second (``1e-300`` spun the sampler's thread)."""
    limit: Size | None = None
    """On the CPU, a micro-batch starting while the process's RSS exceeds this counts as out of memory
    (``subdivisions`` is doubled, or an odd micro-batch cut by its smallest prime factor, and the step re-run). On
    CUDA the device's own out-of-memory error does."""
    keep_freed: bool = True
    """Keep the host memory a step frees in malloc's heap for the next micro-batch instead of handing it back to
    the kernel, which would fault its pages in again each time (glibc's malloc thresholds raised to 1 GiB;
    ``engine/host_memory.py``). Faster on the CPU; the price is a higher peak RSS (docs/memory.md), and between
    steps the RSS stays at its high-water mark."""


class DebugConfig(Section):
    """Fault injection for tests."""

    oom_at_step: int | None = Field(None, ge=0)
    """Raise an out-of-memory error at the second micro-batch of this optimizer step (0-based), once."""
    nonfinite_at_step: int | None = Field(None, ge=0)
    """Make the gradients of this optimizer step (0-based) NaN."""
    nonfinite_repeats: int = Field(1, gt=0)
    """How many attempts at that step get NaN gradients (each retry of a skipped step is an attempt)."""
