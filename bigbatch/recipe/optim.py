"""Optimizers by name."""

from __future__ import annotations

import torch
import torch.nn as nn

from bigbatch.config import OptimConfig


def build_optimizer(cfg: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    raise AssertionError(f"unhandled optimizer {cfg.name!r}")  # the config only admits known names


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
