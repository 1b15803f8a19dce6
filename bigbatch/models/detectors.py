"""Detectors by name: torchvision's detection models and the built-in ``small_detector``.

Every detector is built from scratch (``weights=None, weights_backbone=None``: nothing is downloaded; ``model.weights``
is loaded after, by ``engine/start_weights.py``) and wrapped in :class:`Detector`, which gives all of them one
contract:

- labels are contiguous ``0..C-1`` in the targets given to the model and in the detections it returns.
  Faster R-CNN and SSD reserve class 0 for the background (softmax over ``C + 1`` classes), so they are
  built with ``C + 1`` classes and the wrapper shifts labels by one on the way in and out; RetinaNet, FCOS
  and ``small_detector`` score each class with its own sigmoid and take ``0..C-1`` as they are.
- ``model(images, targets)`` in train mode returns a dict of losses (their sum is the loss to minimise);
  ``model(images)`` in eval mode returns one dict per image: ``boxes`` (float ``[K, 4]``, XYXY, in the
  pixels of the image that was fed in), ``scores`` and ``labels``. ``images`` are float ``[3, H, W]``
  tensors in ``0..1``, of any sizes; targets hold ``boxes`` (XYXY float32, each with positive width and
  height: torchvision rejects degenerate boxes) and ``labels`` (int64); other keys are ignored.
- bigbatch's data pipeline does all the resizing (shorter-side resize, multi-scale, letterbox). The models'
  own :class:`GeneralizedRCNNTransform` is replaced by :class:`NoResizeTransform`, which only normalises
  (the model's own mean and std) and batches (zero padding to a multiple of 32), so detections come back in
  the input's coordinates. ``min_size`` and ``max_size`` are recorded on that transform (torchvision's
  fields, for the record); they shape no torchvision model (their anchors stay torchvision's, sized for
  COCO at 800 px), and they set ``small_detector``'s level ranges (see :func:`small_detector`).
- detections are kept down to a score of ``SCORE_THRESH`` (0.01), at most ``DETECTIONS_PER_IMAGE`` (100)
  per image, as COCO evaluation wants (detectron2 keeps down to 0.05; torchvision's SSDlite to 0.001).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import torch.nn as nn
import torchvision.models
from torch import Tensor
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.detection import FCOS
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.fcos import FCOSHead
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import FeaturePyramidNetwork

from bigbatch.errors import UserError
from bigbatch.models.small_cnn import norm_layer
from bigbatch.registry import MODELS

if TYPE_CHECKING:
    from bigbatch.config import ModelConfig

SCORE_THRESH = 0.01
DETECTIONS_PER_IMAGE = 100
SIZE_DIVISIBLE = 32

TORCHVISION_DETECTORS = (
    "fasterrcnn_resnet50_fpn",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "retinanet_resnet50_fpn",
    "fcos_resnet50_fpn",
    "ssdlite320_mobilenet_v3_large",
)
_BACKGROUND_CLASS = {"fasterrcnn_resnet50_fpn", "fasterrcnn_mobilenet_v3_large_fpn", "ssdlite320_mobilenet_v3_large"}
_THRESHOLDS = {  # each builder's names for the score threshold and the detections kept per image
    "fasterrcnn_resnet50_fpn": ("box_score_thresh", "box_detections_per_img"),
    "fasterrcnn_mobilenet_v3_large_fpn": ("box_score_thresh", "box_detections_per_img"),
    "retinanet_resnet50_fpn": ("score_thresh", "detections_per_img"),
    "fcos_resnet50_fpn": ("score_thresh", "detections_per_img"),
    "ssdlite320_mobilenet_v3_large": ("score_thresh", "detections_per_img"),
}


def known_detectors() -> list[str]:
    return ["small_detector", *TORCHVISION_DETECTORS]


class NoResizeTransform(GeneralizedRCNNTransform):
    """torchvision's detection transform without its resize: normalise, then zero-pad into one batch whose
    sides are multiples of ``size_divisible``. ``postprocess`` then maps boxes from the input size to the
    input size, i.e. leaves them in the input's pixels."""

    def resize(self, image: Tensor, target: dict[str, Tensor] | None = None):
        return image, target


