"""The ``model`` section: which network, and the keys every model family reads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from bigbatch.config.section import PartSection, registered
from bigbatch.registry import MODELS


class ModelConfig(PartSection):
    parts = MODELS
    layout = ("name", "weights", "norm", "width", "dropout", "aux_logits", "cfg")
    """The order config.yaml has always written these keys in, the model families' own after the shared ones."""

    name: Annotated[str, registered(MODELS)] = "small_cnn"
    """Classification: ``small_cnn`` (the built-in demo CNN) or a torchvision classification model (``resnet18``,
    ...). Detection: ``small_detector`` or a torchvision detector (``fasterrcnn_resnet50_fpn``, ...)."""
    weights: str | None = None
    """Detection: start from this local weights file (a state dict or a bigbatch checkpoint); unset: from scratch.
    Nothing is ever downloaded."""
    norm: Literal["batch", "group", "none"] = "batch"
    """Normalisation layers of ``small_cnn``; torchvision models with a ``norm_layer`` argument take it too."""
    width: int = Field(32, gt=0)
    """Channels of the first ``small_cnn`` stage (doubled at each of the next two)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout before the classifier (``small_cnn``; torchvision models that take a ``dropout`` argument)."""
    memory_format: Literal["auto", "channels_last", "contiguous"] = "auto"
    """How the model's 4-D tensors are laid out in memory: ``channels_last`` (NHWC: oneDNN's and cuDNN's faster
    convolutions; timm's ``--channels-last``), ``contiguous`` (NCHW, torch's default); ``auto``: channels-last for
    torchvision's and timm's classifiers, contiguous for the rest (small_cnn, Darknet networks, detectors)."""
