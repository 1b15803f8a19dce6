"""Models by name: the built-in ``small_cnn`` and torchvision's classification models; detectors in
``models/detectors.py``.

Every model is built from scratch (random weights): nothing is downloaded.
"""

from __future__ import annotations

import functools

import torch.nn as nn

from bigbatch.config import ModelConfig
from bigbatch.errors import UserError
from bigbatch.models.small_cnn import SmallCNN, norm_layer


@functools.cache
def torchvision_classifiers() -> tuple[str, ...]:
    import torchvision.models

    return tuple(torchvision.models.list_models(module=torchvision.models))


def known_models() -> list[str]:
    from bigbatch.models.detectors import known_detectors

    return ["small_cnn", *torchvision_classifiers(), *known_detectors()]


def is_detector(name: str) -> bool:
    from bigbatch.models.detectors import known_detectors

    return name in known_detectors()


def build_classifier(cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    if cfg.name == "small_cnn":
        return SmallCNN(num_classes, in_channels=in_channels, width=cfg.width, norm=cfg.norm, dropout=cfg.dropout)
    import torchvision.models

    kwargs: dict = {"weights": None, "num_classes": num_classes}
    if cfg.name in ("inception_v3", "googlenet"):  # the auxiliary heads return tuples in training
        kwargs.update(aux_logits=False, init_weights=True)
    if cfg.norm != "batch":  # the torchvision default; other norms need a norm_layer argument
        kwargs["norm_layer"] = functools.partial(norm_layer, cfg.norm)
    if cfg.dropout:
        kwargs["dropout"] = cfg.dropout
    try:
        return torchvision.models.get_model(cfg.name, **kwargs)
    except TypeError as e:
        for argument, key, expected in (("norm_layer", "norm", "'batch'"), ("dropout", "dropout", "0")):
            if argument in kwargs and argument in str(e):
                raise UserError(f"model.{key}: {cfg.name} takes no {argument} argument; expected {expected}") from None
        raise
