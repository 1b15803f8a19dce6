"""timm's models by name: ``model.name: timm/NAME`` builds ``timm.create_model(NAME)`` from scratch.

Nothing is downloaded (``pretrained=False``). ``model.dropout`` is timm's ``drop_rate`` (before the classifier);
``model.norm`` other than ``batch`` is passed as ``norm_layer`` to the models that take one (timm's ResNets,
among others) and refused, naming the key, by those that do not.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.models.small_cnn import norm_layer
from bigbatch.registry import MODELS

if TYPE_CHECKING:
    from bigbatch.config import ModelConfig

PREFIX = "timm/"


@functools.cache
def timm_names() -> tuple[str, ...]:
    import timm

    return tuple(PREFIX + name for name in timm.list_models())


def timm_classifier(cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    import timm

    kwargs: dict = {"pretrained": False, "num_classes": num_classes, "in_chans": in_channels}
    if cfg.dropout is not None:
        kwargs["drop_rate"] = cfg.dropout
    if cfg.norm != "batch":  # a plain function: timm unpacks a functools.partial's keywords and drops its arguments
        def configured_norm(channels: int, **factory: Any) -> nn.Module:
            return norm_layer(cfg.norm, channels, **factory)

        kwargs["norm_layer"] = configured_norm
    if cfg.aux_logits:
        raise UserError(f"model.aux_logits: {cfg.name} has no auxiliary head bigbatch knows; expected false")
    try:
        return timm.create_model(cfg.name.removeprefix(PREFIX), **kwargs)
    except TypeError as e:
        if "norm_layer" in kwargs and "norm_layer" in str(e):
            raise UserError(f"model.norm: {cfg.name} takes no norm_layer argument; expected 'batch'") from None
        raise


MODELS.register_family(timm_names, timm_classifier, task="classification", channels_last=True)
