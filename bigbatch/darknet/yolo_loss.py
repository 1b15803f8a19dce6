"""The loss of Darknet's ``[yolo]`` layer. :func:`yolo_loss` dispatches on ``model.darknet_dialect``: ``alexeyab``
and ``pjreddie`` hand back that fork's own ``delta`` (``yolo_delta.py``); ``gradient`` is this module's
:func:`yolo_layer_loss`, a true loss written for autograd, described below.

``gradient``: its gradient w.r.t. each raw network output is minus the ``delta`` Darknet's ``forward_yolo_layer``
computes (AlexeyAB/darknet ``src/yolo_layer.c``: ``process_batch``, ``delta_yolo_box``, ``delta_yolo_class``;
pjreddie/darknet ``src/yolo_layer.c`` for the v3 rules) for the objectness and class terms and the mse box term,
and the exact gradient of the IoU loss for ``iou_loss`` giou/diou/ciou (AlexeyAB's hand-written delta is not),
summed over the images of the call and divided by their number.

Darknet's delta is ``target - output`` on the raw output ``z`` (the logistic's derivative is not applied: the conv
before a ``[yolo]`` is linear and ``backward_yolo_layer`` adds ``delta`` as it is), and the update is the delta
summed over the batch times ``lr / batch``. Here the loss of a call with ``N`` images is
``(sum over images of the terms below) / N``; bigbatch averages the losses of the ``S`` micro-batches of a step, so
the step's gradient is ``-(sum of Darknet's deltas over the batch) / batch`` for every batch/subdivisions layout.

Per ``[yolo]`` layer with grid ``H x W``, input ``in_w x in_h`` (the current one: anchors, pixels of the input, are
divided by it, as Darknet after a resize), ``s = scale_x_y``, ``p = sigmoid(z)``, truths in fractions of the input
``(x, y, w, h)``, and ``bce(z, y) = -y log p - (1 - y) log(1 - p) - H(y)`` (BCE-with-logits less the entropy of the
target, a constant: ``d bce / dz = p - y`` and ``bce = 0`` at ``p = y``):

1. Every prediction (cell ``(i, j)``, masked anchor ``a``) is decoded as get_yolo_box:
   ``x = (i + s p_x - (s - 1) / 2) / W``, ``y`` likewise, ``w = exp(z_w) anchor_w / in_w``, ``h`` likewise; its best
   IoU with the image's truths decides its objectness: ``> ignore_thresh`` no loss (delta 0), else
   ``obj_normalizer * bce(z_obj, 0)`` (delta ``obj_normalizer (0 - p)``). With ``ignore_needs_class`` (AlexeyAB's
   ``compare_yolo_class``) the IoU counts only where some class has ``p > 0.25``. If the best IoU is
   ``> truth_thresh`` (default 1: never) the prediction is made responsible for that best truth (AlexeyAB and
   pjreddie: objectness, class and box terms of 3., in its own cell).
2. Every truth ``t``: its cell ``(floor(x W), floor(y H))`` (clamped to the grid) and the best of all ``num`` anchors
   of the cfg by shape IoU (both boxes centred at 0; the first on a tie). If that anchor is in the mask, that cell
   and anchor are responsible for ``t``. With ``iou_thresh < 1`` (AlexeyAB) every other masked anchor whose shape IoU
   (``iou_thresh_kind``: iou, giou, diou, ciou) with the truth is ``> iou_thresh`` is responsible as well, in the
   same cell, whether or not the best anchor is in this layer's mask.
3. A responsible prediction with anchor ``(a_w, a_h)`` (pixels):

   - objectness ``obj_normalizer * bce(z_obj, 1)`` (delta ``obj_normalizer (1 - p)``: AlexeyAB applies
     obj_normalizer to both the no-object and the object delta);
   - classes ``sum_c bce(z_c, y_c)``, ``y`` one-hot, or ``y = y (1 - eps) + eps / 2`` with ``label_smooth_eps``
     (delta_yolo_class). AlexeyAB multiplies by ``cls_normalizer`` only the true class and only together with
     ``counters_per_class`` (not implemented, refused by :class:`~bigbatch.darknet.detector.DarknetDetector`),
     so, as the C, ``cls_normalizer`` changes nothing here;
   - box, ``iou_loss=mse`` (delta_yolo_box's old loss), with ``scale = 2 - w h`` of the truth:
     ``iou_normalizer * scale * s * (bce(z_x, (t_x + (s - 1) / 2) / s) + bce(z_y, ...))``, ``t_x = x W - i``
     (gradient ``iou_normalizer * scale * (s p_x - (s - 1) / 2 - t_x)``: Darknet's delta on the scaled output, not
     passed through the logistic), and ``iou_normalizer * scale * 0.5 * ((z_w - log(w in_w / a_w))^2 + (z_h - ...)^2)``.
     AlexeyAB multiplies the mse deltas by ``iou_normalizer`` (default 0.75 in its parser; pjreddie has no such key);
   - box, ``iou_loss`` = iou / giou / diou / ciou: ``iou_normalizer * (1 - IoU/GIoU/DIoU/CIoU)`` of the decoded box vs
     the truth, in fractions of the input (torchvision.ops ``*_box_iou_loss``), without ``scale``, as the C. By
     autograd: the gradient includes the derivative of the logistic (x, y) and of exp (w, h) exactly, where
     AlexeyAB's hand-written delta (``dx_box_iou``) applies exp's derivative to w, h only and none to x, y. As the
     C, a non-finite gradient element becomes 0 and ``max_delta`` (if set) clips each one (per image, before / N).

Several truths on one cell and anchor: the later one (in the targets' order, the C's loop order; the truth_thresh
assignments of 1. come before all) sets the box term, as pjreddie's ``delta[...] = ...`` overwrites (AlexeyAB adds the
box deltas instead, ``+=``, then divides them by the number of positive classes when ``iou_thresh < 1``:
averages_yolo_deltas; not done here); the objectness target is 1; the class target is the union of their classes
(delta_yolo_class: once the cell has class deltas, a later truth only sets its own class to 1: both forks).

Truths as Darknet's data loader leaves them (fill_truth_detection): boxes clipped to the input, those under one input
pixel wide or high dropped (AlexeyAB's ``lowest_w = 1 / net.w``), at most ``max`` (``max_boxes``) per image, the
first ones. Darknet also shuffles an image's boxes when it loads them (randomize_boxes), which only changes which
truth is "later"; here the targets' order is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import (
    box_convert,
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

from bigbatch.darknet.cfg import Yolo
from bigbatch.darknet.yolo_delta import DIALECTS, first_truths, layer_loss, shape_iou
from bigbatch.errors import UserError

LOSS_NAMES = ("loss_box", "loss_obj", "loss_cls")
CLASS_MATCH_THRESH = 0.25
"""AlexeyAB's compare_yolo_class threshold (``conf_thresh = 0.25f`` in process_batch)."""


