"""Darknet's ``[yolo]`` training signal as Darknet computes it: the ``delta`` of forward_yolo_layer, for the two
dialects ``alexeyab`` (AlexeyAB/darknet ``src/yolo_layer.c``: process_batch, delta_yolo_box, delta_yolo_class,
averages_yolo_deltas; ``src/box.c``: dx_box_iou) and ``pjreddie`` (pjreddie/darknet ``src/yolo_layer.c``).

Darknet's delta is not the gradient of a loss (AlexeyAB's IoU-loss box delta lacks the logistic's slope and the
1/grid factor on x, y, and has ``2 in_w / anchor_w`` too much on w, h), so it is not written as a loss here: it is
computed as the C computes it, and :class:`DeltaLoss` hands ``-delta / N`` back as the gradient with respect to
the layer's input (``backward_yolo_layer`` adds ``delta`` to the input's delta unchanged; AlexeyAB's GPU build
multiplies it by ``delta_normalizer``, done here). The value reported for each term is Darknet's own cost, the
squared norm of that term's delta (``*(l.cost) = |delta|^2``), divided by ``N``.

Per layer with grid ``H x W``, network input ``in_w x in_h``, anchors in input pixels, the activated output
``o``: ``x, y = s sigmoid(z) - (s - 1) / 2`` (``s = scale_x_y``, AlexeyAB only), ``w, h = z``, objectness and
classes ``sigmoid(z)``; with ``new_coords`` (AlexeyAB) the input is already a logistic output and only ``s`` is
applied. A prediction decodes as ``x = (i + o_x) / W``, ``w = exp(o_w) a_w / in_w`` (``new_coords``:
``4 o_w^2 a_w / in_w``).

1. Every prediction: ``d_obj = -obj_normalizer o_obj`` (pjreddie: ``-o_obj``); if its best IoU with a truth
   exceeds ``ignore_thresh`` (AlexeyAB: only where some class output exceeds 0.25, compare_yolo_class) it is 0, or
   with ``objectness_smooth`` ``max(d_obj, obj_normalizer (iou - o_obj))``. Above ``truth_thresh`` the prediction
   is made responsible for that truth (objectness ``1 - o``, or ``iou^2 - o`` smoothed; classes; box).
2. Every truth, in order: its cell ``(floor(x W), floor(y H))`` and best anchor of all ``num`` by shape IoU; in the
   mask, that cell and anchor are responsible; AlexeyAB with ``iou_thresh < 1``: every other masked anchor whose
   shape IoU (``iou_thresh_kind``) exceeds ``iou_thresh`` as well. A responsible slot gets:

   - objectness ``m obj_normalizer (1 - o_obj)`` (``m`` the truth class's multiplier, ``max(counters) /
     counter`` capped at ``max_delta``, from ``counters_per_class``, each counter at least 1; 1 without it); with
     ``objectness_smooth`` only where the delta is still 0;
   - classes (delta_yolo_class): the slot's first truth sets every class, ``y_c - o_c`` (``y`` one-hot, or
     ``y (1 - eps) + eps / 2`` with ``label_smooth_eps``; its own class times ``m cls_normalizer`` with
     counters; ``focal_loss``: ``(y_c - o_c) alpha g``, ``alpha = 0.5``, ``g = -(1 - p)(2 p log p + p - 1)``,
     ``p`` the own class's output); a later truth on the slot sets its own class only, ``(y - o) m``
     (pjreddie: ``1 - o``);
   - box, ``mse``: ``(2 - w h) iou_normalizer m (t - o)`` with ``t_x = x W - i``, ``t_w = log(w in_w / a_w)``
     (``new_coords``: ``sqrt(w in_w / (4 a_w))``); pjreddie without the normaliser. IoU losses (AlexeyAB):
     ``iou_normalizer m`` times dx_box_iou's partials of IoU / GIoU / DIoU / CIoU (:func:`iou_partials`) with
     respect to the box's x, y, w, h in fractions of the input, w, h times ``exp(o_w)`` unless ``new_coords``;
     non-finite values become 0, then each is clipped to ``max_delta``.

   Two truths on one slot: AlexeyAB adds their box deltas and, with ``iou_thresh < 1``, divides a slot's box
   delta by the number of its classes with a positive delta (averages_yolo_deltas); pjreddie keeps the later one.

The C reads its deltas back (``if (delta[...])``) in a few places; here a value that is exactly 0 by arithmetic
(an output of exactly 0 or 1) is not told apart from one never written, which can differ from the C only there.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchvision.ops import complete_box_iou, distance_box_iou, generalized_box_iou

from bigbatch.darknet.cfg import Yolo

DIALECTS = ("alexeyab", "pjreddie", "gradient")
"""``model.darknet_dialect``: the two forks' deltas (this module), or ``gradient``: the true gradient of a loss
(``yolo_loss.py``)."""

CLASS_MATCH_THRESH = 0.25
FOCAL_ALPHA = 0.5
PJREDDIE_MAX_BOXES = 90
"""pjreddie's ``max`` default (parse_yolo)."""

