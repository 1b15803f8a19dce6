"""Darknet's test-time path for one image (AlexeyAB's ``darknet detector test``, src/detector.c ``test_detector``),
in torch: the preprocessing, the decoding thresholds, the NMS kinds and the box correction, each as Darknet does it.

Preprocessing (``preprocess``): the image's bytes become floats ``byte / 255.`` (src/image.c ``load_image_stb``),
then either ``resize_image`` to the network's size (a separable bilinear stretch, align-corners style: source column
``c * (im.w - 1) / (w - 1)``, the last column taken as it is) or, when the cfg has ``[net] letter_box=1`` (or
``-letter_box`` is given), ``letterbox_image``: the image resized to ``new_w = net_w, new_h = (h * net_w) / w``
(integer division; or the other way round, whichever side is tighter) and pasted at the integer offset
``((net_w - new_w) / 2, (net_h - new_h) / 2)`` of a canvas filled with 0.5.

Post-processing (``detections``), src/yolo_layer.c ``get_yolo_detections`` and src/box.c: a cell and anchor is a
candidate when its objectness ``> thresh``; its class ``j`` scores ``objectness * p_j``, kept when ``> thresh``.
Boxes are mapped back to the original image by ``correct_yolo_boxes`` (letterbox: ``x' = (x - (net_w - new_w) / 2)
/ new_w``, the offset a float there, though ``letterbox_image`` pasted at an integer one), then per class NMS at 0.45
of the kind set by the LAST ``[yolo]`` layer: ``default`` (``do_nms_sort``) and ``cornersnms`` (parsed as default by
a ``[yolo]`` layer) suppress on IoU; ``greedynms`` on DIoU ``IoU - (d / c)^0.6`` (``box_diou``, the exponent fixed);
``diounms`` on ``IoU - (d / c)^beta_nms`` (``box_diounms``), with ``d`` the squared distance of the centres and
``c`` the squared diagonal of the enclosing box, both measured in coordinates relative to the image (``x / W``,
``y / H``, as Darknet's boxes are at that point), which the distance term depends on. Darknet does not clip; the
boxes here are clipped to the image after NMS.

The eval path of ``DarknetDetector`` (``detector.py``) is another thing: validation's thresholds, plain NMS, boxes
in input pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import batched_nms, box_iou, clip_boxes_to_image

from bigbatch.darknet.cfg import Yolo
from bigbatch.darknet.detector import DarknetDetector, decode_all
from bigbatch.darknet.spec import DarknetCfg

NMS_THRESH = 0.45
"""``test_detector``'s NMS threshold (``float nms = .45``)."""


def _f32(value: float) -> float:
    """``value`` rounded to float32 (a C ``float``)."""
    return float(np.float32(value))


def _taps(source: int, size: int) -> tuple[Tensor, Tensor]:
    """For each of ``size`` output positions along an axis of ``source`` pixels: the first source index ``i`` and
    its weight ``d`` as ``resize_image`` computes them in float32: ``s = k * scale``, ``i = (int) s``, ``d = s - i``,
    ``scale = (float)(source - 1) / (size - 1)``. Darknet divides by zero for ``size == 1`` (a NaN index for rows);
    here ``scale = 0`` then: index 0."""
    scale = _f32(np.float32(source - 1) / np.float32(size - 1)) if size > 1 else 0.0
    s = torch.arange(size, dtype=torch.float32) * torch.tensor(scale, dtype=torch.float32)
    index = s.long()  # truncation; s >= 0
    return index.clamp(max=source - 1), s - index.float()