@dataclass(frozen=True)
class Truths:
    """The truths of a batch, padded to the most boxes in one image: ``boxes`` ``(N, T, 4)`` as fractions of the input
    ``(cx, cy, w, h)``, ``labels`` ``(N, T)`` int64, ``valid`` ``(N, T)`` bool (padding is False)."""

    boxes: Tensor
    labels: Tensor
    valid: Tensor


def darknet_truths(targets: Sequence[dict[str, Tensor]], input_size: tuple[int, int], classes: int,
                   dialect: str = "alexeyab") -> Truths:
    """``targets`` (``boxes`` XYXY in input pixels, ``labels`` ``0..classes-1``) as Darknet's truths for an input of
    ``input_size = (height, width)``: clipped to the input, boxes under one input pixel wide or high dropped
    (AlexeyAB's fill_truth_detection; pjreddie's drops those under 0.001 of the input)."""
    in_h, in_w = input_size
    kept_boxes, kept_labels = [], []
    for n, target in enumerate(targets):
        boxes = target["boxes"].as_subclass(Tensor).reshape(-1, 4)
        boxes = boxes if boxes.is_floating_point() else boxes.float()
        labels = target["labels"].as_subclass(Tensor).reshape(-1).long()
        if labels.numel() != boxes.shape[0]:
            raise UserError(f"targets[{n}]: {boxes.shape[0]} boxes but {labels.numel()} labels")
        outside = labels[(labels < 0) | (labels >= classes)]
        if outside.numel():
            raise UserError(f"targets[{n}]: label {int(outside[0])} is outside 0..{classes - 1} (the cfg's [yolo] "
                            f"classes={classes})")
        x1 = boxes[:, 0].clamp(0, in_w)
        x2 = boxes[:, 2].clamp(0, in_w)
        y1 = boxes[:, 1].clamp(0, in_h)
        y2 = boxes[:, 3].clamp(0, in_h)
        if dialect == "pjreddie":  # pjreddie fill_truth_detection: w < .001 || h < .001 is dropped
            keep = ((x2 - x1) / in_w >= 0.001) & ((y2 - y1) / in_h >= 0.001)
        else:  # AlexeyAB fill_truth_detection: w < 1 / net.w is dropped
            keep = ((x2 - x1) >= 1) & ((y2 - y1) >= 1)
        xywh = torch.stack([(x1 + x2) / 2 / in_w, (y1 + y2) / 2 / in_h, (x2 - x1) / in_w, (y2 - y1) / in_h], dim=1)
        kept_boxes.append(xywh[keep])
        kept_labels.append(labels[keep])
    count = max((b.shape[0] for b in kept_boxes), default=0)
    n_images = len(targets)
    device = kept_boxes[0].device if kept_boxes else torch.device("cpu")
    dtype = kept_boxes[0].dtype if kept_boxes else torch.float32
    boxes = torch.zeros(n_images, count, 4, dtype=dtype, device=device)
    labels = torch.zeros(n_images, count, dtype=torch.long, device=device)
    valid = torch.zeros(n_images, count, dtype=torch.bool, device=device)
    for n, (b, lab) in enumerate(zip(kept_boxes, kept_labels, strict=True)):
        boxes[n, : b.shape[0]] = b
        labels[n, : b.shape[0]] = lab
        valid[n, : b.shape[0]] = True
    return Truths(boxes, labels, valid)