PJREDDIE_VALUES = {"scale_x_y": 1.0, "iou_normalizer": 1.0, "obj_normalizer": 1.0, "cls_normalizer": 1.0,
                   "delta_normalizer": 1.0, "iou_loss": "mse", "iou_thresh": 1.0, "max_delta": math.inf,
                   "counters_per_class": None, "label_smooth_eps": 0.0, "new_coords": 0, "objectness_smooth": 0,
                   "focal_loss": 0}
"""The ``[yolo]`` keys pjreddie's parse_yolo does not read, and the value it trains as if they had."""


def class_multipliers(spec: Yolo) -> Tensor | None:
    """AlexeyAB's get_classes_multipliers (src/parser.c): ``max(counters) / counter_c``, capped at ``max_delta``,
    each counter first raised to at least 1 (``if (counters_per_class[i] < 1) counters_per_class[i] = 1``, so a
    class counted 0 times has multiplier ``max(counters)``, not inf); None without ``counters_per_class``."""
    if spec.counters_per_class is None:
        return None
    counters = torch.tensor(spec.counters_per_class, dtype=torch.float64).clamp(min=1)
    return (counters.max() / counters).clamp(max=spec.max_delta)


def box_cap(spec: Yolo, dialect: str) -> int:
    """The most truths a layer reads per image: ``max`` (pjreddie's default is 90, AlexeyAB's 200)."""
    if dialect == "pjreddie" and "max" not in spec.lines:
        return PJREDDIE_MAX_BOXES
    return spec.max_boxes


def first_truths(boxes: Tensor, labels: Tensor, valid: Tensor, cap: int) -> tuple[Tensor, Tensor, Tensor]:
    """The truths a layer reads: the first ``cap`` valid ones of each image (Darknet's ``max``), in their order,
    moved to the front and the rest dropped, so that what is built for every prediction and truth (their IoUs) holds
    at most ``cap`` truths an image, however many boxes a label file gave: ``boxes`` ``(N, T', 4)``, ``labels``,
    ``valid`` ``(N, T')``, ``T' = min(T, cap)``; unchanged when ``T <= cap``."""
    if boxes.shape[1] <= cap:
        return boxes, labels, valid
    keep = valid & (torch.cumsum(valid.long(), dim=1) <= cap)
    order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)[:, :cap]  # kept first, in their order
    return (boxes.gather(1, order[..., None].expand(-1, -1, boxes.shape[2])), labels.gather(1, order),
            keep.gather(1, order))


