"""Parameters that do not train: ``model.freeze`` and ``model.unfreeze_at``, and the freezing keys of a Darknet cfg.

Each community says it its own way; bigbatch reads them all as groups of parameters frozen until a step:

- ``model.freeze: backbone``: a classifier's parameters but its head (timm's ``pretrained_cfg["classifier"]``;
  torchvision's ``fc``, ``classifier`` or ``heads``, with Inception's and GoogLeNet's auxiliary heads; small_cnn's
  ``head``), a torchvision detector's ``backbone`` module (FPN included, as torchvision builds it). Not defined for a
  Darknet cfg, whose layers have no such name: ``model.freeze: N`` there;
- ``model.freeze: N``: the first N layers of a Darknet network, else the first N top-level children of the model
  (of the torchvision model inside bigbatch's detector wrapper);
- ``model.unfreeze_at``: the step (or ``"N epochs"``) from which they train; unset, never;
- a Darknet cfg's own keys (``darknet/freeze.py``, registered as the family's ``frozen_groups``).

A frozen parameter has ``requires_grad`` off: it gets no gradient, so the optimizer keeps no state for it and decays
nothing (every optimizer here skips a parameter without a gradient), and under torchrun DDP reduces nothing for it
(its wrapper is built again when the set changes: ``TrainStep.trained_set_changed``). Its BatchNorm layers stay in
eval mode: they normalise with their running statistics and leave them as they are; from ``model.unfreeze_at`` they
train again (and gradient clipping counts the parameters again). The ``freeze_layers`` hook sets all of it before
every step from the step alone, so a resumed run is frozen exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.largebatch.norm import batchnorm_layers

AUX_HEADS = ("AuxLogits", "aux1", "aux2")
"""torchvision's auxiliary classifier heads (Inception v3's, GoogLeNet's): heads too, whatever ``model.freeze``."""


@dataclass(frozen=True)
class FrozenGroup:
    """Parameters (by name in the bare model) frozen before step ``until`` (None: for the whole run), and the modules
    whose BatchNorm layers stay in eval mode while they are."""

    names: tuple[str, ...]
    modules: tuple[str, ...]
    until: int | None
    reason: str
    """What froze them, as the user wrote it (``model.freeze: backbone``, ``stopbackward=1000 at layer 12``)."""

    def frozen_at(self, step: int) -> bool:
        return self.until is None or step < self.until


def inner(model: nn.Module) -> nn.Module:
    """The model a freeze counts in: the torchvision model inside bigbatch's detector wrapper, else the model."""
    return getattr(model, "detector", model)


def head_names(model: nn.Module) -> list[str]:
    """The top-level names of a classifier's head(s), from the model's own metadata (see the module docstring); []
    where it names none."""
    config = getattr(model, "pretrained_cfg", None)
    if isinstance(config, dict) and config.get("classifier"):  # timm
        found = config["classifier"]
        names = [found] if isinstance(found, str) else list(found)
    else:
        names = [next((name for name in ("fc", "classifier", "heads", "head") if hasattr(model, name)), None)]
    return [name for name in [*names, *AUX_HEADS] if name is not None and _module(model, name) is not None]