def decode_boxes(raw_box: Tensor, anchors: Tensor, input_size: tuple[int, int], scale_x_y: float,
                 new_coords: bool = False) -> Tensor:
    """Darknet's get_yolo_box on raw ``(N, A, 4, H, W)`` outputs (x, y, w, h) with ``anchors`` ``(A, 2)`` in input
    pixels: ``(N, A, H, W, 4)`` boxes ``(cx, cy, w, h)`` as fractions of the input, ``cx = (i + s sigmoid(z_x) -
    (s - 1) / 2) / W``, ``w = exp(z_w) anchor_w / in_w`` (likewise y, h). ``new_coords`` (AlexeyAB: the inputs are
    already logistic outputs): ``cx = (i + s z_x - (s - 1) / 2) / W``, ``w = 4 z_w^2 anchor_w / in_w``."""
    in_h, in_w = input_size
    height, width = raw_box.shape[-2:]
    s = scale_x_y
    cols = torch.arange(width, device=raw_box.device, dtype=raw_box.dtype)
    rows = torch.arange(height, device=raw_box.device, dtype=raw_box.dtype)[:, None]
    xy = (raw_box[:, :, :2] if new_coords else torch.sigmoid(raw_box[:, :, :2])) * s - (s - 1) / 2
    cx = (cols + xy[:, :, 0]) / width
    cy = (rows + xy[:, :, 1]) / height
    anchors = anchors.to(raw_box)
    size = 4 * raw_box[:, :, 2:4] ** 2 if new_coords else torch.exp(raw_box[:, :, 2:4])
    w = size[:, :, 0] * anchors[:, 0, None, None] / in_w
    h = size[:, :, 1] * anchors[:, 1, None, None] / in_h
    return torch.stack([cx, cy, w, h], dim=-1)


def _bce(logits: Tensor, target: Tensor) -> Tensor:
    """``BCE-with-logits(z, y) - H(y)`` elementwise: gradient ``sigmoid(z) - y``, zero at ``sigmoid(z) = y``."""
    y = target.clamp(0, 1)
    entropy = -(torch.special.xlogy(y, y) + torch.special.xlogy(1 - y, 1 - y))
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") - entropy