def iou_partials(pred: Tensor, truth: Tensor, kind: str) -> Tensor:
    """AlexeyAB's dx_box_iou (box.c) on rows of ``(x, y, w, h)`` boxes (fractions of the input, ``w, h > 0``):
    the partials ``(d/dx, d/dy, d/dw, d/dh)`` Darknet uses for IoU (``kind`` iou), GIoU, DIoU and CIoU.

    With edges ``t, b, l, r`` of the prediction and ``I = I_w I_h`` (not clamped at 0), ``U = X + X^ - I``:
    ``dIoU/de = (U dI/de - I dU/de) / U^2`` for each edge (0 where ``U <= 0``), then ``d/dx = d/dl + d/dr``,
    ``d/dw = d/dr - d/dl`` (not halved), likewise y, h. GIoU adds ``(C dU/de - U dC/de) / C^2`` per edge (``C`` the
    enclosing box's area); DIoU/CIoU add the partials of ``-S / C_d`` (``S`` the squared centre distance, ``C_d``
    the enclosing box's squared diagonal); CIoU adds ``alpha 8 / pi^2 (atan(w^/h^) - atan(w/h)) (h, -w)`` to the
    w, h partials, ``alpha = v / (1 - IoU + v + 1e-6)``. Where the boxes do not overlap (``I_w <= 0`` or
    ``I_h <= 0``) the GIoU/DIoU/CIoU terms replace the IoU ones."""
    px, py, pw, ph = pred.unbind(-1)
    tx, ty, tw, th = truth.unbind(-1)
    pt, pb, pl, pr = py - ph / 2, py + ph / 2, px - pw / 2, px + pw / 2
    tt, tb, tl, tr = ty - th / 2, ty + th / 2, tx - tw / 2, tx + tw / 2
    zero = torch.zeros_like(px)
    area = (pb - pt) * (pr - pl)
    truth_area = (tb - tt) * (tr - tl)
    inter_h = torch.minimum(pb, tb) - torch.maximum(pt, tt)
    inter_w = torch.minimum(pr, tr) - torch.maximum(pl, tl)
    inter = inter_w * inter_h
    union = area + truth_area - inter
    # partials of the prediction's area, the intersection and the union, per edge (t, b, l, r)
    d_area = torch.stack([-(pr - pl), pr - pl, -(pb - pt), pb - pt])
    d_inter = torch.stack([torch.where(pt > tt, -inter_w, zero), torch.where(pb < tb, inter_w, zero),
                           torch.where(pl > tl, -inter_h, zero), torch.where(pr < tr, inter_h, zero)])
    d_union = d_area - d_inter
    edge = torch.where(union > 0, (union * d_inter - inter * d_union) / (union * union), zero)
    apart = (inter_w <= 0) | (inter_h <= 0)
    if kind == "giou":
        enclose_w = torch.maximum(pr, tr) - torch.minimum(pl, tl)
        enclose_h = torch.maximum(pb, tb) - torch.minimum(pt, tt)
        enclose = enclose_w * enclose_h
        d_enclose = torch.stack([torch.where(pt < tt, -enclose_w, zero), torch.where(pb > tb, enclose_w, zero),
                                 torch.where(pl < tl, -enclose_h, zero), torch.where(pr > tr, enclose_h, zero)])
        term = (enclose * d_union - union * d_enclose) / (enclose * enclose)
        edge = torch.where(apart, term, torch.where(enclose > 0, edge + term, edge))
    d_t, d_b, d_l, d_r = edge.unbind(0)
    partials = torch.stack([d_l + d_r, d_t + d_b, d_r - d_l, d_b - d_t], dim=-1)
    if kind in ("diou", "ciou"):
        cw = torch.maximum(pr, tr) - torch.minimum(pl, tl)
        ch = torch.maximum(pb, tb) - torch.minimum(pt, tt)
        diag = cw * cw + ch * ch
        dist = (px - tx) ** 2 + (py - ty) ** 2
        dcw_dx = (pr > tr).to(px) - (pl < tl).to(px)
        dcw_dw = 0.5 * (pr > tr).to(px) + 0.5 * (pl < tl).to(px)
        dch_dy = (pb > tb).to(px) - (pt < tt).to(px)
        dch_dh = 0.5 * (pb > tb).to(px) + 0.5 * (pt < tt).to(px)
        term = torch.stack([
            (2 * (tx - px) * diag - 2 * cw * dcw_dx * dist) / (diag * diag),
            (2 * (ty - py) * diag - 2 * ch * dch_dy * dist) / (diag * diag),
            2 * cw * dcw_dw * dist / (diag * diag),
            2 * ch * dch_dh * dist / (diag * diag)], dim=-1)
        if kind == "ciou":
            angle = torch.atan(tw / th) - torch.atan(pw / ph)
            v = 4 / math.pi ** 2 * angle * angle
            alpha = v / (1 - inter / union + v + 0.000001)
            term = term + torch.stack([zero, zero, alpha * 8 / math.pi ** 2 * angle * ph,
                                       -alpha * 8 / math.pi ** 2 * angle * pw], dim=-1)
        partials = torch.where(apart[:, None], term, torch.where((diag > 0)[:, None], partials + term, partials))
    return partials


class DeltaLoss(torch.autograd.Function):
    """``forward(x, delta, value) = value``; the gradient with respect to ``x`` is ``-delta`` (times the incoming
    gradient): a loss whose step is Darknet's ``delta``."""

    @staticmethod
    def forward(ctx, x: Tensor, delta: Tensor, value: Tensor) -> Tensor:
        ctx.save_for_backward(delta)
        ctx.x_dtype = x.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (delta,) = ctx.saved_tensors
        return (-delta * grad).to(ctx.x_dtype), None, None


