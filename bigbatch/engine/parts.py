"""The parts of a training step, built from the config: the model with its BatchNorm set up for the plan, the
optimizer, the loss scaler, the weight EMA, and the :class:`~bigbatch.engine.step.TrainStep` that uses them.

Training and ``bigbatch plan`` build them here alike, so that the memory plan measures the training step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig
from bigbatch.engine.compile import compile_model
from bigbatch.engine.events import EventStorage
from bigbatch.engine.phases import PhaseClock
from bigbatch.engine.start_weights import Started, start_weights
from bigbatch.engine.step import TrainStep
from bigbatch.engine.transfer import DeviceFeed
from bigbatch.errors import UserError
from bigbatch.floor.distributed import Process
from bigbatch.largebatch.clip import clip_gradients
from bigbatch.largebatch.ema import WeightEMA
from bigbatch.largebatch.freeze import FrozenGroup, frozen_groups, set_frozen
from bigbatch.largebatch.norm import configure_batchnorm
from bigbatch.largebatch.optim import build_optimizer
from bigbatch.largebatch.precision import autocast, build_scaler, check_precision, schedule_burn_in
from bigbatch.largebatch.schedule import Schedule, build_schedule
from bigbatch.largebatch.sync_bn import CrossDeviceBatchNorm, convert_batchnorm, has_norm_act, refuse_unconvertible
from bigbatch.tasks.base import Task


@dataclass(frozen=True)
class Parts:
    model: nn.Module
    """The bare model on its device (``step.model`` is the one that trains: wrapped in DDP under torchrun)."""
    step: TrainStep
    ema: WeightEMA | None
    lr_at: Schedule
    """lr(step), the learning rate of each 0-based optimizer step."""
    started: Started | None = None
    """What ``model.weights`` loaded (None: none named, or a resumed run)."""
    frozen: list[FrozenGroup] = field(default_factory=list)
    """The parameters frozen until a step (``largebatch/freeze.py``)."""


def build_parts(cfg: RunConfig, task: Task, plan: BatchPlan, proc: Process, events: EventStorage, *,
                recut_on_oom: bool = True, last_good: Callable[[], str] = lambda: "", start: bool = True) -> Parts:
    """The model (from ``model.weights`` where ``start``: not for a resumed run), its optimizer, loss scaler, EMA and
    schedule, and the training step that uses them, complete.

    ``recut_on_oom``: an out-of-memory step is cut finer and re-run (False for ``bigbatch plan``, where out of memory
    means: does not fit). ``last_good``: where the last finite weights are, for the message of a stopped run."""
    check_precision(cfg.precision, proc.device)
    model = task.build_model(cfg)
    started = start_weights(model, cfg) if start else None  # model.weights; a resumed run's are its checkpoint's
    model = sync_batchnorm(model, cfg.norm.sync, proc).to(proc.device)
    lr_at = build_schedule(cfg, plan)
    reduce = all_reduce_sum if proc.world > 1 and cfg.norm.sync != "none" else None
    running_stats = configure_batchnorm(model, cfg.norm, plan, reduce=reduce)
    optimizer = build_optimizer(cfg.optim, model, lr_at(0), cfg.model.name)  # all: a frozen one has no gradient
    # clipped: every trainable parameter, those frozen at first too (clip_gradients skips one without a gradient)
    parameters = [p for p in model.parameters() if p.requires_grad]
    groups = frozen_groups(model, cfg, plan)
    set_frozen(model, groups, 0)  # as at the first step (the freeze_layers hook sets each step's before it runs)
    ema = WeightEMA(model, cfg.ema.decay, cfg.ema.warmup) if cfg.ema.decay is not None else None
    # model.compile: the regions compiled in place, after the EMA's copy (a plain one), before DDP wraps the model
    compiled = compile_model(model, cfg.model.compile, proc.device, sizes_vary=cfg.data.multiscale.sizes is not None,
                             warn=None if proc.is_main else _silent)
    scaler = build_scaler(cfg.precision, schedule_burn_in(cfg.schedule))
    clock = PhaseClock(cfg.log.timing, proc.device)
    bn_sync = clock.sub_phase("bn_sync")
    for module in model.modules():
        if isinstance(module, CrossDeviceBatchNorm):
            module.sync_timer = bn_sync  # t_bn_sync (torch's SyncBatchNorm keeps its all-reduces inside its kernels)
    # Under torchrun the step trains the DDP wrapper; it shares the bare model's parameters, so a checkpoint loaded
    # into the bare model later (a resume) is what every process trains.
    wrap = functools.partial(DistributedDataParallel, device_ids=[proc.device] if proc.device.type == "cuda" else None
                             ) if proc.world > 1 else None
    trained = wrap(model) if wrap is not None else model
    step = TrainStep(model=trained, optimizer=optimizer, loss_fn=task.loss, scaler=scaler,
                     autocast=functools.partial(autocast, cfg.precision, proc.device),
                     clip=functools.partial(clip_gradients, cfg.clip, parameters), plan=plan, norm=cfg.norm,
                     running_stats=running_stats, ema=ema, max_skipped=cfg.precision.max_skipped, events=events,
                     clock=clock, feed=DeviceFeed(proc.device), recut_on_oom=recut_on_oom, last_good=last_good,
                     wrap=wrap, compiled=compiled)
    return Parts(model, step, ema, lr_at, started, groups)


def sync_batchnorm(model: nn.Module, sync: str, proc: Process) -> nn.Module:
    """``norm.sync``: BatchNorm statistics over all devices (``bigbatch`` or torch's SyncBatchNorm; timm's
    ``BatchNormAct2d`` keeps its activation either way); a BatchNorm class with its own ``forward`` is refused."""
    if sync == "torch" and proc.device.type != "cuda":
        raise UserError("norm.sync: torch.nn.SyncBatchNorm runs on CUDA only; on the CPU use norm.sync=bigbatch")
    if sync == "none" or proc.world == 1:
        return model
    if sync == "torch":
        refuse_unconvertible(model, kept=(nn.SyncBatchNorm,))
        if has_norm_act(model):  # timm's converter keeps BatchNormAct2d's drop and act (timm/layers/norm_act.py)
            from timm.layers import convert_sync_batchnorm

            return convert_sync_batchnorm(model)
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_batchnorm(model)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    torch.distributed.all_reduce(tensor)
    return tensor


def _silent(line: str) -> None:
    """The warnings of a process other than the first (each says the same)."""
