"""The gradient noise scale B_simple, measured for free from the micro-batches of an accumulated step.

McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training", Appendix A.1. With G the
true gradient and Sigma the per-example gradient covariance, a gradient averaged over a batch of B examples has
E|G_B|^2 = |G|^2 + tr(Sigma) / B. Measured at two batch sizes B_small < B_big this gives the unbiased estimators

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

and the noise scale B_simple = tr(Sigma) / |G|^2, the batch size above which larger batches stop paying off
(linearly). Each estimate is noisy; as the paper advises, |G|^2 and tr(Sigma) are each smoothed by an exponential
moving average over steps and B_simple is the ratio of the two averages (not an average of ratios).

Within one accumulated step bigbatch already computes S micro-batch gradients of b images each (Darknet's
``subdivisions``): micro-batch i's backward of ``loss_i * scale / S`` adds ``(scale / S) g_i`` to
``.grad``, g_i being the gradient of micro-batch i's mean loss. :class:`MicroBatchGradients` reads (scale / S) g_i
where autograd hands it to a hook on each parameter before adding it to ``.grad`` (a norm per parameter and
micro-batch; no extra forward or backward, no gradient-sized buffer) and gives

    small_sq = mean_i |g_i|^2                (B_small = b)
    big_sq   = |G_big|^2, G_big = mean_i g_i = (accumulated .grad after the last backward) / scale
                                             (B_big = S b, times the world size under DDP)

which :class:`NoiseScale` turns into the smoothed estimates. ``E[mean_i |g_i|^2] = E|G_b|^2``: averaging the S
small measurements only lowers the variance.

DDP. Micro-batches 0..S-2 run under ``no_sync``; the last backward all-reduces, so afterwards ``.grad`` is the
average over the W processes. With ``world > 1`` the small estimate uses micro-batches 0..S-2 (local, b images
each) and G_big is the final, all-reduced gradient, at B_big = W S b (see :func:`batch_sizes`). A step of a
single micro-batch has no two batch sizes on one process (S = 1, or S = 1 per process under DDP): no measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from bigbatch.state_schema import Real, Schema, Whole, check_state


def batch_sizes(micro_batch: int, subdivisions: int, world: int = 1) -> tuple[int, int]:
    """(B_small, B_big) of one step's measurement: (b, world * S * b), b images per micro-batch."""
    return micro_batch, world * subdivisions * micro_batch


def gradient_sq_estimate(small_sq: float, b_small: int, big_sq: float, b_big: int) -> float:
    """|G|^2 ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small) (McCandlish et al. 2018, eq. A.2)."""
    return (b_big * big_sq - b_small * small_sq) / (b_big - b_small)


def trace_sigma_estimate(small_sq: float, b_small: int, big_sq: float, b_big: int) -> float:
    """tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big) (McCandlish et al. 2018, eq. A.3)."""
    return (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)


class NoiseScale:
    """Smoothed |G|^2 and tr(Sigma) and their ratio B_simple = tr(Sigma) / |G|^2 (see the module docstring).

    Each of the two estimates is an exponential moving average ``m_t = decay m_(t-1) + (1 - decay) x_t``, read with
    Adam's bias correction ``m_t / (1 - decay^t)`` so that the first steps are not pulled toward 0 (the correction
    cancels in the ratio B_simple, it matters for ``gradient_sq`` and ``trace_sigma`` themselves).
    """

    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"NoiseScale decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.steps = 0
        """Measurements averaged so far."""
        self.ignored = 0
        """Measurements not averaged because they were not finite (a step whose gradient overflowed)."""
        self._gradient_sq = 0.0  # the raw (biased) moving averages
        self._trace_sigma = 0.0

    def update(self, small_sq: float, b_small: int, big_sq: float, b_big: int) -> None:
        """Add one step's measurement: ``small_sq`` = |G_small|^2 at batch ``b_small``, ``big_sq`` = |G_big|^2 at
        batch ``b_big`` > ``b_small``. A measurement that is not finite (an overflowed fp16 gradient) is ignored
        (counted in ``ignored``)."""
        if not 1 <= b_small < b_big:
            raise ValueError(f"NoiseScale.update needs 1 <= b_small < b_big, got b_small={b_small}, b_big={b_big}")
        if not (math.isfinite(small_sq) and math.isfinite(big_sq)):
            self.ignored += 1
            return
        g2 = gradient_sq_estimate(small_sq, b_small, big_sq, b_big)
        tr = trace_sigma_estimate(small_sq, b_small, big_sq, b_big)
        self._gradient_sq = self.decay * self._gradient_sq + (1.0 - self.decay) * g2
        self._trace_sigma = self.decay * self._trace_sigma + (1.0 - self.decay) * tr
        self.steps += 1

    def _corrected(self, raw: float) -> float | None:
        if self.steps == 0:
            return None
        return raw / (1.0 - self.decay**self.steps)

    @property
    def gradient_sq(self) -> float | None:
        """The smoothed estimate of |G|^2 (None before the first measurement). It can be <= 0 early on: the
        estimator is unbiased, not positive, and a few noisy steps can make it so."""
        return self._corrected(self._gradient_sq)

    @property
    def trace_sigma(self) -> float | None:
        """The smoothed estimate of tr(Sigma) (None before the first measurement)."""
        return self._corrected(self._trace_sigma)

    @property
    def b_simple(self) -> float | None:
        """B_simple = tr(Sigma) / |G|^2, ratio of the smoothed estimates. None before the first measurement, and
        None while the smoothed |G|^2 is <= 0 or the smoothed tr(Sigma) < 0: both are true quantities >= 0 whose
        unbiased estimates can come out negative from noise (typically in the first steps, or when the batch is far
        below the noise scale); the ratio is then meaningless rather than merely imprecise."""
        if self.steps == 0 or self._gradient_sq <= 0.0 or self._trace_sigma < 0.0:
            return None
        return self._trace_sigma / self._gradient_sq  # the bias corrections cancel

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "steps": self.steps, "ignored": self.ignored,
                "gradient_sq": self._gradient_sq, "trace_sigma": self._trace_sigma}

    STATE_SCHEMA: Schema = {"decay": Real(0.0, 1.0, high_open=True), "steps": Whole(), "ignored": Whole(),
                            "gradient_sq": Real(), "trace_sigma": Real()}
    """What :meth:`state_dict` holds, value by value (``state_schema.py``): a checkpoint's state is checked on it."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's averages, each value checked (a checkpoint may be hostile): ``StateError`` (a
        ``ValueError``) names the bad one."""
        state = check_state(self.STATE_SCHEMA, state)
        self.decay, self.steps, self.ignored = state["decay"], state["steps"], state["ignored"]
        self._gradient_sq, self._trace_sigma = state["gradient_sq"], state["trace_sigma"]


