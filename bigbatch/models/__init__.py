"""Models by name: the built-in ``small_cnn`` and torchvision's classification models; detectors in
``models/detectors.py``. Each registers itself in ``MODELS`` (info ``task``; ``min_input_size`` where a model
has one; ``size_key``, the key that sets its size, where it is not ``model.name``); ``build_model`` looks the name
up.

Every model is built from scratch (random weights): nothing is downloaded.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from bigbatch.config.model import MODEL_KEYS
from bigbatch.errors import UserError
from bigbatch.models.small_cnn import SmallCNN, norm_layer
from bigbatch.registry import MODELS

if TYPE_CHECKING:
    from bigbatch.config import ModelConfig


@functools.cache
def torchvision_classifiers() -> tuple[str, ...]:
    import torchvision.models

    return tuple(torchvision.models.list_models(module=torchvision.models))


def build_model(cfg: ModelConfig, num_classes: int, **shape: int) -> nn.Module:
    """The model ``cfg.name`` as registered in ``MODELS``, for ``num_classes`` classes: ``obj(cfg, num_classes,
    **shape)``, ``shape`` being ``in_channels`` and ``size`` (the training input, which a network built for one size
    needs; given to builders that take a ``size`` argument) for a classifier, ``min_size`` and ``max_size`` for a
    detector."""
    import inspect

    entry = MODELS.get(cfg.name)
    if "size" in shape and "size" not in inspect.signature(entry.obj).parameters:
        shape = {key: value for key, value in shape.items() if key != "size"}
    model = entry.obj(cfg, num_classes, **shape)
    if channels_last(cfg):
        model = model.to(memory_format=torch.channels_last)
    return model


def channels_last(cfg: ModelConfig) -> bool:
    """``model.memory_format``: whether the model's 4-D tensors are laid out channels-last (``auto``: as its
    registration says)."""
    if cfg.memory_format == "auto":
        return MODELS.get(cfg.name).info.channels_last
    return cfg.memory_format == "channels_last"


def build_classifier(cfg: ModelConfig, num_classes: int, in_channels: int = 3, size: int | None = None) -> nn.Module:
    """The classifier ``cfg.name`` for ``num_classes`` classes of ``in_channels``-channel ``size`` x ``size``
    images."""
    return build_model(cfg, num_classes, in_channels=in_channels, size=size)


def small_cnn(cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    return SmallCNN(num_classes, in_channels=in_channels, width=cfg.width, norm=cfg.norm, dropout=cfg.dropout or 0.0)


def torchvision_classifier(cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    """torchvision's ``cfg.name`` with ``num_classes`` outputs (three input channels, whatever ``in_channels``)."""
    import torchvision.models

    kwargs: dict = {"weights": None, "num_classes": num_classes}
    if cfg.name in AUX_HEADS:  # with auxiliary heads the model returns (logits, aux_logits, ...) in training
        kwargs.update(aux_logits=cfg.aux_logits, init_weights=True)
    elif cfg.aux_logits:
        raise UserError(f"model.aux_logits: {cfg.name} has no auxiliary head (those that do: {', '.join(AUX_HEADS)})")
    if cfg.norm != "batch":  # the torchvision default; other norms need a norm_layer argument
        kwargs["norm_layer"] = functools.partial(norm_layer, cfg.norm)
    if cfg.dropout is not None:  # 0 too: Inception v3's own is 0.5
        kwargs["dropout"] = cfg.dropout
    try:
        return torchvision.models.get_model(cfg.name, **kwargs)
    except TypeError as e:
        if cfg.dropout == 0 and "dropout" in str(e):  # none asked of a model without dropout: what it is
            return torchvision_classifier(cfg.model_copy(update={"dropout": None}), num_classes, in_channels)
        for argument, key, expected in (("norm_layer", "norm", "'batch'"), ("dropout", "dropout", "unset or 0")):
            if argument in kwargs and argument in str(e):
                raise UserError(f"model.{key}: {cfg.name} takes no {argument} argument; expected {expected}") from None
        raise


MODELS.register("small_cnn", small_cnn, task="classification", min_input_size=8,  # three 2x poolings
                size_key="model.width")
AUX_HEADS = ("inception_v3", "googlenet")
"""torchvision classifiers with auxiliary heads (``model.aux_logits``; their loss: ``loss.aux_weight``)."""


MODELS.register_family(torchvision_classifiers, torchvision_classifier, task="classification", channels_last=True)
# Inception v3's stem needs 75 px; its auxiliary head, on the 17x17 grid, needs 299 (298 leaves 16x16: too small).
MODELS.register("inception_v3", torchvision_classifier, task="classification", fields=MODEL_KEYS["inception_v3"],
                min_input_size=lambda model: 299 if model.aux_logits else 75, channels_last=True)
MODELS.register("googlenet", torchvision_classifier, task="classification", fields=MODEL_KEYS["googlenet"],
                channels_last=True)