def _pairwise_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of every box of ``a`` ``(N, P, 4)`` with every box of ``b`` ``(N, T, 4)``, both XYXY: ``(N, P, T)``
    (box.c box_iou: intersection / union; 0 where they do not overlap)."""
    lt = torch.maximum(a[:, :, None, :2], b[:, None, :, :2])
    rb = torch.minimum(a[:, :, None, 2:], b[:, None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return inter / (area_a[:, :, None] + area_b[:, None, :] - inter)


class _FixGrad(torch.autograd.Function):
    """Identity forward; backward: non-finite elements -> 0, then clipped to ``[-bound, bound]`` (delta_yolo_box's
    fix_nan_inf and clip_value on the IoU-loss deltas)."""

    @staticmethod
    def forward(ctx, x: Tensor, bound: float) -> Tensor:
        ctx.bound = bound
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
        if ctx.bound != float("inf"):
            grad = grad.clamp(-ctx.bound, ctx.bound)
        return grad, None


_IOU_LOSSES = {"giou": generalized_box_iou_loss, "diou": distance_box_iou_loss, "ciou": complete_box_iou_loss}


def _iou_loss(pred_xyxy: Tensor, truth_xyxy: Tensor, kind: str) -> Tensor:
    """``1 - IoU`` (or GIoU, DIoU, CIoU) of matching rows, XYXY."""
    if kind == "iou":
        lt = torch.maximum(pred_xyxy[:, :2], truth_xyxy[:, :2])
        rb = torch.minimum(pred_xyxy[:, 2:], truth_xyxy[:, 2:])
        wh = (rb - lt).clamp(min=0)
        inter = wh[:, 0] * wh[:, 1]
        area_p = (pred_xyxy[:, 2] - pred_xyxy[:, 0]) * (pred_xyxy[:, 3] - pred_xyxy[:, 1])
        area_t = (truth_xyxy[:, 2] - truth_xyxy[:, 0]) * (truth_xyxy[:, 3] - truth_xyxy[:, 1])
        return 1 - inter / (area_p + area_t - inter)
    return _IOU_LOSSES[kind](pred_xyxy, truth_xyxy, reduction="none")


def yolo_layer_loss(raw: Tensor, spec: Yolo, truths: Truths, input_size: tuple[int, int], *,
                    normaliser: float = 1.0, ignore_needs_class: bool = False) -> dict[str, Tensor]:
    """The loss terms (``loss_box``, ``loss_obj``, ``loss_cls``, each summed over the images, then divided by
    ``normaliser``) of one ``[yolo]`` layer ``spec`` on its raw input ``raw`` ``(N, len(mask) * (5 + classes), H,
    W)``, for an input of ``input_size = (height, width)``. See the module's docstring for the formulas."""
    n_images, _, height, width = raw.shape
    n_anchors, classes = len(spec.mask), spec.classes
    if raw.shape[1] != n_anchors * (5 + classes):
        raise ValueError(f"[yolo] layer {spec.index}: {raw.shape[1]} channels, expected "
                         f"{n_anchors} * (5 + {classes})")
    in_h, in_w = input_size
    if raw.dtype in (torch.float16, torch.bfloat16):  # mixed precision: the loss in float32
        raw = raw.float()
    device, dtype = raw.device, raw.dtype
    out = raw.reshape(n_images, n_anchors, 5 + classes, height, width)
    s = spec.scale_x_y
    all_anchors = torch.tensor(spec.anchors, dtype=dtype, device=device)  # (num, 2) input pixels
    masked = all_anchors[list(spec.mask)]
    positions = [spec.mask.index(n) if n in spec.mask else -1 for n in range(spec.num)]
    mask_index = torch.tensor(positions, dtype=torch.long, device=device)  # int_index(l.mask, n, l.n)
    # the layer's truths: the first max_boxes of each image (and no more built on)
    truths = Truths(*first_truths(truths.boxes, truths.labels, truths.valid, spec.max_boxes))
    valid = truths.valid & (torch.cumsum(truths.valid.long(), dim=1) <= spec.max_boxes)
    truth_xywh = truths.boxes.to(dtype)
    truth_xyxy = box_convert(truth_xywh, "cxcywh", "xyxy")

    # 1. every prediction: its best IoU with the truths -> ignore, or responsible if above truth_thresh
    with torch.no_grad():
        pred = decode_boxes(out[:, :, :4].detach(), masked, input_size, s)  # (N, A, H, W, 4)
        if truths.boxes.shape[1]:
            iou = _pairwise_iou(box_convert(pred.reshape(n_images, -1, 4), "cxcywh", "xyxy"), truth_xyxy)
            iou = iou.masked_fill(~valid[:, None, :], 0)
            best_t = iou.argmax(dim=2)  # the first best truth, as the C's strict ">"
            best_iou = iou.gather(2, best_t[..., None])[..., 0]
            best_iou = best_iou.view(n_images, n_anchors, height, width)
            best_t = best_t.view(n_images, n_anchors, height, width)
        else:
            best_iou = pred.new_zeros(n_images, n_anchors, height, width)
            best_t = torch.zeros(n_images, n_anchors, height, width, dtype=torch.long, device=device)
        match_iou = best_iou
        if ignore_needs_class:  # AlexeyAB compare_yolo_class: some class probability above 0.25
            has_class = (torch.sigmoid(out[:, :, 5:].detach()) > CLASS_MATCH_THRESH).any(dim=2)
            match_iou = torch.where(has_class, best_iou, torch.zeros_like(best_iou))
        obj_weight = torch.where(match_iou > spec.ignore_thresh, 0.0, spec.obj_normalizer).to(dtype)

        # the responsible (image, anchor, row, col) slots, each with its truth, in the C's order (key)
        b_tt, a_tt, j_tt, i_tt = (best_iou > spec.truth_thresh).nonzero(as_tuple=True)
        t_tt = best_t[b_tt, a_tt, j_tt, i_tt]
        key_tt = torch.full_like(b_tt, -1)

        b_t, t_t = valid.nonzero(as_tuple=True)
        box_t = truth_xywh[b_t, t_t]
        i_t = (box_t[:, 0] * width).long().clamp(0, width - 1)  # i = (truth.x * l.w)
        j_t = (box_t[:, 1] * height).long().clamp(0, height - 1)
        anchors_norm = all_anchors / torch.tensor([in_w, in_h], dtype=dtype, device=device)
        anchor_iou = shape_iou(box_t[:, 2:], anchors_norm)  # (K, num)
        best_n = anchor_iou.argmax(dim=1) if anchor_iou.numel() else torch.zeros_like(b_t)
        stride_key = spec.num + 1
        parts = [(b_tt, a_tt, j_tt, i_tt, t_tt, key_tt)]
        in_mask = mask_index[best_n] >= 0
        parts.append((b_t[in_mask], mask_index[best_n][in_mask], j_t[in_mask], i_t[in_mask], t_t[in_mask],
                      t_t[in_mask] * stride_key))
        if spec.iou_thresh < 1:  # AlexeyAB: other masked anchors above iou_thresh
            kind_iou = anchor_iou if spec.iou_thresh_kind == "iou" else shape_iou(box_t[:, 2:], anchors_norm,
                                                                                   spec.iou_thresh_kind)
            anchor_ids = torch.arange(spec.num, device=device)
            extra = ((kind_iou > spec.iou_thresh) & (mask_index >= 0)[None, :]
                     & (anchor_ids[None, :] != best_n[:, None]))
            k, n = extra.nonzero(as_tuple=True)
            parts.append((b_t[k], mask_index[n], j_t[k], i_t[k], t_t[k], t_t[k] * stride_key + 1 + n))
        b, a, j, i, t, key = (torch.cat(column) for column in zip(*parts, strict=True))

        slot = ((b * n_anchors + a) * height + j) * width + i
        slots, inverse = torch.unique(slot, return_inverse=True)
        last = torch.full_like(slots, torch.iinfo(torch.long).min).scatter_reduce(0, inverse, key, "amax")
        winner = key == last[inverse]  # the later truth on a slot sets its box term
        obj_target = torch.zeros(n_images, n_anchors, height, width, dtype=dtype, device=device)
        obj_target[b, a, j, i] = 1
        obj_weight[b, a, j, i] = spec.obj_normalizer
        eps = spec.label_smooth_eps
        class_target = torch.zeros(slots.numel(), classes, dtype=dtype, device=device)
        class_target[inverse, truths.labels[b, t]] = 1  # the union of the slot's truths' classes
        if eps:
            class_target = class_target * (1 - eps) + 0.5 * eps
    zeros = out.new_zeros(())

    # objectness: every prediction
    loss_obj = (obj_weight * _bce(out[:, :, 4], obj_target)).sum()

    # classes: every responsible slot once
    sb = slots // (n_anchors * height * width)
    sa = slots // (height * width) % n_anchors
    sj = slots // width % height
    si = slots % width
    loss_cls = _bce(out[sb, sa, 5:, sj, si], class_target).sum() if slots.numel() else zeros

    # box: the winning truth of each responsible slot
    wb, wa, wj, wi, wt = b[winner], a[winner], j[winner], i[winner], t[winner]
    if wb.numel():
        z = out[wb, wa, :4, wj, wi]  # (K, 4)
        truth = truth_xywh[wb, wt]
        anchor = masked[wa]
        if spec.iou_loss == "mse":
            scale = 2 - truth[:, 2] * truth[:, 3]
            tx = truth[:, 0] * width - wi.to(dtype)
            ty = truth[:, 1] * height - wj.to(dtype)
            tw = torch.log(truth[:, 2] * in_w / anchor[:, 0])
            th = torch.log(truth[:, 3] * in_h / anchor[:, 1])
            xy = s * (_bce(z[:, 0], (tx + (s - 1) / 2) / s) + _bce(z[:, 1], (ty + (s - 1) / 2) / s))
            wh = 0.5 * ((z[:, 2] - tw) ** 2 + (z[:, 3] - th) ** 2)
            loss_box = (spec.iou_normalizer * scale * (xy + wh)).sum()
        else:
            z = _FixGrad.apply(z, spec.max_delta / normaliser)
            pred_box = torch.stack([
                (wi.to(dtype) + torch.sigmoid(z[:, 0]) * s - (s - 1) / 2) / width,
                (wj.to(dtype) + torch.sigmoid(z[:, 1]) * s - (s - 1) / 2) / height,
                torch.exp(z[:, 2]) * anchor[:, 0] / in_w,
                torch.exp(z[:, 3]) * anchor[:, 1] / in_h], dim=1)
            loss = _iou_loss(box_convert(pred_box, "cxcywh", "xyxy"), box_convert(truth, "cxcywh", "xyxy"),
                             spec.iou_loss)
            loss_box = spec.iou_normalizer * loss.sum()
    else:
        loss_box = zeros
    return {"loss_box": loss_box / normaliser, "loss_obj": loss_obj / normaliser, "loss_cls": loss_cls / normaliser}