class GradientNorms(NamedTuple):
    """One step's measurement, in the un-scaled gradient of the mean loss of a micro-batch."""

    small_sq: float
    """mean_i |g_i|^2 over the micro-batches measured (B_small = b)."""
    big_sq: float
    """|G_big|^2, G_big the step's gradient (B_big = world * S * b)."""


class MicroBatchGradients:
    """Measures mean_i |g_i|^2 and |mean_i g_i|^2 of an accumulated step: g_i from a hook on each parameter, which
    autograd calls with micro-batch i's gradient before adding it to ``.grad`` (see the module docstring).

    Per run: ``attach(params)`` before the first backward (a hook on every parameter that requires a gradient),
    ``detach()`` at the end. Per step: ``begin_step(scale, S)`` (before micro-batch 0's forward, each attempt),
    ``after_backward(i)`` after each micro-batch's backward, ``end_step()`` once the last backward ran (it reads no
    gradient: before or after the optimizer step alike).

    Memory: no gradient-sized buffer (a norm per parameter and micro-batch). Time: per micro-batch one norm of each
    parameter's gradient as autograd hands it over (while it is fresh in cache), and after the last backward one
    norm over ``.grad``, as batched kernels on the gradients' device; the squared norms stay on the device (float64)
    and ``end_step`` makes the only host transfer. Each norm is formed in float32 per tensor from the gradient as
    autograd has it (times the loss scale), i.e. the scaled norm must stay below ~1.8e19.

    Assumes every micro-batch's loss was multiplied by ``scale / S`` before its backward and that ``.grad`` holds
    their sum after the last backward (autograd's accumulation; under DDP, averaged over the processes).

    ``world``: the number of DDP processes. With ``world > 1`` the last micro-batch (whose backward all-reduces) is
    left out of the small estimate, which then needs S >= 2 micro-batches per process.
    """

    def __init__(self, world: int = 1) -> None:
        if world < 1:
            raise ValueError(f"MicroBatchGradients world must be >= 1, got {world}")
        self.world = world
        self._params: list[torch.Tensor] = []
        self._handles: list[Any] = []
        self._norms: list[torch.Tensor] = []  # this micro-batch's, one per parameter whose gradient arrived
        self._begun = False
        self.scale = 1.0
        self.subdivisions = 1
        self._next = 0
        self._small: torch.Tensor | None = None  # sum over measured micro-batches of |scaled g_i|^2, float64
        self._small_count = 0
        self._big: torch.Tensor | None = None  # |scaled accumulated gradient|^2 after the last backward, float64
        self._device = torch.device("cpu")  # the gradients' (where a reduce's tensor must be)

    def attach(self, params: Iterable[torch.Tensor]) -> None:
        """Hook every floating-point parameter of ``params`` (once per tracker; ``detach`` removes), those frozen now
        too (``model.freeze``): a tensor hook fires whenever its parameter gets a gradient, so a layer measures from
        the step its freeze ends (registering needs ``requires_grad`` on for the moment it takes)."""
        if self._handles:
            raise RuntimeError("MicroBatchGradients.attach: already attached (detach first)")
        self._params = [p for p in params if p.is_floating_point()]
        for p in self._params:
            frozen = not p.requires_grad
            p.requires_grad_(True)
            self._handles.append(p.register_hook(self._record))
            p.requires_grad_(not frozen)
        if self._params:  # where the sums live, also for a micro-batch that gives no parameter a gradient
            self._device = self._params[0].device

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._params, self._norms = [], [], []

    def _record(self, grad: torch.Tensor | None) -> None:
        """autograd's hook: ``grad`` is one parameter's gradient of the running backward, before accumulation."""
        if self._begun and grad is not None:
            self._norms.append(torch.linalg.vector_norm(grad.detach(), dtype=torch.float32))

    def begin_step(self, scale: float, subdivisions: int) -> None:
        """Start measuring a step (an attempt) of ``subdivisions`` micro-batches whose losses are multiplied by
        ``scale / subdivisions`` before their backward."""
        if subdivisions < 1 or not scale > 0:
            raise ValueError(f"begin_step needs subdivisions >= 1 and scale > 0, got {subdivisions}, {scale}")
        if not self._handles:
            raise RuntimeError("MicroBatchGradients.begin_step: attach(params) first")
        self.scale, self.subdivisions = float(scale), subdivisions
        self._begun, self._next = True, 0
        self._norms = []  # an attempt that failed mid-backward leaves some
        self._small, self._small_count, self._big = None, 0, None

    @staticmethod
    def _sum_sq(norms: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """sum_k n_k^2 in float64 on ``device``, without a host sync."""
        if not norms:
            return torch.zeros((), dtype=torch.float64, device=device)
        return torch.stack([n.to(device=device, dtype=torch.float64) for n in norms]).square().sum()

    def after_backward(self, index: int) -> None:
        """After micro-batch ``index``'s backward: sum its gradients' |.|^2 (the hooks' norms), and after the last
        one |.grad|^2."""
        if not self._begun or index != self._next or index >= self.subdivisions:
            raise RuntimeError(f"MicroBatchGradients.after_backward({index}) out of order: begin_step first, then "
                               f"indices 0..{self.subdivisions - 1} in order (expected {self._next})")
        self._next += 1
        last = index == self.subdivisions - 1
        norms, self._norms = self._norms, []
        if norms:
            self._device = norms[0].device
        if self.subdivisions > 1 and not (last and self.world > 1):
            # (scale / S) g_i; a micro-batch that gave no parameter a gradient has g_i = 0
            change_sq = self._sum_sq(norms, self._device)
            self._small = change_sq if self._small is None else self._small + change_sq
            self._small_count += 1
        if last:
            grads = [p.grad.detach() for p in self._params if p.grad is not None]
            if grads:
                self._device = grads[0].device
                self._big = self._sum_sq(list(torch._foreach_norm(grads)), self._device)

    def end_step(self, reduce: Callable[[torch.Tensor], None] | None = None) -> GradientNorms | None:
        """(mean_i |g_i|^2, |G_big|^2) of the step, un-scaled: g_i = (S / scale) x (the gradient micro-batch i's
        backward added to .grad), G_big = .grad / scale after the last. None when the step had a single micro-batch
        (per process), when no gradient was seen, or when the gradient was not finite. One host transfer.

        ``reduce``: an in-place sum over the processes (``torch.distributed.all_reduce``), called on every process
        with the float64 tensor (sum of the measured |(scale / S) g_i|^2, their count, |G_big|^2): the small estimate is
        then the mean over every process's measured micro-batches and |G_big|^2 the processes' mean, the same on
        every process (AdaScale's steps must agree)."""
        if not self._begun or self._next != self.subdivisions:
            raise RuntimeError(f"MicroBatchGradients.end_step after {self._next} of {self.subdivisions} "
                               f"micro-batches: call after_backward for each first")
        self._begun = False
        if reduce is not None:
            nothing = torch.tensor(math.nan, dtype=torch.float64, device=self._device)
            big = self._big if self._big is not None else nothing
            small_sum = self._small if self._small is not None else torch.zeros_like(big)
            sums = torch.stack([small_sum, torch.tensor(float(self._small_count), dtype=torch.float64,
                                                        device=big.device), big])
            reduce(sums)
            total, count, big_sum = sums.tolist()
            if count == 0:
                return None
            small, big_sq = total / count, big_sum / self.world
        else:
            if self._big is None or self._small_count == 0:
                return None
            small_sum = self._small if self._small is not None else torch.zeros_like(self._big)
            small, big_sq = torch.stack([small_sum / self._small_count, self._big]).tolist()
        small *= (self.subdivisions / self.scale) ** 2
        big_sq /= self.scale**2
        if not (math.isfinite(small) and math.isfinite(big_sq)):
            return None
        return GradientNorms(small, big_sq)
