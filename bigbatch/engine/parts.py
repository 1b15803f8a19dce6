"""The parts of a training step, built from the config: the model with its BatchNorm set up for the plan, the
optimizer, the loss scaler, the weight EMA, and the :class:`~bigbatch.engine.step.TrainStep` that uses them.

Training and ``bigbatch plan`` build them here alike, so that the memory plan measures the training step.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig
from bigbatch.engine.distributed import Process
from bigbatch.engine.events import EventStorage
from bigbatch.engine.phases import PhaseClock
from bigbatch.engine.step import TrainStep
from bigbatch.engine.transfer import DeviceFeed
from bigbatch.errors import UserError
from bigbatch.recipe.clip import clip_gradients
from bigbatch.recipe.ema import WeightEMA
from bigbatch.recipe.norm import configure_batchnorm
from bigbatch.recipe.optim import build_optimizer
from bigbatch.recipe.precision import autocast, build_scaler, check_precision, schedule_burn_in
from bigbatch.recipe.schedule import Schedule, build_schedule
from bigbatch.recipe.sync_bn import CrossDeviceBatchNorm, convert_batchnorm
from bigbatch.tasks.base import Task


def build_parts(cfg: RunConfig, task: Task, plan: BatchPlan, proc: Process, events: EventStorage
                ) -> tuple[nn.Module, TrainStep, WeightEMA | None, Schedule]:
    """(the bare model on its device, the training step, the weight EMA or None, lr(step))."""
    check_precision(cfg.precision, proc.device)
    model = sync_batchnorm(task.build_model(cfg), cfg.norm.sync, proc).to(proc.device)
    lr_at = build_schedule(cfg, plan)
    reduce = all_reduce_sum if proc.world > 1 and cfg.norm.sync != "none" else None
    running_stats = configure_batchnorm(model, cfg.norm, plan, reduce=reduce)
    optimizer = build_optimizer(cfg.optim, model, lr_at(0))
    ema = WeightEMA(model, cfg.ema.decay, cfg.ema.warmup) if cfg.ema.decay is not None else None
    scaler = build_scaler(cfg.precision, schedule_burn_in(cfg.schedule))
    parameters = [p for p in model.parameters() if p.requires_grad]
    step = TrainStep(model, optimizer, task.loss, scaler, functools.partial(autocast, cfg.precision, proc.device),
                     functools.partial(clip_gradients, cfg.clip, parameters), plan, cfg.norm, running_stats, ema,
                     cfg.precision.max_skipped, events, feed=DeviceFeed(proc.device))
    step.clock = PhaseClock(cfg.log.timing, proc.device)
    bn_sync = step.clock.sub_phase("bn_sync")
    for module in model.modules():
        if isinstance(module, CrossDeviceBatchNorm):
            module.sync_timer = bn_sync  # t_bn_sync (torch's SyncBatchNorm keeps its all-reduces inside its kernels)
    return model, step, ema, lr_at


def sync_batchnorm(model: nn.Module, sync: str, proc: Process) -> nn.Module:
    """``norm.sync``: BatchNorm statistics over all devices (``bigbatch`` or torch's SyncBatchNorm)."""
    if sync == "torch" and proc.device.type != "cuda":
        raise UserError("norm.sync: torch.nn.SyncBatchNorm runs on CUDA only; on the CPU use norm.sync=bigbatch")
    if sync == "none" or proc.world == 1:
        return model
    if sync == "torch":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_batchnorm(model)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    torch.distributed.all_reduce(tensor)
    return tensor