def _box_deltas(act: Tensor, raw_wh: Tensor, truth: Tensor, cells: Tensor, anchor: Tensor, weight: Tensor,
                spec: Yolo, grid: tuple[int, int], input_size: tuple[int, int], dialect: str) -> Tensor:
    """delta_yolo_box for ``K`` assignments: ``act`` ``(K, 4)`` the activated x, y, w, h at the slot, ``truth``
    ``(K, 4)``, ``cells`` ``(K, 2)`` (i, j), ``anchor`` ``(K, 2)`` pixels, ``weight`` ``(K,)`` the normaliser
    times the class multiplier: ``(K, 4)``."""
    height, width = grid
    in_h, in_w = input_size
    i, j = cells[:, 0].to(act), cells[:, 1].to(act)
    if spec.iou_loss == "mse" or dialect == "pjreddie":
        scale = 2 - truth[:, 2] * truth[:, 3]
        if spec.new_coords:
            tw = torch.sqrt(truth[:, 2] * in_w / (4 * anchor[:, 0]))
            th = torch.sqrt(truth[:, 3] * in_h / (4 * anchor[:, 1]))
        else:
            tw = torch.log(truth[:, 2] * in_w / anchor[:, 0])
            th = torch.log(truth[:, 3] * in_h / anchor[:, 1])
        target = torch.stack([truth[:, 0] * width - i, truth[:, 1] * height - j, tw, th], dim=1)
        return (scale * weight)[:, None] * (target - act)
    if spec.new_coords:
        size = 4 * act[:, 2:] ** 2 * anchor
    else:
        size = torch.exp(act[:, 2:]) * anchor
    pred = torch.stack([(i + act[:, 0]) / width, (j + act[:, 1]) / height, size[:, 0] / in_w, size[:, 1] / in_h],
                       dim=1)
    pred[:, 2:] = torch.where(pred[:, 2:] == 0, torch.ones_like(pred[:, 2:]), pred[:, 2:])
    partials = iou_partials(pred, truth, spec.iou_loss)
    if not spec.new_coords:
        partials = torch.cat([partials[:, :2], partials[:, 2:] * torch.exp(raw_wh)], dim=1)
    partials = torch.nan_to_num(partials * weight[:, None], nan=0.0, posinf=0.0, neginf=0.0)
    if spec.max_delta != math.inf:
        partials = partials.clamp(-spec.max_delta, spec.max_delta)
    return partials


def _class_set_all(out_cls: Tensor, labels: Tensor, spec: Yolo, multipliers: Tensor | None,
                   dialect: str) -> Tensor:
    """delta_yolo_class's branch for a slot without class deltas yet: every class, ``(K, C)``."""
    onehot = torch.nn.functional.one_hot(labels, spec.classes).to(out_cls)
    if dialect == "alexeyab" and spec.focal_loss:
        p = out_cls.gather(1, labels[:, None])[:, 0] + 1e-15
        grad = -(1 - p) * (2 * p * torch.log(p) + p - 1)
        return (onehot - out_cls) * (FOCAL_ALPHA * grad)[:, None]
    target = onehot
    if dialect == "alexeyab" and spec.label_smooth_eps:
        target = onehot * (1 - spec.label_smooth_eps) + 0.5 * spec.label_smooth_eps
    delta = target - out_cls
    if dialect == "alexeyab" and multipliers is not None:
        delta = delta * torch.where(onehot > 0, (multipliers[labels] * spec.cls_normalizer)[:, None],
                                    torch.ones_like(delta))
    return delta


def _class_own(out_cls: Tensor, labels: Tensor, spec: Yolo, multipliers: Tensor | None, dialect: str) -> Tensor:
    """delta_yolo_class's branch for a slot with class deltas: the truth's own class only, ``(K,)``."""
    p = out_cls.gather(1, labels[:, None])[:, 0]
    if dialect == "pjreddie":
        return 1 - p
    y = 1.0 - 0.5 * spec.label_smooth_eps if spec.label_smooth_eps else 1.0
    delta = y - p
    return delta * multipliers[labels] if multipliers is not None else delta