def resize_image(image: Tensor, width: int, height: int) -> Tensor:
    """Darknet's ``resize_image`` (src/image.c) of a float ``[C, H, W]`` image to ``[C, height, width]``, float32
    step for step: first along rows, ``part[c] = (1 - dx) im[ix] + dx im[ix + 1]`` (the last output column, or any
    column of a one-pixel-wide source, is ``im[W - 1]``); then along columns, ``out[r] = (1 - dy) part[iy]``, plus
    ``dy part[iy + 1]`` except on the last output row or for a one-pixel-high source (the last row is NOT
    special-cased like the last column: where ``(height - 1) * h_scale`` rounds below ``H - 1``, it is a weighted
    ``part[iy]`` only, as Darknet's). A copy when the size is unchanged."""
    image = image.float()
    channels, in_h, in_w = image.shape
    if (in_w, in_h) == (width, height):
        return image.clone()
    ix, dx = _taps(in_w, width)
    part = (1 - dx) * image[:, :, ix] + dx * image[:, :, (ix + 1).clamp(max=in_w - 1)]
    last = torch.arange(width) == width - 1
    if in_w == 1:
        last[:] = True
    part = torch.where(last, image[:, :, in_w - 1:in_w], part)
    iy, dy = _taps(in_h, height)
    dy = dy[:, None]
    first = (1 - dy) * part[:, iy]
    second = dy * part[:, (iy + 1).clamp(max=in_h - 1)]
    added = torch.arange(height)[:, None] != height - 1
    if in_h == 1:
        added[:] = False
    return torch.where(added, first + second, first)


def letterbox_size(image_size: tuple[int, int], net_size: tuple[int, int]) -> tuple[int, int]:
    """``(new_h, new_w)``: the size the image takes inside the network's input in ``letterbox_image`` and
    ``correct_yolo_boxes``: ``new_w = net_w, new_h = (h * net_w) / w`` (integer division) when ``(float)net_w / w <
    (float)net_h / h`` (float32), else ``new_h = net_h, new_w = (w * net_h) / h``. ``image_size = (h, w)``,
    ``net_size = (net_h, net_w)``."""
    h, w = image_size
    net_h, net_w = net_size
    if np.float32(net_w) / np.float32(w) < np.float32(net_h) / np.float32(h):
        return (h * net_w) // w, net_w
    return net_h, (w * net_h) // h


@dataclass(frozen=True)
class Geometry:
    """Where an image went in the network's input: its own ``image_size = (h, w)``, the input's ``net_size = (net_h,
    net_w)``, ``letter`` (letterboxed or stretched), and the pasted image's ``resized = (new_h, new_w)`` at the
    integer ``offset = (dy, dx)`` (the whole input, at (0, 0), when stretched)."""

    image_size: tuple[int, int]
    net_size: tuple[int, int]
    letter: bool
    resized: tuple[int, int]
    offset: tuple[int, int]


