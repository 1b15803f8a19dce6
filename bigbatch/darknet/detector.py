"""A Darknet YOLO network as a torchvision-style detector: Darknet's loss in training, Darknet's decoding in eval.

    net = load_network("yolov3.cfg", 416, 416, classes=3)
    model = DarknetDetector(net)
    losses = model(images, targets)      # train mode: {"loss_box", "loss_obj", "loss_cls"}; sum = micro-batch loss
    model.eval(); detections = model(images)   # [{"boxes", "scores", "labels"}] per image, input pixels

``images`` are float ``[3, H, W]`` tensors in ``0..1`` (Darknet feeds the image as it is: no mean or std), all of one
size (letterboxed squares, a multiple of 32; the size may change from step to step), stacked here. Targets: ``boxes``
XYXY in input pixels, ``labels`` ``0..classes-1``. The loss is ``yolo_loss.py``'s, under ``model.darknet_dialect``
(its docstring and ``yolo_delta.py``'s have the formulas).

Decoding (yolo_layer.c get_yolo_detections, get_yolo_box): per cell ``(col, row)`` and masked anchor,
``x = (col + s sigmoid(t_x) - (s - 1) / 2) / W`` (``s = scale_x_y``), ``w = exp(t_w) anchor_w / in_w`` (likewise y,
h), ``score_c = sigmoid(t_obj) sigmoid(t_c)`` for every class (``new_coords``: the inputs are already logistic
outputs, ``x = (col + s t_x - (s - 1) / 2) / W``, ``w = 4 t_w^2 anchor_w / in_w``, ``score_c = t_obj t_c``). Each
class above the threshold is a detection, as Darknet's validation keeps every ``prob[j] > thresh``; kept where
``score > score_thresh`` (Darknet's mAP run uses 0.005), then per-class NMS (``torchvision.ops.batched_nms`` at
``nms_thresh``, Darknet's do_nms_sort at 0.45; the cfg's ``nms_kind``/``beta_nms`` variants are not used), at most
``detections_per_image`` by score, boxes clipped to the input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor
from torchvision.ops import batched_nms, box_convert, clip_boxes_to_image

from bigbatch.darknet.cfg import Yolo
from bigbatch.darknet.network import DarknetNetwork
from bigbatch.darknet.yolo_loss import decode_boxes, yolo_loss
from bigbatch.errors import UserError

GRADIENT_UNSUPPORTED = {
    "new_coords": "the scaled-YOLOv4 box coordinates",
    "focal_loss": "the focal class loss",
    "objectness_smooth": "the IoU-scaled objectness targets",
    "counters_per_class": "the per-class loss multipliers",
}
"""[yolo] keys whose non-default values the ``gradient`` dialect's loss does not implement (the Darknet dialects
do)."""


def check_supported(network: DarknetNetwork, dialect: str = "alexeyab") -> None:
    """A :class:`UserError` when the network cannot be trained as a detector under ``dialect``: it has no ``[yolo]``
    layer (a backbone, or YOLOv1/v2's ``[detection]``/``[region]`` heads, whose losses bigbatch does not implement),
    a mask past its anchors, a ``[yolo]`` key of :data:`GRADIENT_UNSUPPORTED` under ``gradient``, or under
    ``pjreddie`` a key that pjreddie's Darknet does not read, set to another value than it trains with (each naming
    its line)."""
    from bigbatch.darknet.yolo_delta import PJREDDIE_VALUES

    cfg = network.cfg
    if not cfg.yolo_layers:
        from bigbatch.darknet.spec import KINDS

        heads = [layer for layer in cfg.layers if KINDS[layer.kind].head]
        if heads:
            raise cfg.error(heads[0], None, "bigbatch trains Darknet detectors through [yolo] layers; this head's "
                                            "training loss is not implemented (show, export and forward work)")
        raise UserError(f"{cfg.path}: the network has no [yolo] layer nor a classifier head: bigbatch cannot train "
                        "it (show, export and forward work)")
    for spec in network.cfg.yolo_layers:
        if any(m >= spec.num for m in spec.mask):
            raise cfg.error(spec, "mask", f"index {max(spec.mask)} is not below num={spec.num}: no anchor to train")
        if dialect == "gradient":
            for key, what in GRADIENT_UNSUPPORTED.items():
                value = getattr(spec, key)
                if value not in (0, None):
                    raise cfg.error(spec, key, f"{what} ({key}={value}) are not implemented by the gradient "
                                               "dialect's loss; use model.darknet_dialect: alexeyab, or remove the key")
        if dialect == "pjreddie":
            for key, value in PJREDDIE_VALUES.items():
                if key in spec.lines and getattr(spec, key) != value:
                    shown = "unset" if value is None else f"{key}={value}"
                    raise cfg.error(spec, key, f"pjreddie's Darknet does not read this key (it trains as if "
                                               f"{shown}); remove it, or use model.darknet_dialect: alexeyab")


def decode_yolo_output(raw: Tensor, spec: Yolo, input_size: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """One ``[yolo]`` layer's raw input ``(N, A * (5 + C), H, W)`` decoded for an input of ``input_size = (height,
    width)``: boxes ``(N, A * H * W, 4)`` XYXY in input pixels, objectness ``(N, A * H * W)`` and class probabilities
    ``(N, A * H * W, C)`` (each a sigmoid), in Darknet's order (anchor, row, column)."""
    n_images, _, height, width = raw.shape
    n_anchors = len(spec.mask)
    out = raw.reshape(n_images, n_anchors, 5 + spec.classes, height, width)
    anchors = torch.tensor(spec.masked_anchors, dtype=raw.dtype, device=raw.device)
    new_coords = bool(spec.new_coords)
    xywh = decode_boxes(out[:, :, :4], anchors, input_size, spec.scale_x_y, new_coords).reshape(n_images, -1, 4)
    in_h, in_w = input_size
    xywh = xywh * torch.tensor([in_w, in_h, in_w, in_h], dtype=raw.dtype, device=raw.device)
    probabilities = out[:, :, 4:] if new_coords else torch.sigmoid(out[:, :, 4:])  # new_coords: already logistic
    objectness = probabilities[:, :, 0].reshape(n_images, -1)
    classes = probabilities[:, :, 1:].permute(0, 1, 3, 4, 2).reshape(n_images, -1, spec.classes)
    return box_convert(xywh, "cxcywh", "xyxy"), objectness, classes