def _pairwise_iou(a: Tensor, b: Tensor) -> Tensor:
    """box.c box_iou of every ``(cx, cy, w, h)`` box of ``a`` ``(N, P, 4)`` with every one of ``b`` ``(N, T, 4)``."""
    def edges(box: Tensor) -> tuple[Tensor, Tensor]:
        return box[..., :2] - box[..., 2:] / 2, box[..., :2] + box[..., 2:] / 2

    a_lo, a_hi = edges(a[:, :, None])
    b_lo, b_hi = edges(b[:, None])
    overlap = torch.minimum(a_hi, b_hi) - torch.maximum(a_lo, b_lo)
    inter = torch.where((overlap < 0).any(-1), torch.zeros_like(overlap[..., 0]), overlap[..., 0] * overlap[..., 1])
    union = (a[:, :, None, 2] * a[:, :, None, 3]) + (b[:, None, :, 2] * b[:, None, :, 3]) - inter
    return torch.where((inter == 0) | (union == 0), torch.zeros_like(inter), inter / union)


def shape_iou(truth_wh: Tensor, anchor_wh: Tensor, kind: str = "iou") -> Tensor:
    """``(K, M)``: the IoU (or ``kind``: giou, diou, ciou, as box.c box_iou_kind) of each truth ``(K, 2)`` with each
    anchor ``(M, 2)``, both boxes centred at 0 (the anchor match of yolo_layer.c)."""
    if kind == "iou":
        inter = torch.minimum(truth_wh[:, None, 0], anchor_wh[None, :, 0]) * torch.minimum(truth_wh[:, None, 1],
                                                                                           anchor_wh[None, :, 1])
        union = (truth_wh[:, 0] * truth_wh[:, 1])[:, None] + (anchor_wh[:, 0] * anchor_wh[:, 1])[None, :] - inter
        return inter / union
    truths = torch.cat([-truth_wh / 2, truth_wh / 2], dim=1)
    anchors = torch.cat([-anchor_wh / 2, anchor_wh / 2], dim=1)
    pairwise = {"giou": generalized_box_iou, "diou": distance_box_iou, "ciou": complete_box_iou}[kind]
    return pairwise(truths, anchors)