class Detector(nn.Module):
    """A torchvision-style detector with labels ``0..C-1`` on both sides (``label_offset`` is added to the
    targets' labels and subtracted from the detections')."""

    def __init__(self, detector: nn.Module, label_offset: int):
        super().__init__()
        self.detector = detector
        self.label_offset = label_offset

    def forward(self, images: list[Tensor], targets: list[dict[str, Tensor]] | None = None):
        images = [image.as_subclass(Tensor) for image in images]  # tv_tensors.Image -> plain tensor
        if targets is not None:
            targets = [{"boxes": t["boxes"].as_subclass(Tensor), "labels": t["labels"] + self.label_offset}
                       for t in targets]
        if targets is None and not self.training:
            out = self.detect_by_padded_size(images)
        else:
            out = self.detector(images, targets)
        if isinstance(out, list) and self.label_offset:  # eval mode: detections
            out = [{**d, "labels": d["labels"] - self.label_offset} for d in out]
        return out

    def detect_by_padded_size(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        """The detections of ``images``, each forward holding only images that pad to one size (sides rounded up to
        a multiple of ``size_divisible``). The transform pads a batch to its largest image, and the padding changes
        the features near an image's border (a normalisation layer turns the zeros into values the convolutions then
        carry inwards); grouped so, an image's detections are the same whatever ``eval.batch`` and whichever images
        share its batch, and the same as the exported model's, which takes one image at a time. detectron2 and
        torchvision's references evaluate one image per forward for this reason. Letterboxed or stretched inputs
        are one size: one forward."""
        if len(images) <= 1:  # one image (predict, an exported graph's trace): nothing to group
            return self.detector(images)
        divisor = getattr(getattr(self.detector, "transform", None), "size_divisible", 1)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, image in enumerate(images):
            height, width = image.shape[-2:]
            groups.setdefault((-(-height // divisor), -(-width // divisor)), []).append(i)
        if len(groups) <= 1:
            return self.detector(images)
        out: list[dict[str, Tensor]] = [{} for _ in images]
        for members in groups.values():
            for i, detections in zip(members, self.detector([images[i] for i in members]), strict=True):
                out[i] = detections
        return out

    compile_sizes_vary = True
    """``model.compile``: the transform pads each batch to a size of its own, so the regions take any size."""

    def compile_regions(self) -> list[nn.Module]:
        """What ``model.compile`` compiles (``engine/compile.py``): the backbone (with its FPN), from the batched
        images to the feature maps, and a one-stage detector's head (FCOS, RetinaNet), from the feature maps to its
        outputs; the resizing, the anchors, the losses, a two-stage detector's proposals and the post-processing stay
        eager."""
        head = getattr(self.detector, "head", None)
        return [self.detector.backbone, *([head] if isinstance(head, nn.Module) else [])]


class SmallBackbone(nn.Module):
    """Five stride-2 conv stages (widths w, 2w, 4w, 8w, 8w) and an FPN over the last three: levels at
    strides 8, 16 and 32, ``out_channels`` each (torchvision's FeaturePyramidNetwork, no extra level)."""

    def __init__(self, width: int, out_channels: int, norm: str):
        super().__init__()

        def conv(cin: int, cout: int, stride: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, stride, 1, bias=norm == "none"), norm_layer(norm, cout),
                    nn.ReLU(inplace=True)]

        widths = [width, 2 * width, 4 * width, 8 * width, 8 * width]
        stages, cin = OrderedDict(), 3
        for i, cout in enumerate(widths):
            layers = conv(cin, cout, 2) if i == 0 else conv(cin, cout, 2) + conv(cout, cout, 1)
            stages[f"c{i + 1}"] = nn.Sequential(*layers)
            cin = cout
        self.body = IntermediateLayerGetter(nn.Sequential(stages), {"c3": "p3", "c4": "p4", "c5": "p5"})
        self.fpn = FeaturePyramidNetwork(widths[2:], out_channels)
        self.out_channels = out_channels

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return self.fpn(self.body(x))


def small_detector(num_classes: int, min_size: int, max_size: int, norm: str = "batch", width: int = 16,
                   channels: int = 64, head_convs: int = 2) -> nn.Module:
    """FCOS (torchvision's, anchor-free: Tian et al. 2019) on :class:`SmallBackbone`, for small images.

    FCOS gives a location on the level with "anchor size" ``a`` the objects whose largest distance from it to a
    box side lies in ``[4a, 8a]`` (the first level from 0, the last to infinity) and samples positives within
    ``center_sampling_radius * a`` of the box centre. Here ``a = min_size / 32, 2a, 4a`` at strides 8, 16, 32
    (4, 8, 16 px at 128 px: objects up to ~50 px on the first level, ~50-100 on the second, larger on the
    third) and the radius is 3, i.e. 1.5 strides as in FCOS. ``max_size`` is recorded only.
    """
    a = max(min_size / 32, 1.0)
    anchors = AnchorGenerator(((a,), (2 * a,), (4 * a,)), ((1.0,),) * 3)
    head = FCOSHead(channels, 1, num_classes, num_convs=head_convs)
    return FCOS(SmallBackbone(width, channels, norm), num_classes, min_size=min_size, max_size=max_size,
                anchor_generator=anchors, head=head, center_sampling_radius=3.0, score_thresh=SCORE_THRESH,
                detections_per_img=DETECTIONS_PER_IMAGE)


def _replace_batch_norm(module: nn.Module, norm: str) -> None:
    """Swap every BatchNorm2d for ``norm_layer(norm, channels)`` (GroupNorm or identity), in place."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, norm_layer(norm, child.num_features))
        else:
            _replace_batch_norm(child, norm)


def _torchvision_detector(name: str, num_classes: int) -> nn.Module:
    score, per_image = _THRESHOLDS[name]
    return torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=num_classes,
                                        **{score: SCORE_THRESH, per_image: DETECTIONS_PER_IMAGE})


def build_detector(name: str, num_classes: int, *, min_size: int, max_size: int, norm: str = "batch") -> nn.Module:
    """The detector ``name`` for ``num_classes`` classes (labels ``0..C-1``), wrapped in :class:`Detector`.

    ``norm``: ``batch`` (as built), or ``group``/``none`` to replace every BatchNorm2d (small_cnn's rule:
    GroupNorm with up to 8 groups)."""
    if num_classes < 1:
        raise UserError(f"data: a detector needs at least one class, got {num_classes}")
    if name == "small_detector":
        model = Detector(small_detector(num_classes, min_size, max_size, norm), label_offset=0)
    elif name in TORCHVISION_DETECTORS:
        offset = 1 if name in _BACKGROUND_CLASS else 0
        detector = _torchvision_detector(name, num_classes + offset)
        if norm != "batch":
            _replace_batch_norm(detector, norm)
        model = Detector(detector, label_offset=offset)
    else:
        raise UserError(f"model.name: unknown detector {name!r} (expected one of: {', '.join(known_detectors())})")
    old = model.detector.transform
    model.detector.transform = NoResizeTransform(min_size, max_size, old.image_mean, old.image_std,
                                                  size_divisible=SIZE_DIVISIBLE)
    return model


def detector_from_config(cfg: ModelConfig, num_classes: int, *, min_size: int, max_size: int) -> nn.Module:
    """``MODELS``' builder of the detectors here: :func:`build_detector` with ``model.norm``."""
    return build_detector(cfg.name, num_classes, min_size=min_size, max_size=max_size, norm=cfg.norm)


MODELS.register_family(known_detectors, detector_from_config, task="detection")