def decode_all(outputs: Sequence[Tensor], specs: Sequence[Yolo], input_size: tuple[int, int],
               decoded: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The outputs of all ``[yolo]`` layers decoded (:func:`decode_yolo_output`) and joined: boxes ``(N, P, 4)`` XYXY
    in input pixels, objectness ``(N, P)``, class probabilities ``(N, P, C)``. ``decoded``: ``outputs`` are these
    three already (a network exported with ``--postprocess``, :class:`DecodedNetwork`)."""
    if decoded:
        boxes, objectness, classes = (t.float() for t in outputs)
        return boxes, objectness, classes
    outputs = [raw.float() if raw.dtype in (torch.float16, torch.bfloat16) else raw for raw in outputs]
    parts = [decode_yolo_output(raw, spec, input_size) for raw, spec in zip(outputs, specs, strict=True)]
    return tuple(torch.cat([part[k] for part in parts], dim=1) for k in range(3))


class DecodedNetwork(nn.Module):
    """A :class:`DarknetNetwork` whose outputs are decoded (:func:`decode_all`, Darknet's ``get_yolo_detections``
    before its thresholds): ``(boxes, objectness, class probabilities)`` of the input's candidates, what ``bigbatch
    export --postprocess`` puts in the graph."""

    def __init__(self, network: DarknetNetwork, specs: Sequence[Yolo]) -> None:
        super().__init__()
        self.network, self.specs = network, list(specs)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return decode_all(self.network(x), self.specs, (x.shape[-2], x.shape[-1]))


def postprocess(outputs: Sequence[Tensor], specs: Sequence[Yolo], input_size: tuple[int, int],
                score_thresh: float = 0.005, nms_thresh: float = 0.45,
                detections_per_image: int = 100, decoded: bool = False) -> list[dict[str, Tensor]]:
    """The detections of each image from the raw outputs of all ``[yolo]`` layers (see the module's docstring; or
    from them decoded, ``decoded``): ``boxes`` XYXY in input pixels (clipped), ``scores``, ``labels`` (0-based
    int64), best first."""
    boxes, objectness, classes = decode_all(outputs, specs, input_size, decoded)
    results = []
    for n in range(boxes.shape[0]):
        scores = objectness[n, :, None] * classes[n]  # (P, C): objectness * class probability
        index, label = (scores > score_thresh).nonzero(as_tuple=True)
        kept_scores = scores[index, label]
        kept_boxes = clip_boxes_to_image(boxes[n, index], input_size)
        keep = batched_nms(kept_boxes, kept_scores, label, nms_thresh)[:detections_per_image]
        results.append({"boxes": kept_boxes[keep], "scores": kept_scores[keep], "labels": label[keep]})
    return results


class DarknetDetector(nn.Module):
    """A :class:`DarknetNetwork` with Darknet's YOLO loss (train mode) under ``dialect`` (``model.darknet_dialect``:
    alexeyab, pjreddie, gradient; ``yolo_loss.yolo_loss``) and decoding (eval mode); see the module's docstring."""

    def __init__(self, network: DarknetNetwork, score_thresh: float = 0.005, nms_thresh: float = 0.45,
                 detections_per_image: int = 100, dialect: str = "alexeyab") -> None:
        super().__init__()
        self.network = network
        self.score_thresh = score_thresh
        self.nms_thresh = nms_thresh
        self.detections_per_image = detections_per_image
        self.dialect = dialect

    @property
    def specs(self) -> list[Yolo]:
        """The ``[yolo]`` specs, in the order of the network's outputs."""
        return [head.spec for head in sorted(self.network.yolo_heads, key=lambda h: h.output)]

    def forward(self, images: Sequence[Tensor], targets: Sequence[dict[str, Tensor]] | None = None):
        sizes = {tuple(image.shape[-2:]) for image in images}
        if len(sizes) != 1:
            raise ValueError(f"DarknetDetector: the images of a call must have one size, got {sorted(sizes)}")
        x = torch.stack([image.as_subclass(Tensor) for image in images])
        input_size = (x.shape[-2], x.shape[-1])
        outputs = self.network(x)
        if self.training:
            if targets is None:
                raise ValueError("DarknetDetector: targets are needed in training mode")
            return yolo_loss(outputs, self.specs, targets, input_size, dialect=self.dialect)
        return postprocess(outputs, self.specs, input_size, self.score_thresh, self.nms_thresh,
                           self.detections_per_image, decoded=getattr(self.network, "decoded", False))

    def compile_regions(self) -> list[nn.Module]:
        """What ``model.compile`` compiles (``engine/compile.py``): the network, from the stacked images to the
        ``[yolo]`` layers' outputs; the loss (its target assignment) and the decoding stay eager."""
        return [self.network]

    def decoded_network(self) -> DecodedNetwork:
        """The network with its outputs decoded (``export --postprocess``)."""
        return DecodedNetwork(self.network, self.specs)