def layer_delta(raw: Tensor, spec: Yolo, boxes: Tensor, labels: Tensor, valid: Tensor,
                input_size: tuple[int, int], dialect: str) -> Tensor:
    """The ``delta`` of forward_yolo_layer (``dialect`` alexeyab or pjreddie) for the raw input ``raw`` ``(N,
    len(mask) * (5 + C), H, W)`` and the truths ``boxes`` ``(N, T, 4)`` (cx, cy, w, h fractions of the input),
    ``labels`` ``(N, T)``, ``valid`` ``(N, T)``: float64, the shape of ``raw``. See the module's docstring."""
    alexeyab = dialect == "alexeyab"
    n_images, _, height, width = raw.shape
    n_anchors, classes = len(spec.mask), spec.classes
    in_h, in_w = input_size
    z = raw.detach().double().reshape(n_images, n_anchors, 5 + classes, height, width)
    device = z.device
    s = spec.scale_x_y if alexeyab else 1.0
    act = z.clone() if (alexeyab and spec.new_coords) else torch.cat(
        [torch.sigmoid(z[:, :, :2]), z[:, :, 2:4], torch.sigmoid(z[:, :, 4:])], dim=2)
    act[:, :, :2] = act[:, :, :2] * s - 0.5 * (s - 1)
    obj_norm = spec.obj_normalizer if alexeyab else 1.0
    smooth = alexeyab and bool(spec.objectness_smooth)
    multipliers = class_multipliers(spec) if alexeyab else None
    if multipliers is not None:
        multipliers = multipliers.to(device)
    all_anchors = torch.tensor(spec.anchors, dtype=torch.float64, device=device)
    masked = all_anchors[list(spec.mask)]
    mask_index = torch.tensor([spec.mask.index(n) if n in spec.mask else -1 for n in range(spec.num)],
                              device=device)
    boxes, labels, valid = first_truths(boxes, labels, valid, box_cap(spec, dialect))
    valid = valid & (torch.cumsum(valid.long(), dim=1) <= box_cap(spec, dialect))
    truth = boxes.double()
    delta = torch.zeros_like(z)

    # 1. every prediction
    cols = torch.arange(width, device=device, dtype=torch.float64)
    rows = torch.arange(height, device=device, dtype=torch.float64)[:, None]
    size = (4 * act[:, :, 2:4] ** 2 if (alexeyab and spec.new_coords) else torch.exp(act[:, :, 2:4]))
    pred = torch.stack([(cols + act[:, :, 0]) / width, (rows + act[:, :, 1]) / height,
                        size[:, :, 0] * masked[:, 0, None, None] / in_w,
                        size[:, :, 1] * masked[:, 1, None, None] / in_h], dim=-1)  # (N, A, H, W, 4)
    if truth.shape[1]:
        iou = _pairwise_iou(pred.reshape(n_images, -1, 4), truth)
        iou = iou.masked_fill(~valid[:, None, :], 0)
        best_iou, best_t = iou.max(dim=2)
        best_iou = best_iou.view(n_images, n_anchors, height, width)
        best_t = best_t.view(n_images, n_anchors, height, width)
    else:
        best_iou = z.new_zeros(n_images, n_anchors, height, width)
        best_t = torch.zeros(best_iou.shape, dtype=torch.long, device=device)
    p_obj = act[:, :, 4]
    d_obj = -obj_norm * p_obj
    match_iou = best_iou
    if alexeyab:
        has_class = (act[:, :, 5:] > CLASS_MATCH_THRESH).any(dim=2)
        match_iou = torch.where(has_class, best_iou, torch.zeros_like(best_iou))
    ignored = match_iou > spec.ignore_thresh
    if smooth:
        d_obj = torch.where(ignored, torch.maximum(d_obj, obj_norm * (match_iou - p_obj)), d_obj)
    else:
        d_obj = torch.where(ignored, torch.zeros_like(d_obj), d_obj)
    delta[:, :, 4] = d_obj

    class_written = torch.zeros(n_images, n_anchors, height, width, dtype=torch.bool, device=device)
    b, a, j, i = (best_iou > spec.truth_thresh).nonzero(as_tuple=True)
    if b.numel():
        t = best_t[b, a, j, i]
        lab = labels[b, t]
        mult = multipliers[lab] if multipliers is not None else torch.ones_like(b, dtype=torch.float64)
        iou_sq = best_iou[b, a, j, i] ** 2
        p = act[b, a, 4, j, i]
        delta[b, a, 4, j, i] = obj_norm * ((iou_sq if smooth else 1.0) - p)
        cls = _class_set_all(act[b, a, 5:, j, i], lab, spec, multipliers, dialect)
        if smooth:
            cls[torch.arange(b.numel(), device=device), lab] = mult * (iou_sq - act[b, a, 5 + lab, j, i])
        delta[b, a, 5:, j, i] = cls
        class_written[b, a, j, i] = True
        norm = (spec.iou_normalizer if alexeyab else 1.0) * mult
        delta[b, a, :4, j, i] += _box_deltas(act[b, a, :4, j, i], z[b, a, 2:4, j, i], truth[b, t],
                                             torch.stack([i, j], 1), masked[a], norm, spec, (height, width),
                                             input_size, dialect)

    # 2. every truth: its responsible slots, in the C's order (key)
    b_t, t_t = valid.nonzero(as_tuple=True)
    if b_t.numel():
        box_t = truth[b_t, t_t]
        i_t = (box_t[:, 0] * width).long().clamp(0, width - 1)
        j_t = (box_t[:, 1] * height).long().clamp(0, height - 1)
        anchors_norm = all_anchors / torch.tensor([in_w, in_h], dtype=torch.float64, device=device)
        best_n = shape_iou(box_t[:, 2:], anchors_norm, "iou").argmax(dim=1)
        parts = [(torch.arange(b_t.numel(), device=device), best_n, 0)]
        if alexeyab and spec.iou_thresh < 1:
            kind_iou = shape_iou(box_t[:, 2:], anchors_norm, spec.iou_thresh_kind)
            n_ids = torch.arange(spec.num, device=device)
            extra = (kind_iou > spec.iou_thresh) & (mask_index >= 0)[None, :] & (n_ids[None, :] != best_n[:, None])
            k, n = extra.nonzero(as_tuple=True)
            parts.append((k, n, 1))
        k = torch.cat([p[0] for p in parts])
        n = torch.cat([p[1] for p in parts])
        order_in_truth = torch.cat([p[1] * p[2] + p[2] for p in parts])  # best anchor first, then others by n
        keep = mask_index[n] >= 0
        k, n, order_in_truth = k[keep], n[keep], order_in_truth[keep]
        order = torch.argsort(k * (spec.num + 2) + order_in_truth, stable=True)
        k, n = k[order], n[order]
        b, t, a, j, i = b_t[k], t_t[k], mask_index[n], j_t[k], i_t[k]
        lab = labels[b, t]
        mult = multipliers[lab] if multipliers is not None else torch.ones_like(b, dtype=torch.float64)
        norm = (spec.iou_normalizer if alexeyab else 1.0) * mult
        box = _box_deltas(act[b, a, :4, j, i], z[b, a, 2:4, j, i], truth[b, t], torch.stack([i, j], 1),
                          all_anchors[n], norm, spec, (height, width), input_size, dialect)
        slot = ((b * n_anchors + a) * height + j) * width + i
        position = torch.arange(slot.numel(), device=device)
        slots, inverse = torch.unique(slot, return_inverse=True)
        first = torch.full_like(slots, slot.numel()).scatter_reduce(0, inverse, position, "amin")
        last = torch.full_like(slots, -1).scatter_reduce(0, inverse, position, "amax")
        sb, sa, sj, si = b[first], a[first], j[first], i[first]
        # box: AlexeyAB adds, pjreddie keeps the later truth
        if alexeyab:
            delta[sb, sa, :4, sj, si] += torch.zeros(slots.numel(), 4, dtype=box.dtype,
                                                     device=device).index_add_(0, inverse, box)
        else:
            delta[sb, sa, :4, sj, si] = box[last]
        # objectness
        p = act[sb, sa, 4, sj, si]
        if smooth:
            value = mult[first] * obj_norm * (1 - p)
            current = delta[sb, sa, 4, sj, si]
            delta[sb, sa, 4, sj, si] = torch.where(current == 0, value, current)
        else:
            delta[sb, sa, 4, sj, si] = mult[last] * obj_norm * (1 - p)
        # classes: the first truth on a slot without class deltas sets all; every later one its own class
        fresh = ~class_written[sb, sa, sj, si]
        f = first[fresh]
        delta[b[f], a[f], 5:, j[f], i[f]] = _class_set_all(act[b[f], a[f], 5:, j[f], i[f]], lab[f], spec,
                                                           multipliers, dialect)
        own = torch.ones_like(position, dtype=torch.bool)
        own[f] = False
        o = position[own]
        delta[b[o], a[o], 5 + lab[o], j[o], i[o]] = _class_own(act[b[o], a[o], 5:, j[o], i[o]], lab[o], spec,
                                                               multipliers, dialect)

    if alexeyab and spec.iou_thresh < 1:  # averages_yolo_deltas
        count = (delta[:, :, 5:] > 0).sum(dim=2)
        divide = (delta[:, :, 4] != 0) & (count > 0)
        delta[:, :, :4] = torch.where(divide[:, :, None], delta[:, :, :4] / count.clamp(min=1)[:, :, None],
                                      delta[:, :, :4])
    return delta.reshape(raw.shape)


