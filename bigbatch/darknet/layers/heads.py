"""The training-time heads bigbatch builds and runs forward but does not train: ``[region]`` (YOLOv2,
region_layer.c), ``[detection]`` (YOLOv1, detection_layer.c), ``[Gaussian_yolo]`` (AlexeyAB's
gaussian_yolo_layer.c) and ``[contrastive]`` (AlexeyAB's contrastive loss on ``[yolo]`` embeddings).

Each is a head: the network returns its input, the raw tensor the layer receives, and its module is the identity.
Their keys are read with Darknet's defaults and kept in the spec; the shape is checked as Darknet's ``parse_*``
checks it:

- ``[region]``: ``num * (coords + classes + 1)`` input channels (``anchors``: ``2 * num`` numbers);
- ``[detection]``: a flat input of ``side * side * ((1 + coords) * num + classes)`` values;
- ``[Gaussian_yolo]``: ``len(mask) * (classes + 9)`` channels (4 box means, 4 variances, objectness, classes);
- ``[contrastive]``: ``yolo_layer`` names a ``[yolo]`` layer.

Darknet's own outputs of these layers are their activations (the logistic and softmax of forward_region_layer,
...), which the two forks lay out differently for ``[region]`` (AlexeyAB flattens it to cell-major order and leaves
x, y raw; pjreddie keeps the channel-major order); bigbatch implements neither decoder, and training a network whose
heads are these is refused with one line when the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Region(LayerSpec):
    kind = "region"
    classes: int = 20
    coords: int = 4
    num: int = 1
    anchors: tuple[float, ...] = ()
    softmax: bool = False
    tree: str | None = None


@dataclass(frozen=True, kw_only=True)
class Detection(LayerSpec):
    kind = "detection"
    classes: int = 1
    coords: int = 1
    num: int = 1
    side: int = 7
    softmax: bool = False
    sqrt: bool = False


@dataclass(frozen=True, kw_only=True)
class GaussianYolo(LayerSpec):
    kind = "Gaussian_yolo"
    classes: int = 20
    num: int = 1
    mask: tuple[int, ...] = ()
    anchors: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Contrastive(LayerSpec):
    kind = "contrastive"
    classes: int = 1000
    yolo_layer: int = 0
    temperature: float = 1.0


TRAINING_KEYS = {
    "region": frozenset({"bias_match", "jitter", "rescore", "object_scale", "noobject_scale", "class_scale",
                         "coord_scale", "absolute", "thresh", "random", "map", "max", "log", "sqrt", "focal_loss",
                         "resize", "classfix", "mask_scale", "background", "temperature"}),
    "detection": frozenset({"rescore", "jitter", "object_scale", "noobject_scale", "class_scale", "coord_scale",
                            "forced", "random", "reorg", "max"}),
    "Gaussian_yolo": frozenset({"jitter", "ignore_thresh", "truth_thresh", "iou_thresh", "uc_normalizer",
                                "cls_normalizer", "iou_normalizer", "iou_loss", "scale_x_y", "random", "max",
                                "resize", "nms_kind", "beta_nms", "iou_thresh_kind", "beta1", "max_delta",
                                "obj_normalizer"}),
    "contrastive": frozenset({"cls_normalizer", "max_delta", "contrastive_neg_max"}),
}
"""The keys each head's training loss reads: kept as Darknet's, unused by bigbatch (listed by ``show``)."""


def parse_region(s: SectionReader, common: dict[str, Any]) -> Region:
    num = s.integer("num", 1, 1)
    anchors = s.numbers("anchors") or []
    if anchors and len(anchors) != 2 * num:
        raise s.error("anchors", f"{len(anchors)} numbers, expected {2 * num} (w,h for each of num={num} anchors)")
    return Region(**common, classes=s.integer("classes", 20, 0), coords=s.integer("coords", 4, 0), num=num,
                  anchors=tuple(anchors), softmax=s.flag("softmax"), tree=s.text("tree", "") or None)


def region_shape(cfg: DarknetCfg, layer: Region, x: Shape, outputs: list[Shape]) -> Shape:
    expected = layer.num * (layer.coords + layer.classes + 1)
    if x.channels != expected:
        raise cfg.error(layer, None, f"its input has {x.channels} channels; num * (coords + classes + 1) = "
                                     f"{expected} expected (the filters of the convolution before)")
    return x


def parse_detection(s: SectionReader, common: dict[str, Any]) -> Detection:
    """parse_detection's keys and defaults (both forks' src/parser.c): classes 1, coords 1, num 1, side 7."""
    return Detection(**common, classes=s.integer("classes", 1, 0), coords=s.integer("coords", 1, 0),
                     num=s.integer("num", 1, 1), side=s.integer("side", 7, 1), softmax=s.flag("softmax"),
                     sqrt=s.flag("sqrt"))


def detection_shape(cfg: DarknetCfg, layer: Detection, x: Shape, outputs: list[Shape]) -> Shape:
    expected = layer.side * layer.side * ((1 + layer.coords) * layer.num + layer.classes)
    if x.size != expected:
        raise cfg.error(layer, None, f"its input has {x.size} values; side * side * ((1 + coords) * num + classes) "
                                     f"= {expected} expected")
    return x


def parse_gaussian_yolo(s: SectionReader, common: dict[str, Any]) -> GaussianYolo:
    num = s.integer("num", 1, 1)
    mask = s.integers("mask", 0, num - 1)
    anchors = s.numbers("anchors") or []
    if anchors and len(anchors) != 2 * num:
        raise s.error("anchors", f"{len(anchors)} numbers, expected {2 * num} (w,h for each of num={num} anchors)")
    return GaussianYolo(**common, classes=s.integer("classes", 20, 0), num=num,
                        mask=tuple(mask if mask is not None else range(num)), anchors=tuple(anchors))


def gaussian_yolo_shape(cfg: DarknetCfg, layer: GaussianYolo, x: Shape, outputs: list[Shape]) -> Shape:
    expected = len(layer.mask) * (layer.classes + 9)
    if x.channels != expected:
        raise cfg.error(layer, None, f"its input has {x.channels} channels; len(mask) * (classes + 9) = {expected} "
                                     "expected")
    return x


def parse_contrastive(s: SectionReader, common: dict[str, Any]) -> Contrastive:
    value = s.integer("yolo_layer", 0)
    return Contrastive(**common, classes=s.integer("classes", 1000, 1),
                       yolo_layer=s.layer_index(value, "yolo_layer") if value else 0,
                       temperature=s.number("temperature", 1.0, above=0))


def contrastive_shape(cfg: DarknetCfg, layer: Contrastive, x: Shape, outputs: list[Shape]) -> Shape:
    if cfg.layers[layer.yolo_layer].kind != "yolo":
        raise cfg.error(layer, "yolo_layer", f"layer {layer.yolo_layer} is a [{cfg.layers[layer.yolo_layer].section}]"
                                             ", not a [yolo]")
    return x


def build(spec: LayerSpec, x: Shape, outputs: list[Shape]) -> nn.Identity:
    return nn.Identity()


def row(spec: LayerSpec, x: Shape, out: Shape, net: Shape) -> TableRow:
    classes = getattr(spec, "classes", None)
    return TableRow(spec.kind if len(spec.kind) <= 9 else spec.kind[:9], "", "",
                    f"classes {classes}" if classes is not None else "")


for _kind, _parse, _shape in (("region", parse_region, region_shape),
                              ("detection", parse_detection, detection_shape),
                              ("Gaussian_yolo", parse_gaussian_yolo, gaussian_yolo_shape),
                              ("contrastive", parse_contrastive, contrastive_shape)):
    register_kind(LayerKind(_kind, (_kind,), _parse, _shape, build, row, ignored=TRAINING_KEYS[_kind], head=True))