def _module(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _under(prefixes: list[str], name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def freeze_groups(model: nn.Module, model_cfg: Any, unfreeze_step: int | None) -> list[FrozenGroup]:
    """The groups ``model.freeze`` asks for (see the module docstring), frozen until ``unfreeze_step``."""
    freeze = model_cfg.freeze
    if freeze == "none":
        return []
    network = getattr(model, "network", None)  # a Darknet network: its layers
    if freeze == "backbone":
        if network is not None:
            raise UserError("model.freeze: backbone is not defined for a Darknet cfg (its layers have no such name); "
                            "give the number of layers to freeze, model.freeze=N")
        core = inner(model)
        if core is not model:  # a detector: its backbone module
            if _module(core, "backbone") is None:
                raise UserError(f"model.freeze: {model_cfg.name} has no backbone module; give model.freeze=N")
            prefix, kept = "detector.", ["backbone"]
            names = [name for name, _ in model.named_parameters() if _under([prefix + k for k in kept], name)]
            return [FrozenGroup(tuple(names), tuple(prefix + k for k in kept), unfreeze_step, "model.freeze: backbone")]
        heads = head_names(model)
        if not heads:
            raise UserError(f"model.freeze: {model_cfg.name} names no classifier head bigbatch knows; give "
                            "model.freeze=N (the first N top-level children)")
        names = [name for name, _ in model.named_parameters() if not _under(heads, name)]
        modules = [name for name, _ in model.named_children() if name not in heads]
        return [FrozenGroup(tuple(names), tuple(modules), unfreeze_step, "model.freeze: backbone")]
    if network is not None:
        count, prefix, what = len(network.layers), "network.layers.", "layers"
    else:
        core = inner(model)
        children = [name for name, _ in core.named_children()]
        count, what = len(children), "top-level children"
        prefix = "detector." if core is not model else ""
    if freeze > count:
        raise UserError(f"model.freeze: {freeze} is past the model's last layer (it has {count} {what})")
    if network is not None:
        modules = [f"{prefix}{i}" for i in range(freeze)]
    else:
        modules = [prefix + name for name in children[:freeze]]
    names = [name for name, _ in model.named_parameters() if _under(modules, name)]
    return [FrozenGroup(tuple(names), tuple(modules), unfreeze_step, f"model.freeze: {freeze}")]


def unfreeze_step(model_cfg: Any, plan: Any) -> int | None:
    """``model.unfreeze_at`` in optimizer steps (rounded up), None when unset."""
    from bigbatch.largebatch.schedule import length_in_steps

    if model_cfg.unfreeze_at is None:
        return None
    return math.ceil(length_in_steps(model_cfg.unfreeze_at, plan, "model.unfreeze_at"))


def set_frozen(model: nn.Module, groups: list[FrozenGroup], step: int, trained_norm: bool | None = None) -> bool:
    """Freeze the parameters of the groups frozen at ``step`` and let the others train; their BatchNorm layers to eval
    mode. ``trained_norm``: the mode (True: train) of the BatchNorm layers of the groups not frozen at ``step`` (a
    freeze that ended must not leave them in eval mode); None: they are left as the caller set them. The layers of no
    group are left as they are. -> whether the set of trained parameters changed."""
    frozen = {name for group in groups if group.frozen_at(step) for name in group.names}
    involved = {name for group in groups for name in group.names}
    changed = False
    for name, parameter in model.named_parameters():
        trains = name not in frozen
        if name in involved and parameter.requires_grad != trains:
            parameter.requires_grad_(trains)
            changed = True
    if trained_norm is not None:  # first, so that a layer of a group still frozen stays in eval mode below
        for group in groups:
            if not group.frozen_at(step):
                for module_name in group.modules:
                    for layer in batchnorm_layers(model.get_submodule(module_name)):
                        layer.train(trained_norm)
    for group in groups:
        if group.frozen_at(step):
            for module_name in group.modules:
                for layer in batchnorm_layers(model.get_submodule(module_name)):
                    layer.eval()
    return changed


def frozen_groups(model: nn.Module, cfg: Any, plan: Any) -> list[FrozenGroup]:
    """Every group a run of ``cfg`` freezes: ``model.freeze`` (until ``model.unfreeze_at``) and the model family's
    own keys (``registry.ModelInfo.frozen_groups``: a Darknet cfg's)."""
    from bigbatch.registry import MODELS

    groups = freeze_groups(model, cfg.model, unfreeze_step(cfg.model, plan))
    own = MODELS.get(cfg.model.name).info.get("frozen_groups")
    return groups + (own(model, cfg, plan) if own is not None else [])
