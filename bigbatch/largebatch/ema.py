"""Exponential moving average of the weights (Polyak averaging), evaluated in place of the raw weights.

Updated once per applied optimizer step (never per micro-batch):

    ema = d * ema + (1 - d) * w,    d = decay, or min(decay, (1 + n) / (10 + n)) with warm-up

where n counts the optimizer steps applied so far, this one included: TensorFlow's
``ExponentialMovingAverage(decay, num_updates=global_step)`` applied after the train op, as in
the Inception v3 TPU guide (decay 0.995). Floating-point buffers (BatchNorm running mean and
variance) are averaged the same way, as TF averages ``tf.moving_average_variables()``; integer
buffers (``num_batches_tracked``) are copied. Under a batch schedule (``schedule.batch``) a step of ``N`` times the
first batch uses ``d ** N``: the decay is stated per step of the first batch, and its horizon stays the same in images.

Under torch.distributed every rank keeps an EMA, and only rank 0's counts (it is the one saved): the weights are the
same on every rank (DDP all-reduces the gradients), but the BatchNorm running statistics are not (without
``norm.sync`` each rank updates its own from its micro-batches), so the other ranks' EMAs drift from rank 0's. Before
the EMA is used on every rank (the sharded evaluation, ``engine/run.py``), :meth:`WeightEMA.share_buffers` makes every
rank's floating-point buffers rank 0's, in one broadcast: each rank then evaluates the EMA rank 0 saves, so the logged
metrics are ``bigbatch eval``'s of the checkpoint, and a resumed run (every rank loads rank 0's EMA) logs what one
never stopped logs. timm's ``train.py`` does the same before it evaluates (``utils.distribute_bn(model_ema, world,
reduce=False)``: broadcast from rank 0). Once per evaluation rather than after every update: the same metrics, without
a collective per step (0.4 ms a step for digits' BatchNorm model on 2 Gloo processes, 6 ms for ResNet-50's 53,120
buffer values; docs/distributed.md).

Which weights count (are evaluated, reported as the run's metrics, written by ``bigbatch export``) is one rule,
:func:`ema_counts`: the EMA's when the run keeps one and ``ema.evaluate`` (the default), else the raw ones.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

if TYPE_CHECKING:
    from bigbatch.config import RunConfig


def ema_counts(ema: object | None, cfg: RunConfig) -> bool:
    """Whether the EMA's weights are the ones that count rather than the raw ones: when the run keeps an EMA
    (``ema``: a :class:`WeightEMA`, or a checkpoint's ``"ema"`` entry; None without one) and ``ema.evaluate``."""
    return ema is not None and cfg.ema.evaluate


def counted_weights(state: dict[str, Any], cfg: RunConfig) -> tuple[dict[str, Any], bool]:
    """The state dict of the weights that count in a checkpoint ``state`` (:func:`ema_counts`): its EMA's
    (``state["ema"]["module"]``) or its raw model's (``state["model"]``); and whether they are the EMA's."""
    use_ema = ema_counts(state.get("ema"), cfg)
    return (state["ema"]["module"] if use_ema else state["model"]), use_ema


def share_buffers(module: nn.Module) -> None:
    """Every rank's floating-point buffers of ``module`` (BatchNorm running mean and variance) made rank 0's, in one
    broadcast per dtype and device, as DDP's ``broadcast_buffers`` makes them at its forward. Nothing without a
    process group of 2 or more, or without such buffers. A collective: every rank calls it at the same point."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for buffer in module.buffers():
        if buffer.is_floating_point():
            groups.setdefault((buffer.dtype, buffer.device), []).append(buffer)
    for buffers in groups.values():
        flat = torch.cat([b.reshape(-1) for b in buffers])
        dist.broadcast(flat, src=0)
        for buffer, value in zip(buffers, flat.split([b.numel() for b in buffers]), strict=True):
            buffer.copy_(value.view_as(buffer))


class WeightEMA:
    def __init__(self, model: nn.Module, decay: float, warmup: bool = False):
        self.decay = decay
        self.warmup = warmup
        self.per_step_power = 1.0
        """The batch in effect over the first (a batch schedule): the decay per step is ``d ** power``, so that the
        average's horizon stays the same in images (``bigbatch scale``'s rule for a per-step decay)."""
        self.updates = 0
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    def current_decay(self) -> float:
        """The decay used by the update that makes ``self.updates`` applied steps."""
        n = self.updates
        decay = min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay
        return decay if self.per_step_power == 1.0 else decay**self.per_step_power

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold in the weights after one applied optimizer step."""
        self.updates += 1
        d = self.current_decay()
        source = model.state_dict()
        for name, averaged in self.module.state_dict().items():
            value = source[name].detach()
            if averaged.is_floating_point():
                averaged.lerp_(value.to(averaged.dtype), 1.0 - d)  # d * ema + (1 - d) * w
            else:
                averaged.copy_(value)

    @torch.no_grad()
    def share_buffers(self) -> None:
        """Every rank's EMA made rank 0's (:func:`share_buffers`; the parameters are equal already). A collective:
        every rank calls it, at the same point (``engine/run.py``'s ``Run.evaluate``, before the sharded evaluation)."""
        share_buffers(self.module)

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = state["updates"]