def yolo_loss(outputs: Sequence[Tensor], specs: Sequence[Yolo], targets: Sequence[dict[str, Tensor]],
              input_size: tuple[int, int], *, dialect: str = "alexeyab") -> dict[str, Tensor]:
    """Darknet's loss of all ``[yolo]`` layers (``outputs[k]`` the raw input of ``specs[k]``) for the images of
    ``targets`` (``boxes`` XYXY in input pixels, ``labels`` 0-based) at ``input_size = (height, width)`` under
    ``dialect`` (``alexeyab``, ``pjreddie``: ``yolo_delta.layer_loss``; ``gradient``: :func:`yolo_layer_loss`):
    the dict ``loss_box``, ``loss_obj``, ``loss_cls``, each the sum over layers and images divided by the number of
    images."""

    if len(outputs) != len(specs):
        raise ValueError(f"{len(outputs)} outputs for {len(specs)} [yolo] layers")
    n_images = len(targets)
    if n_images == 0:
        raise ValueError("yolo_loss: no images")
    if dialect not in DIALECTS:
        raise ValueError(f"dialect {dialect!r}: expected one of {', '.join(DIALECTS)}")
    classes = min(spec.classes for spec in specs)
    truths = darknet_truths(targets, input_size, classes, dialect)
    total: dict[str, Tensor] = {}
    for raw, spec in zip(outputs, specs, strict=True):
        if raw.shape[0] != n_images:
            raise ValueError(f"{raw.shape[0]} images in an output, {n_images} targets")
        on_device = Truths(truths.boxes.to(raw.device), truths.labels.to(raw.device), truths.valid.to(raw.device))
        if dialect == "gradient":
            part = yolo_layer_loss(raw, spec, on_device, input_size, normaliser=n_images)
        else:
            part = layer_loss(raw.float() if raw.dtype in (torch.float16, torch.bfloat16) else raw, spec,
                              on_device.boxes, on_device.labels, on_device.valid, input_size, dialect, n_images)
        total = {k: total[k] + v for k, v in part.items()} if total else part
    return total