def layer_loss(raw: Tensor, spec: Yolo, boxes: Tensor, labels: Tensor, valid: Tensor, input_size: tuple[int, int],
               dialect: str, normaliser: float) -> dict[str, Tensor]:
    """The terms ``loss_box``, ``loss_obj``, ``loss_cls`` of one ``[yolo]`` layer under a Darknet ``dialect``: each
    a :class:`DeltaLoss` whose gradient with respect to ``raw`` is minus that term's part of :func:`layer_delta`
    (times ``delta_normalizer``, AlexeyAB), divided by ``normaliser``; its value is the squared norm of that part
    divided by ``normaliser`` (Darknet's cost)."""
    delta = layer_delta(raw, spec, boxes, labels, valid, input_size, dialect)
    if dialect == "alexeyab" and spec.delta_normalizer != 1:
        delta = delta * spec.delta_normalizer
    n_images, _, height, width = raw.shape
    per_entry = delta.view(n_images, len(spec.mask), 5 + spec.classes, height, width)
    parts = {"loss_box": slice(0, 4), "loss_obj": slice(4, 5), "loss_cls": slice(5, None)}
    terms = {}
    for name, entries in parts.items():
        part = torch.zeros_like(per_entry)
        part[:, :, entries] = per_entry[:, :, entries]
        part = part.reshape(raw.shape)
        value = (part * part).sum() / normaliser
        terms[name] = DeltaLoss.apply(raw, (part / normaliser).to(raw.dtype), value.to(torch.float32))
    return terms