def geometry(image_size: tuple[int, int], net_size: tuple[int, int], letter: bool) -> Geometry:
    """The :class:`Geometry` of an image of ``image_size`` for an input of ``net_size``."""
    if not letter:
        return Geometry(tuple(image_size), tuple(net_size), False, tuple(net_size), (0, 0))
    new_h, new_w = letterbox_size(image_size, net_size)
    offset = ((net_size[0] - new_h) // 2, (net_size[1] - new_w) // 2)
    return Geometry(tuple(image_size), tuple(net_size), True, (new_h, new_w), offset)


def letterbox_image(image: Tensor, width: int, height: int) -> tuple[Tensor, Geometry]:
    """Darknet's ``letterbox_image`` (src/image.c): ``image`` (float ``[C, H, W]``) resized by :func:`resize_image`
    to :func:`letterbox_size` and pasted at the integer offset ``((width - new_w) / 2, (height - new_h) / 2)`` of a
    ``[C, height, width]`` canvas of 0.5 (``embed_image``); -> (canvas, its :class:`Geometry`)."""
    placed = geometry(tuple(image.shape[-2:]), (height, width), True)
    (new_h, new_w), (dy, dx) = placed.resized, placed.offset
    canvas = torch.full((image.shape[0], height, width), 0.5, dtype=torch.float32)
    canvas[:, dy:dy + new_h, dx:dx + new_w] = resize_image(image, new_w, new_h)
    return canvas, placed


def preprocess(image: Tensor, net_size: tuple[int, int], letter: bool) -> tuple[Tensor, Geometry]:
    """A ``uint8 [3, H, W]`` image as ``test_detector`` feeds it: ``byte / 255.`` (``load_image_stb``, computed in
    double, stored as float), then :func:`letterbox_image` when ``letter`` else :func:`resize_image` to ``net_size =
    (net_h, net_w)``; -> (float32 ``[3, net_h, net_w]``, :class:`Geometry`)."""
    floats = (image.double() / 255.0).float()
    net_h, net_w = net_size
    if letter:
        return letterbox_image(floats, net_w, net_h)
    return resize_image(floats, net_w, net_h), geometry(tuple(image.shape[-2:]), (net_h, net_w), False)


def correct_boxes(boxes: Tensor, image_size: tuple[int, int], net_size: tuple[int, int], letter: bool) -> Tensor:
    """XYXY ``boxes`` in the network input's pixels -> in the original image's pixels, as ``correct_yolo_boxes``
    (src/yolo_layer.c) maps them: ``x' = (x - (net_w - new_w) / 2) / new_w * w`` (likewise y), with the FLOAT
    half-difference and ``(new_h, new_w)`` from :func:`letterbox_size` (the net size when not ``letter``). Not
    clipped."""
    (h, w), (net_h, net_w) = image_size, net_size
    new_h, new_w = letterbox_size(image_size, net_size) if letter else (net_h, net_w)
    offset = boxes.new_tensor([(net_w - new_w) / 2, (net_h - new_h) / 2] * 2)
    scale = boxes.new_tensor([w / new_w, h / new_h] * 2)
    return (boxes - offset) * scale


def diou(boxes: Tensor, others: Tensor, beta: float) -> Tensor:
    """``box_diou``/``box_diounms`` (src/box.c) of every box of ``boxes`` (XYXY, ``[N, 4]``) with every one of
    ``others`` (``[M, 4]``) -> ``[N, M]``: ``IoU - (d / c)^beta``, ``d`` the squared distance of the centres, ``c``
    the squared diagonal of the enclosing box (plain IoU where ``c == 0``; IoU 0 without overlap)."""
    iou = box_iou(boxes, others)
    d = ((boxes[:, None, :2] + boxes[:, None, 2:]) / 2 - (others[None, :, :2] + others[None, :, 2:]) / 2)
    low = torch.minimum(boxes[:, None, :2], others[None, :, :2])
    high = torch.maximum(boxes[:, None, 2:], others[None, :, 2:])
    c = (high - low).square().sum(-1)
    return torch.where(c == 0, iou, iou - (d.square().sum(-1) / c.clamp(min=torch.finfo(c.dtype).tiny)).pow(beta))


def diou_matrix(boxes: Tensor, beta: float) -> Tensor:
    """:func:`diou` of every pair of ``boxes``."""
    return diou(boxes, boxes, beta)


def darknet_nms(boxes: Tensor, scores: Tensor, labels: Tensor, iou_thresh: float = NMS_THRESH,
                kind: str = "default", beta: float = 0.6) -> Tensor:
    """Indices of the detections ``test_detector``'s NMS keeps, best first: per class, in the order of the class's
    score, a detection not yet suppressed suppresses every later one whose overlap is ``> iou_thresh``: IoU for
    ``default`` (``do_nms_sort``) and ``cornersnms``; DIoU with exponent 0.6 for ``greedynms`` and ``beta`` for
    ``diounms`` (``diounms_sort``, src/box.c). Darknet measures the DIoU kinds' distance term in coordinates relative
    to the image (``x / W``, ``y / H``): pass the boxes so to get its answers."""
    if kind in ("default", "cornersnms"):
        return batched_nms(boxes, scores, labels, iou_thresh)
    if kind not in ("greedynms", "diounms"):
        raise ValueError(f"nms kind: expected default, greedynms, diounms or cornersnms, got {kind!r}")
    exponent = 0.6 if kind == "greedynms" else beta
    kept = []
    for label in labels.unique():
        index = (labels == label).nonzero().flatten()
        index = index[scores[index].argsort(descending=True, stable=True)]
        ordered = boxes[index].float()
        remaining = torch.arange(len(index))  # not suppressed yet, best first: the first of them is kept
        while len(remaining):
            best, rest = remaining[0], remaining[1:]
            kept.append(index[best:best + 1])
            remaining = rest[~(diou(ordered[best:best + 1], ordered[rest], exponent)[0] > iou_thresh)]
    keep = torch.cat(kept) if kept else labels.new_zeros(0)
    return keep[scores[keep].argsort(descending=True, stable=True)]


def detections(outputs: Sequence[Tensor], specs: Sequence[Yolo], geometries: Sequence[Geometry],
               conf: float = 0.25, iou: float = NMS_THRESH, max_det: int = 100, nms_kind: str = "default",
               beta: float = 0.6, decoded: bool = False) -> list[dict[str, Tensor]]:
    """The detections of each image from the raw inputs of the ``[yolo]`` layers (``DarknetNetwork`` outputs, a batch
    of images all at ``geometries[i].net_size``; or from them decoded, ``decoded``: ``detector.decode_all``), as
    ``test_detector`` finds them (see the module's docstring):
    candidates with objectness ``> conf``, each class with ``objectness * p > conf`` a detection, boxes corrected to
    the original image, :func:`darknet_nms` per class, boxes clipped to the image, at most ``max_det`` by score.
    -> per image ``{"boxes": XYXY float in original pixels, "scores", "labels": int64}``, best first."""
    net_size = geometries[0].net_size
    boxes, objectness, classes = decode_all(outputs, specs, net_size, decoded)
    results = []
    for n, placed in enumerate(geometries):
        scores = objectness[n, :, None] * classes[n]
        candidate = (objectness[n] > conf)[:, None] & (scores > conf)
        index, label = candidate.nonzero(as_tuple=True)
        kept_scores = scores[index, label]
        kept_boxes = correct_boxes(boxes[n, index], placed.image_size, net_size, placed.letter)
        h, w = placed.image_size
        relative = kept_boxes / kept_boxes.new_tensor([w, h, w, h])
        keep = darknet_nms(relative, kept_scores, label, iou, nms_kind, beta)[:max_det]
        results.append({"boxes": clip_boxes_to_image(kept_boxes[keep], (h, w)), "scores": kept_scores[keep],
                        "labels": label[keep]})
    return results


def cfg_letter_box(cfg: DarknetCfg) -> bool:
    """Whether the cfg asks for letterboxing: ``[net] letter_box`` non-zero (Darknet's ``option_find_int``)."""
    try:
        return int(cfg.net.options.get("letter_box", "0").strip()) != 0
    except ValueError:  # Darknet's atoi reads a non-number as 0
        return False


def cfg_nms(specs: Sequence[Yolo]) -> tuple[str, float]:
    """``(nms_kind, beta_nms)`` of the last ``[yolo]`` layer, the one ``test_detector`` takes them from."""
    return (specs[-1].nms_kind, specs[-1].beta_nms) if specs else ("default", 0.6)


class DarknetTest:
    """``darknet detector test`` on one image with a :class:`DarknetDetector`'s network: ``tester(image)`` with a
    ``uint8 [3, H, W]`` image -> ``{"boxes", "scores", "labels"}`` in the image's pixels. ``letter``: letterbox
    (default: the cfg's ``[net] letter_box``, as Darknet, where ``-letter_box`` can only turn it on)."""

    def __init__(self, detector: DarknetDetector, letter: bool | None = None, conf: float = 0.25,
                 iou: float = NMS_THRESH, max_det: int = 100) -> None:
        network = detector.network
        self.network = network
        self.specs = detector.specs
        self.net_size = (network.input_shape.height, network.input_shape.width)
        self.letter = cfg_letter_box(network.cfg) if letter is None else letter
        self.nms_kind, self.beta = cfg_nms(self.specs)
        self.conf, self.iou, self.max_det = conf, iou, max_det

    @torch.no_grad()
    def __call__(self, image: Tensor) -> dict[str, Tensor]:
        x, placed = preprocess(image, self.net_size, self.letter)
        was_training = self.network.training
        self.network.eval()
        try:
            outputs = self.network(x[None])
        finally:
            self.network.train(was_training)
        return detections(outputs, self.specs, [placed], self.conf, self.iou, self.max_det, self.nms_kind,
                          self.beta)[0]
