"""``[yolo]`` (yolo_layer.c): a YOLO head; its raw input is one of the network's outputs.

The network returns the layer's input unchanged: the logistic on x, y, objectness and classes and the box
decoding that forward_yolo_layer applies belong to the loss (``yolo_loss.py``) and the decoder
(``detector.py``), which read the anchors, masks, classes and strides from ``DarknetNetwork.yolo_heads``. Its
input must be ``len(mask) * (classes + 5)`` channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Yolo(LayerSpec):
    """``[yolo]``: every key of parse_yolo (AlexeyAB), with its default. ``anchors`` are the ``num`` (w, h) pairs
    in input pixels; ``mask`` the indices of those this layer predicts (default: all). The network passes the layer's
    input through unchanged: the logistic and the decoding belong to the loss and the decoder."""

    kind = "yolo"
    mask: tuple[int, ...] = ()
    anchors: tuple[tuple[float, float], ...] = ()
    classes: int = 20
    num: int = 1
    max_boxes: int = 200
    jitter: float = 0.2
    resize: float = 1.0
    ignore_thresh: float = 0.5
    truth_thresh: float = 1.0
    iou_thresh: float = 1.0
    random: float = 0.0
    scale_x_y: float = 1.0
    iou_normalizer: float = 0.75
    obj_normalizer: float = 1.0
    cls_normalizer: float = 1.0
    delta_normalizer: float = 1.0
    iou_loss: str = "mse"
    iou_thresh_kind: str = "iou"
    nms_kind: str = "default"
    beta_nms: float = 0.6
    max_delta: float = math.inf
    counters_per_class: tuple[int, ...] | None = None
    label_smooth_eps: float = 0.0
    new_coords: int = 0
    objectness_smooth: int = 0
    focal_loss: int = 0

    @property
    def masked_anchors(self) -> tuple[tuple[float, float], ...]:
        """The (w, h) anchors this layer predicts, in mask order (NaN for a mask index past the anchors)."""
        nan = float("nan")
        return tuple(self.anchors[m] if m < len(self.anchors) else (nan, nan) for m in self.mask)

    @property
    def filters(self) -> int:
        """The channels this layer takes: ``len(mask) * (classes + 5)`` (yolo_layer.c: 4 box, 1 objectness)."""
        return len(self.mask) * (self.classes + 5)


IOU_LOSSES = ("mse", "iou", "giou", "diou", "ciou")
IOU_THRESH_KINDS = ("iou", "giou", "diou", "ciou")
NMS_KINDS = ("default", "greedynms", "diounms", "cornersnms")


def parse(s: SectionReader, common: dict[str, Any]) -> Yolo:
    classes = s.integer("classes", 20, 1)
    num = s.integer("num", 1, 1)
    mask = s.integers("mask", 0)
    if mask is None:
        mask = list(range(num))  # make_yolo_layer: without a mask, every anchor
    elif any(m >= num for m in mask):  # Darknet reads past its anchors: built, not trained
        s.warn("mask", f"index {max(mask)} is not below num={num}: Darknet reads an undefined anchor; bigbatch builds "
                       "the network, and refuses to train it")
    anchors = s.anchors(num)
    counters = s.integers("counters_per_class", 0)
    if counters is not None and len(counters) != classes:
        raise s.error("counters_per_class", f"{len(counters)} numbers, expected one per class (classes={classes})")
    return Yolo(
        **common,
        mask=tuple(mask),
        anchors=tuple(zip(anchors[::2], anchors[1::2], strict=True)),
        classes=classes,
        num=num,
        max_boxes=s.integer("max", 200, 1),
        jitter=s.number("jitter", 0.2, 0),
        resize=s.number("resize", 1.0, above=0),
        ignore_thresh=s.number("ignore_thresh", 0.5, 0),
        truth_thresh=s.number("truth_thresh", 1.0, 0),
        iou_thresh=s.number("iou_thresh", 1.0, 0),
        random=s.number("random", 0.0, 0),
        scale_x_y=s.number("scale_x_y", 1.0, above=0),
        iou_normalizer=s.number("iou_normalizer", 0.75, 0),
        obj_normalizer=s.number("obj_normalizer", 1.0, 0),
        cls_normalizer=s.number("cls_normalizer", 1.0, 0),
        delta_normalizer=s.number("delta_normalizer", 1.0, 0),
        iou_loss=s.choice("iou_loss", "mse", IOU_LOSSES),
        iou_thresh_kind=s.choice("iou_thresh_kind", "iou", IOU_THRESH_KINDS),
        nms_kind=s.choice("nms_kind", "default", NMS_KINDS),
        beta_nms=s.number("beta_nms", 0.6, 0),
        max_delta=s.number("max_delta", math.inf, above=0),
        counters_per_class=None if counters is None else tuple(counters),
        label_smooth_eps=s.number("label_smooth_eps", 0.0, 0, 1),
        new_coords=s.integer("new_coords", 0, 0, 1),
        objectness_smooth=s.integer("objectness_smooth", 0, 0, 1),
        focal_loss=s.integer("focal_loss", 0, 0, 1),
    )


def shape(cfg: DarknetCfg, layer: Yolo, x: Shape, outputs: list[Shape]) -> Shape:
    if x.channels != layer.filters:
        raise cfg.error(layer, None, f"its input has {x.channels} channels; len(mask) * (classes + 5) = "
                                     f"{len(layer.mask)} * ({layer.classes} + 5) = {layer.filters} expected "
                                     "(the filters of the convolution before)")
    return x


class YoloOutput(nn.Module):
    """``[yolo]``: Darknet's inference output (forward_yolo_layer, both forks): per anchor, the logistic on x, y,
    objectness and classes (not with ``new_coords``, whose inputs are already activated), then
    ``x, y = scale_x_y * x - (scale_x_y - 1) / 2`` (AlexeyAB; pjreddie's scale_x_y is 1). The network returns
    this layer's input, raw, for the loss and the decoder; this output is what ``forward_layers`` shows."""

    def __init__(self, spec: Yolo) -> None:
        super().__init__()
        self.spec = spec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        spec = self.spec
        y = x.view(n, len(spec.mask), spec.classes + 5, h, w)
        if not spec.new_coords:
            y = torch.cat([y[:, :, :2].sigmoid(), y[:, :, 2:4], y[:, :, 4:].sigmoid()], dim=2)
        if spec.scale_x_y != 1:
            y = torch.cat([y[:, :, :2] * spec.scale_x_y - 0.5 * (spec.scale_x_y - 1), y[:, :, 2:]], dim=2)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"mask={list(self.spec.mask)}, classes={self.spec.classes}"


def build(spec: Yolo, x: Shape, outputs: list[Shape]) -> YoloOutput:
    return YoloOutput(spec)


def row(spec: Yolo, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("yolo", "", "", f"mask {','.join(map(str, spec.mask))}  classes {spec.classes}  stride "
                                    f"{net.width / out.width:g}")


register_kind(LayerKind(
    "yolo", ("yolo",), parse, shape, build, row, head=True,
    ignored=frozenset({"show_details", "track_history_size", "sim_thresh", "dets_for_track", "dets_for_show",
                       "track_ciou_norm", "embedding_layer", "map"})))
