"""The ``model`` section: which network, the keys every model family reads, and those some built-in families add
(:data:`MODEL_KEYS`; ``models/__init__.py`` and ``darknet/models.py`` register each with its entry)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from bigbatch.config.section import PartSection, registered
from bigbatch.config.values import Length
from bigbatch.registry import MODELS

AUX = {"aux_logits": (bool, False)}
"""``model.aux_logits``: build the auxiliary head (a key of torchvision's ``inception_v3`` and ``googlenet`` only)."""
DARKNET = {"cfg": (str | None, None), "darknet_dialect": (Literal["alexeyab", "pjreddie", "gradient"], "alexeyab"),
           "weights_cfg": (str | None, None)}
"""``model.cfg``; ``model.darknet_dialect``: whose Darknet the run trains as (docs/darknet.md, "Dialects"):
``alexeyab`` (the default) or ``pjreddie``, that fork's own deltas (``yolo_delta.py``) and cfg reading, or
``gradient``, the true gradient of the loss (``yolo_loss.py``); ``model.weights_cfg``: the cfg a ``model.weights``
Darknet file was written for, where it is another network's or this one's for another class count
(``darknet/models.py``, ``darknet_start``)."""

MODEL_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {"inception_v3": AUX, "googlenet": AUX, "darknet": DARKNET,
                                                     "darknet_classifier": DARKNET}
"""The keys each built-in model family adds to ``model``, by name."""


class ModelConfig(PartSection):
    parts = MODELS
    builtin_keys = MODEL_KEYS
    layout = ("name", "weights", "weights_from", "mismatched", "freeze", "unfreeze_at", "norm", "width", "dropout",
              "aux_logits", "cfg")
    """The order config.yaml has always written these keys in, the model families' own after the shared ones."""

    name: Annotated[str, registered(MODELS)] = "small_cnn"
    """Classification: ``small_cnn`` (the built-in demo CNN) or a torchvision classification model (``resnet18``,
    ...). Detection: ``small_detector`` or a torchvision detector (``fasterrcnn_resnet50_fpn``, ...)."""
    weights: str | None = None
    """Start from these weights (``engine/start_weights.py``): a bigbatch run directory or checkpoint (any task and
    class count), a timm or torchvision state dict (``.pth``, ``.pt``, ``.safetensors``), or, for a Darknet network,
    a ``.weights`` or ``.conv.N`` file; unset: from scratch. Nothing is ever downloaded."""
    weights_from: Literal["ema", "raw"] = "ema"
    """A run's weights to start from: its EMA weights where it kept an EMA (``ema``), or its raw ones."""
    mismatched: Literal["error", "reinit"] = "error"
    """A tensor of ``model.weights`` whose shape differs from the model's (a head for another class count):
    ``error``, one line naming it, or ``reinit``: the model's layer keeps its new initialisation."""
    freeze: Literal["none", "backbone"] | Annotated[int, Field(ge=0)] = "none"
    """Parameters not trained (``largebatch/freeze.py``): ``backbone`` (a classifier's all but its head, a torchvision
    detector's ``backbone``), or the first N layers of a Darknet network (the first N top-level children of other
    models)."""
    unfreeze_at: Length | None = None
    """When the frozen parameters start training (steps, or ``"N epochs"``); unset: never."""
    norm: Literal["batch", "group", "none"] = "batch"
    """Normalisation layers of ``small_cnn``; torchvision models with a ``norm_layer`` argument take it too."""
    width: int = Field(32, gt=0)
    """Channels of the first ``small_cnn`` stage (doubled at each of the next two)."""
    dropout: float | None = Field(None, ge=0, lt=1)
    """Dropout before the classifier (``small_cnn``; timm's ``drop_rate``; torchvision models that take a ``dropout``
    argument). Unset: the model's own (torchvision's Inception v3 0.5, GoogLeNet 0.2; ``small_cnn`` and timm's 0);
    0: none, whatever the model's default."""
    memory_format: Literal["auto", "channels_last", "contiguous"] = "auto"
    """How the model's 4-D tensors are laid out in memory: ``channels_last`` (NHWC: oneDNN's and cuDNN's faster
    convolutions; timm's ``--channels-last``), ``contiguous`` (NCHW, torch's default); ``auto``: channels-last for
    torchvision's and timm's classifiers, contiguous for the rest (small_cnn, Darknet networks, detectors)."""
    compile: Literal[False, "default", "reduce-overhead", "max-autotune"] = False
    """``torch.compile`` the training forward and backward (``engine/compile.py``), in this torch.compile mode:
    ``default``, ``reduce-overhead`` (CUDA graphs on a GPU; on the CPU the same as ``default``) or ``max-autotune``;
    ``false``: eager. Evaluation runs eager; checkpoints hold the plain module's keys. Where inductor fails, training
    goes on in eager mode after one warning line."""
