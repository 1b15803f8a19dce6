"""BatchNorm running statistics under large batches: the momentum of each update, and one update per step.

When one optimizer step of ``batch`` images runs as ``subdivisions`` micro-batches, PyTorch's BatchNorm
updates its running mean and variance after every training forward (``norm.running_stats: per_microbatch``):
N = subdivisions updates per step, each from one micro-batch of ``batch / (world * subdivisions)`` images.

**Momentum.** PyTorch's convention is running = (1 - m) * running + m * batch_stat, a decay alpha = 1 - m per
update. Cloud TPU's "Advanced Guide to Inception v3" (its moving-average section; docs/references.md)
shows that N sequential updates with decay alpha weigh the old value by alpha ** N, so one update that should
replace them uses beta = alpha ** N (GPU alpha = 0.9997 -> TPU beta = 0.9976 for N = 8). ``norm.momentum`` is
stated per optimizer step, so we read that relation the other way round: each of the N updates of a step uses

    alpha_update = alpha_step ** (1 / N),        m_update = 1 - (1 - m_step) ** (1 / N)

(N = subdivisions for ``per_microbatch``, 1 for ``per_step``). ``norm.half_life_images`` H states the decay in
images instead: an observation's weight halves after H images, so an update that covers n images uses

    alpha = 0.5 ** (n / H),                       m = 1 - 0.5 ** (n / H)

with n the images whose statistics the update averages (:func:`images_per_update`). N such updates weigh the old
value by 0.5 ** (N n / H): the guide's beta = alpha ** N, so the window is H images whatever n and N are.

    running_stats       norm.sync, world > 1            no sync, or one process
    per_microbatch      world * micro_batch             micro_batch
    per_step            batch (pooled by ``reduce``)    batch // world

With ``norm.sync`` each update is made from every device's images (``bigbatch``'s layer and torch's SyncBatchNorm
update the buffers with the all-reduced mean and variance; ``per_step`` all-reduces its sums), so every layout
decays the running statistics by 0.5 ** (batch / H) a step: 1 process x 8 micro-batches and 2 x 4 keep the same
window. Without sync each device averages only its own images and the buffers every process keeps are rank 0's
(DDP's ``broadcast_buffers``), so H counts the images rank 0's statistics saw: 1/world of each step's, a window of
world x H training images. ``norm.momentum`` (per step) needs neither. Neither set: each layer keeps its own.

**One update per step** (``per_step``, :class:`PerStepRunningStats`). In training every BN layer still
normalises each micro-batch with that micro-batch's own statistics, exactly as PyTorch does, but its running
buffers are not touched by the forward. A forward pre-hook adds the per-channel count, sum and sum of squares
of the layer's input (its fp32 mean and variance, turned into float64 sums, outside autocast) to the step's
totals and switches ``track_running_stats``
off for that one forward (so ``F.batch_norm`` gets no running buffers; a forward hook switches it back).
``end_step()``, called once after each optimizer step, updates each layer once with the pooled mean and the
pooled unbiased variance (times n / (n - 1), as PyTorch does for ``running_var``), with the layer's momentum
(or PyTorch's cumulative average when the momentum is None), and counts one batch in ``num_batches_tracked``.
The running statistics are then those of the whole step, whatever ``subdivisions`` is. Eval mode is unchanged.

In a multi-process run each process pools only its own images. To pool the whole global batch, pass
``reduce``: it gets the packed float64 vector of all layers' (count, sums, sums of squares) and returns the
reduced one, e.g. ``lambda t: (torch.distributed.all_reduce(t), t)[1]``: one all-reduce per step. Every
process must then have run the same BN layers at least once, so that the packed vectors line up.
A layer that saw no input in a step is left untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from bigbatch.batching import BatchPlan
from bigbatch.config import NormConfig

Reduce = Callable[[torch.Tensor], torch.Tensor]
"""Takes the packed float64 sums of this process and returns the sums over all processes."""


# --- momentum -----------------------------------------------------------------------------------------


def momentum_per_update(momentum_per_step: float, updates_per_step: int) -> float:
    """The momentum of each of N updates that together decay like one update with ``momentum_per_step``.

    m_update = 1 - (1 - m_step) ** (1 / N), i.e. alpha_update ** N = alpha_step: the Inception v3 TPU guide's
    beta = alpha ** N read the other way round.
    """
    return -math.expm1(math.log1p(-momentum_per_step) / updates_per_step)


def momentum_from_half_life(images_per_update: float, half_life_images: float) -> float:
    """The momentum of an update covering n images when an observation's weight halves after H images.

    alpha = 0.5 ** (n / H), so m = 1 - 0.5 ** (n / H).
    """
    return -math.expm1(math.log(0.5) * images_per_update / half_life_images)


def updates_per_step(cfg: NormConfig, plan: BatchPlan) -> int:
    """Running-statistics updates per optimizer step: ``subdivisions`` (per_microbatch) or 1 (per_step)."""
    return plan.subdivisions if cfg.running_stats == "per_microbatch" else 1


def synchronised(cfg: NormConfig, plan: BatchPlan) -> bool:
    """Whether each update averages every device's images: ``norm.sync`` on more than one process (as
    ``engine/parts.py`` converts the layers, and all-reduces the ``per_step`` sums, exactly then)."""
    return cfg.sync != "none" and plan.world > 1


def images_per_update(cfg: NormConfig, plan: BatchPlan) -> int:
    """Images whose statistics one running-statistics update averages: a micro-batch, or the step's images, of
    every device under ``norm.sync``, else of this one (rank 0's, whose buffers DDP keeps on every process)."""
    devices = plan.world if synchronised(cfg, plan) else 1
    per_device = plan.micro_batch if cfg.running_stats == "per_microbatch" else plan.batch // plan.world
    return per_device * devices


def bn_momentum(cfg: NormConfig, plan: BatchPlan) -> float | None:
    """The PyTorch BN momentum of each running-statistics update, from ``norm.momentum`` (per optimizer step)
    or ``norm.half_life_images``; None when neither is set (keep the model's own)."""
    if cfg.momentum is not None:
        return momentum_per_update(cfg.momentum, updates_per_step(cfg, plan))
    if cfg.half_life_images is not None:
        return momentum_from_half_life(images_per_update(cfg, plan), cfg.half_life_images)
    return None


def batchnorm_layers(model: nn.Module) -> Iterator[_BatchNorm]:
    """Every BatchNorm1d/2d/3d, SyncBatchNorm (and lazy variant) of ``model``."""
    return (m for m in model.modules() if isinstance(m, _BatchNorm))


def running_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Every BN layer's running mean, running variance and batch counter."""
    return [b for layer in batchnorm_layers(model) for b in layer.buffers(recurse=False)]


class RunningStatsSnapshot:
    """The BN running statistics before a step, to put back if the step is not applied (non-finite)."""

    def __init__(self, model: nn.Module):
        self.buffers = running_buffers(model)
        self.saved = [b.clone() for b in self.buffers]

    @torch.no_grad()
    def restore(self) -> None:
        for buffer, saved in zip(self.buffers, self.saved, strict=True):
            buffer.copy_(saved)


def grown_momentum(momentum: float, growth: float) -> float:
    """The per-step momentum of a batch ``growth`` times the one ``momentum`` is stated for, when its statistics are
    updated once per step: ``1 - (1 - m) ** growth`` (alpha ** N, the Inception v3 TPU guide's beta = alpha ** N),
    so that an image's weight decays the same per image seen."""
    return -math.expm1(math.log1p(-momentum) * growth)


def set_momentum(model: nn.Module, cfg: NormConfig, plan: BatchPlan, growth: float = 1.0,
                 layer_momentum: dict[nn.Module, float | None] | None = None) -> None:
    """Give every BN layer the momentum ``cfg`` asks for under ``plan`` (nothing when it asks for none). ``growth``:
    under per-step statistics, the batch in effect over the first (a batch schedule); a layer's own momentum
    (``layer_momentum``, when ``cfg`` sets none) is then grown too."""
    momentum = bn_momentum(cfg, plan)
    if momentum is not None and cfg.momentum is not None and growth != 1.0:
        momentum = grown_momentum(momentum, growth)  # a half-life is in images already: plan's batch says it
    for layer in batchnorm_layers(model):
        if momentum is not None:
            layer.momentum = momentum
        elif growth != 1.0 and layer_momentum and layer_momentum.get(layer) is not None:
            layer.momentum = grown_momentum(layer_momentum[layer], growth)
        elif layer_momentum and layer in layer_momentum:
            layer.momentum = layer_momentum[layer]


def configure_batchnorm(
    model: nn.Module, cfg: NormConfig, plan: BatchPlan, *, reduce: Reduce | None = None
) -> PerStepRunningStats | None:
    """Set every BN layer's momentum from ``cfg``; for ``per_step`` return the hooks that update the running
    statistics once per optimizer step (call ``end_step()`` after each step), else None."""
    set_momentum(model, cfg, plan)
    if cfg.running_stats == "per_step":
        return PerStepRunningStats(model, reduce)
    return None


# --- one running-statistics update per optimizer step ---------------------------------------------------


class _Pooled:
    """One BN layer's input statistics over the micro-batches of the current step."""

    def __init__(self, layer: _BatchNorm):
        self.layer = layer
        self.count = 0
        self.sums: torch.Tensor | None = None  # float64, per channel; allocated at the first input
        self.squares: torch.Tensor | None = None

    def before_forward(self, layer: _BatchNorm, args: tuple[Any, ...]) -> None:
        if not layer.training:
            return
        x = args[0]
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            dims = [0, *range(2, x.dim())]  # all but the channel dimension
            n = x.numel() // x.shape[1]
            # The micro-batch's moments in fp32 (no float64 copy of the activation), pooled in float64.
            var, mean = torch.var_mean(x.detach().float(), dim=dims, correction=0)
            mean, var = mean.double(), var.double()
            sums, squares = mean * n, (var + mean.square()) * n
        if self.sums is None:
            self.sums, self.squares = sums, squares
        else:
            self.sums += sums
            self.squares += squares
        self.count += n
        layer.track_running_stats = False  # normalise with the batch statistics, leave the buffers alone

    def after_forward(self, layer: _BatchNorm, args: tuple[Any, ...], output: Any) -> None:
        layer.track_running_stats = True

    def packed(self) -> torch.Tensor:
        assert self.sums is not None and self.squares is not None
        return torch.cat([self.sums.new_tensor([self.count]), self.sums, self.squares])

    @torch.no_grad()
    def update(self, count: float, sums: torch.Tensor, squares: torch.Tensor) -> None:
        """PyTorch's running update, once, with the pooled mean and unbiased variance."""
        layer = self.layer
        mean = sums / count
        var = ((squares - count * mean.square()) / max(count - 1, 1)).clamp_(min=0)  # unbiased: n / (n - 1)
        layer.num_batches_tracked.add_(1)
        m = layer.momentum if layer.momentum is not None else 1.0 / float(layer.num_batches_tracked)
        layer.running_mean.copy_(torch.lerp(layer.running_mean.double(), mean, m))
        layer.running_var.copy_(torch.lerp(layer.running_var.double(), var, m))

    def reset(self) -> None:
        self.count = 0
        if self.sums is not None and self.squares is not None:
            self.sums.zero_()
            self.squares.zero_()


class PerStepRunningStats:
    """Makes the BN running statistics of ``model`` independent of ``subdivisions``: the statistics of all
    micro-batches of a step are pooled and applied once, at :meth:`end_step` (see the module docstring)."""

    def __init__(self, model: nn.Module, reduce: Reduce | None = None):
        self.reduce = reduce
        self._pooled = [_Pooled(layer) for layer in batchnorm_layers(model) if layer.track_running_stats]
        self._handles = []
        for pooled in self._pooled:
            self._handles.append(pooled.layer.register_forward_pre_hook(pooled.before_forward))
            self._handles.append(pooled.layer.register_forward_hook(pooled.after_forward, always_call=True))

    def end_step(self) -> None:
        """Update every layer that saw input since the last call once, with the pooled statistics."""
        pooled = [p for p in self._pooled if p.sums is not None]
        if not pooled:
            return
        packed = torch.cat([p.packed() for p in pooled])
        if self.reduce is not None:
            packed = self.reduce(packed)
        chunks = packed.split([1 + 2 * p.sums.numel() for p in pooled])
        counts = torch.stack([chunk[0] for chunk in chunks]).tolist()  # one device sync for all layers
        for p, chunk, count in zip(pooled, chunks, counts, strict=True):
            if count > 0:
                sums, squares = chunk[1:].chunk(2)
                p.update(count, sums, squares)
            p.reset()

    def discard_step(self) -> None:
        """Forget what this step's forwards pooled (a step that was not applied)."""
        for p in self._pooled:
            p.reset()
            p.sums = p.squares = None

    def remove(self) -> None:
        """Detach the hooks and give the layers back PyTorch's per-forward updates (pending sums are dropped)."""
        for handle in self._handles:
            handle.remove()
        for p in self._pooled:
            p.layer.track_running_stats = True
        self._handles, self._pooled = [], []
