"""AdaScale: the LR and the progress of a recipe written for a base batch, at a larger batch, from the measured
gradient noise (Johnson, Agrawal, Gu and Guestrin, "AdaScale SGD: A User-Friendly Algorithm for Distributed
Training", ICML 2020, Algorithm 1).

A recipe is written for a base batch B0: lr_base(t) over T base steps. At a batch B = S B0 each step's gain is

    r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2)          1 <= r <= S

with sigma^2 the variance of a base-batch gradient and mu^2 = |G|^2 the squared norm of the true gradient. The step
takes the LR ``r * lr_base(floor(tau))`` and advances the schedule by r base steps, ``tau += r``; the run ends once
``tau >= T``. Where the gradient is all signal (sigma^2 << mu^2) a larger batch helps nothing and r = 1: the LR and
progress of one base step; where it is all noise, r = S: the linear scaling rule.

bigbatch's estimates are McCandlish et al.'s (``telemetry/noise_scale.py``), from the micro-batches of each step:
tr(Sigma), the per-image gradient covariance's trace, and |G|^2, each an exponential moving average over steps
(decay 0.95, as the noise-scale telemetry). A base-batch gradient's variance is sigma^2 = tr(Sigma) / B0, so

    r = (B_simple / B0 + 1) / (B_simple / B + 1),        B_simple = tr(Sigma) / |G|^2.

The gain of step t comes from the steps before it (the LR is set before the step's gradient exists); the first
step, with no estimate yet, has r = 1. A smoothed |G|^2 <= 0 (noise only, early on) gives r = S, a tr(Sigma) < 0
r = 1; r is clipped to [1, S], the bounds the formula has for true quantities. The weight EMA advances with the
progress too: its decay per step is ``d ** r`` (``d`` per base step).

Growing (``grow: true``). The batch starts at B0 and doubles, up to ``max``, while the measured noise scale
B_simple is at least twice the batch: McCandlish et al. (2018) show that below B_simple a larger batch cuts the
steps nearly in proportion to its size at almost no cost in images, and above it less and less; doubling only while
the doubled batch stays at or below B_simple keeps every step in the range where a larger batch still pays. A
decision waits for :data:`SETTLE` measurements since the run's start or the last change (the moving averages have
then mostly forgotten the steps before), and the micro-batch stays what it was, so memory stays what ``plan``
measured: a larger batch is more micro-batches per step. AdaScale's gain then follows the batch in effect
(S = B / B0), whatever rule chose it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bigbatch.state_schema import Real, Schema, Whole, check_state
from bigbatch.telemetry.noise_scale import GradientNorms, NoiseScale

SETTLE = 20
"""Measurements before a growth decision, since the start or the last change: 1 / (1 - 0.95), the moving averages'
time constant."""


def gain(trace_sigma: float | None, gradient_sq: float | None, base: int, batch: int) -> float:
    """AdaScale's gain ratio r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2), sigma^2 = tr(Sigma) / base, mu^2 = |G|^2,
    S = batch / base; 1 without estimates, clipped to [1, S] (see the module docstring)."""
    scale = batch / base
    if trace_sigma is None or gradient_sq is None or trace_sigma < 0:
        return 1.0
    if gradient_sq <= 0:
        return scale
    variance = trace_sigma / base
    r = (variance + gradient_sq) / (variance / scale + gradient_sq)
    return min(max(r, 1.0), scale) if math.isfinite(r) else 1.0


class AdaScale:
    """One run's AdaScale state: the noise estimates, the progress ``tau`` in base steps, the gain of the step in
    progress. Per step: ``begin_step(batch)`` (the gain), ``lr(lr_base)``, the step, ``end_step(norms, ...)``."""

    def __init__(self, base: int, total: int, decay: float = 0.95, grow_to: int | None = None,
                 unit: int = 1) -> None:
        if base < 1 or total < 1:
            raise ValueError(f"AdaScale needs base >= 1 and total >= 1, got {base}, {total}")
        self.base, self.total = base, total
        """The base batch B0 and the base schedule's length T, in base steps."""
        self.grow_to, self.unit = grow_to, unit
        """``grow: true``: the largest batch, and the unit every batch is a multiple of (world x micro-batch)."""
        self.measured_since_change = 0
        """Measurements since the start or the batch's last change (a growth decision waits for SETTLE)."""
        self.noise = NoiseScale(decay)
        self.progress = 0.0
        """tau: base steps done (sum of the gains of the steps done)."""
        self.gain = 1.0
        """r of the step in progress (or of the last one)."""
        self.batch = base
        """The global batch of the step in progress."""

    @property
    def finished(self) -> bool:
        """The base schedule is done: no step is left."""
        return self.progress >= self.total

    @property
    def last_step(self) -> bool:
        """The step in progress finishes the base schedule."""
        return self.progress + self.gain >= self.total

    @property
    def scale(self) -> float:
        """S = B / B0 of the step in progress."""
        return self.batch / self.base

    def begin_step(self, batch: int) -> float:
        """The gain r of the next step, at a global batch of ``batch`` images, from the estimates so far."""
        self.batch = batch
        self.gain = gain(self.noise.trace_sigma, self.noise.gradient_sq, self.base, batch)
        return self.gain

    def lr(self, lr_base: Callable[[int], float]) -> float:
        """The step's LR: r x lr_base(floor(tau)) (the base schedule's last step at most)."""
        return self.gain * lr_base(min(math.floor(self.progress), self.total - 1))

    def end_step(self, norms: GradientNorms | None, b_small: int, b_big: int) -> None:
        """The step is done: tau += r, and its measurement (None: none, e.g. not finite) joins the estimates."""
        self.progress += self.gain
        if norms is not None:
            self.noise.update(norms.small_sq, b_small, norms.big_sq, b_big)
            self.measured_since_change += 1

    def grown_batch(self) -> int | None:
        """``grow: true``: the batch of the next step where it doubles (see the module docstring), else None."""
        if self.grow_to is None or self.batch >= self.grow_to or self.measured_since_change < SETTLE:
            return None
        b_simple = self.noise.b_simple
        if b_simple is None or b_simple < 2 * self.batch:
            return None
        batch = min(2 * self.batch, self.grow_to) // self.unit * self.unit
        if batch <= self.batch:
            return None
        self.measured_since_change = 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"progress": self.progress, "gain": self.gain, "batch": self.batch, "noise": self.noise.state_dict(),
                "measured_since_change": self.measured_since_change}

    def state_schema(self) -> Schema:
        """What :meth:`state_dict` holds, value by value (``state_schema.py``): the batch at least the base, the gain
        in [1, batch / base] (the bounds of r), the noise estimates :class:`NoiseScale`'s."""
        return {"progress": Real(0.0), "batch": Whole(self.base),
                "gain": Real(1.0, lambda state: state["batch"] / self.base), "noise": NoiseScale.STATE_SCHEMA,
                "measured_since_change": Whole(default=0)}  # absent before growing

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's state, each value checked (a checkpoint may be hostile): ``StateError`` (a ``ValueError``)
        names the bad one."""
        state = check_state(self.state_schema(), state)
        self.noise.load_state_dict(state["noise"])
        self.progress, self.gain, self.batch = state["progress"], state["gain"], state["batch"]
        self.measured_since_change = state["measured_since_change"]
