"""Darknet's YOLO loss and decoding (bigbatch.darknet.yolo_loss, .detector) against independent oracles: a
literal transcription of AlexeyAB's process_batch (src/yolo_layer.c) in plain Python loops, whose deltas must be
minus the autograd gradient; the same step gradient for every batch/micro-batch layout; boxes built by hand that
must decode back to themselves."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from bigbatch.darknet import DarknetNetwork, read_darknet_cfg
from bigbatch.darknet.cfg import Yolo
from bigbatch.darknet.detector import DarknetDetector, check_supported, decode_yolo_output, postprocess
from bigbatch.darknet.yolo_loss import darknet_truths, yolo_layer_loss, yolo_loss
from bigbatch.errors import UserError

pytestmark = pytest.mark.fast


def gradient_loss(*args, **keys):
    """The ``gradient`` dialect's loss, the one this file checks (tests/darknet/test_yolo_dialects.py: the others)."""
    return yolo_loss(*args, dialect="gradient", **keys)

ANCHORS = ((8, 10), (14, 20), (24, 18), (30, 40), (44, 32), (60, 58))
INPUT = 64
GRID = 4
CLASSES = 3


def yolo_spec(**keys) -> Yolo:
    base = dict(index=0, section="yolo", line=1, mask=(0, 1, 2), anchors=ANCHORS, classes=CLASSES, num=6)
    return Yolo(**{**base, **keys})


# ----------------------------------------------------------------------------- the C, transcribed


def logistic(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def overlap(x1: float, w1: float, x2: float, w2: float) -> float:
    left = max(x1 - w1 / 2, x2 - w2 / 2)
    right = min(x1 + w1 / 2, x2 + w2 / 2)
    return right - left


def box_iou(a: tuple, b: tuple) -> float:
    """box.c: box_intersection / box_union, 0 when either is 0."""
    w = overlap(a[0], a[2], b[0], b[2])
    h = overlap(a[1], a[3], b[1], b[3])
    inter = 0.0 if (w < 0 or h < 0) else w * h
    union = a[2] * a[3] + b[2] * b[3] - inter
    return 0.0 if (inter == 0 or union == 0) else inter / union


def darknet_deltas(raw: torch.Tensor, truths: list[list[tuple]], spec: Yolo, net_w: int, net_h: int,
                   class_match: bool = False) -> tuple[torch.Tensor, dict[str, int]]:
    """forward_yolo_layer + process_batch (AlexeyAB), iou_loss=mse, element by element; truths per image as
    (x, y, w, h, class) fractions of the input. delta_yolo_box writes ``=`` (pjreddie) where AlexeyAB adds ``+=``:
    bigbatch's rule for two truths on one cell and anchor. Also returns counts of the rules that fired."""
    n_batch, _, lh, lw = raw.shape
    ln, classes = len(spec.mask), spec.classes
    outputs = lh * lw * ln * (classes + 5)
    stride = lw * lh
    x = [float(v) for v in raw.detach().reshape(-1)]  # l.output
    biases = [float(v) for pair in spec.anchors for v in pair]
    s, eps = spec.scale_x_y, spec.label_smooth_eps

    def entry_index(b: int, location: int, entry: int) -> int:
        n, loc = location // (lw * lh), location % (lw * lh)
        return b * outputs + n * lw * lh * (4 + classes + 1) + entry * lw * lh + loc

    for b in range(n_batch):
        for n in range(ln):
            index = entry_index(b, n * lw * lh, 0)
            for k in range(2 * lw * lh):  # activate_array(LOGISTIC) then scal_add_cpu(scale_x_y, -0.5 (s - 1))
                x[index + k] = logistic(x[index + k]) * s + -0.5 * (s - 1)
            index = entry_index(b, n * lw * lh, 4)
            for k in range((1 + classes) * lw * lh):
                x[index + k] = logistic(x[index + k])
    delta = [0.0] * len(x)
    stats = {"ignored": 0, "class_unmatched": 0, "truth_thresh": 0, "outside_mask": 0, "iou_thresh": 0,
             "rewritten": 0}

    def get_yolo_box(n: int, index: int, i: int, j: int) -> tuple:
        return ((i + x[index]) / lw, (j + x[index + stride]) / lh,
                math.exp(x[index + 2 * stride]) * biases[2 * n] / net_w,
                math.exp(x[index + 3 * stride]) * biases[2 * n + 1] / net_h)

    def delta_yolo_box(truth: tuple, n: int, index: int, i: int, j: int, scale: float) -> None:
        if any(delta[index + k * stride] for k in range(4)):
            stats["rewritten"] += 1
        tx = truth[0] * lw - i
        ty = truth[1] * lh - j
        tw = math.log(truth[2] * net_w / biases[2 * n])
        th = math.log(truth[3] * net_h / biases[2 * n + 1])
        delta[index + 0 * stride] = scale * (tx - x[index + 0 * stride]) * spec.iou_normalizer
        delta[index + 1 * stride] = scale * (ty - x[index + 1 * stride]) * spec.iou_normalizer
        delta[index + 2 * stride] = scale * (tw - x[index + 2 * stride]) * spec.iou_normalizer
        delta[index + 3 * stride] = scale * (th - x[index + 3 * stride]) * spec.iou_normalizer

    def delta_yolo_class(index: int, class_id: int) -> None:
        if delta[index + stride * class_id]:
            y_true = 1.0
            if eps:
                y_true = y_true * (1 - eps) + 0.5 * eps
            delta[index + stride * class_id] = y_true - x[index + stride * class_id]
            return
        for n in range(classes):
            y_true = 1.0 if n == class_id else 0.0
            if eps:
                y_true = y_true * (1 - eps) + 0.5 * eps
            delta[index + stride * n] = y_true - x[index + stride * n]

    def compare_yolo_class(class_index: int) -> int:
        return int(any(x[class_index + stride * k] > 0.25 for k in range(classes)))

    for b in range(n_batch):
        image_truths = truths[b]
        for j in range(lh):
            for i in range(lw):
                for n in range(ln):
                    class_index = entry_index(b, n * lw * lh + j * lw + i, 4 + 1)
                    obj_index = entry_index(b, n * lw * lh + j * lw + i, 4)
                    box_index = entry_index(b, n * lw * lh + j * lw + i, 0)
                    pred = get_yolo_box(spec.mask[n], box_index, i, j)
                    best_match_iou, best_iou, best_t = 0.0, 0.0, 0
                    for t, truth in enumerate(image_truths):
                        class_id_match = compare_yolo_class(class_index) if class_match else 1
                        iou = box_iou(pred, truth[:4])
                        if iou > best_match_iou and class_id_match == 1:
                            best_match_iou = iou
                        if iou > best_iou:
                            best_iou, best_t = iou, t
                    delta[obj_index] = spec.obj_normalizer * (0 - x[obj_index])
                    if best_match_iou > spec.ignore_thresh:
                        delta[obj_index] = 0
                        stats["ignored"] += 1
                    elif best_iou > spec.ignore_thresh:
                        stats["class_unmatched"] += 1
                    if best_iou > spec.truth_thresh:
                        stats["truth_thresh"] += 1
                        delta[obj_index] = spec.obj_normalizer * (1 - x[obj_index])
                        truth = image_truths[best_t]
                        delta_yolo_class(class_index, truth[4])
                        delta_yolo_box(truth, spec.mask[n], box_index, i, j, 2 - truth[2] * truth[3])
        for truth in image_truths:
            class_id = truth[4]
            best_iou, best_n = 0.0, 0
            i, j = int(truth[0] * lw), int(truth[1] * lh)
            truth_shift = (0.0, 0.0, truth[2], truth[3])
            for n in range(spec.num):
                iou = box_iou((0.0, 0.0, biases[2 * n] / net_w, biases[2 * n + 1] / net_h), truth_shift)
                if iou > best_iou:
                    best_iou, best_n = iou, n
            mask_n = spec.mask.index(best_n) if best_n in spec.mask else -1
            if mask_n >= 0:
                box_index = entry_index(b, mask_n * lw * lh + j * lw + i, 0)
                delta_yolo_box(truth, best_n, box_index, i, j, 2 - truth[2] * truth[3])
                obj_index = entry_index(b, mask_n * lw * lh + j * lw + i, 4)
                delta[obj_index] = spec.obj_normalizer * (1 - x[obj_index])
                delta_yolo_class(entry_index(b, mask_n * lw * lh + j * lw + i, 4 + 1), class_id)
            else:
                stats["outside_mask"] += 1
            for n in range(spec.num):
                mask_n = spec.mask.index(n) if n in spec.mask else -1
                if mask_n >= 0 and n != best_n and spec.iou_thresh < 1.0:
                    iou = box_iou((0.0, 0.0, biases[2 * n] / net_w, biases[2 * n + 1] / net_h), truth_shift)
                    if iou > spec.iou_thresh:
                        stats["iou_thresh"] += 1
                        box_index = entry_index(b, mask_n * lw * lh + j * lw + i, 0)
                        delta_yolo_box(truth, n, box_index, i, j, 2 - truth[2] * truth[3])
                        obj_index = entry_index(b, mask_n * lw * lh + j * lw + i, 4)
                        delta[obj_index] = spec.obj_normalizer * (1 - x[obj_index])
                        delta_yolo_class(entry_index(b, mask_n * lw * lh + j * lw + i, 4 + 1), class_id)
    return torch.tensor(delta, dtype=torch.float64).reshape(raw.shape), stats


# ----------------------------------------------------------------------------- a tiny layer by hand

# (centre x, centre y, w, h, class) in input pixels, per image; image 1 has no truth
BOXES = [
    [(24, 24, 9, 11, 0),     # cell (1, 1), anchor 0
     (20, 28, 8, 10, 2),     # the same cell and anchor, another class: the later truth
     (40, 40, 32, 38, 1),    # best anchor 3: another layer's mask
     (52, 12, 22, 17, 1)],   # cell (3, 0), anchor 2
    [],
    [(8, 52, 13, 19, 2),     # cell (0, 3), anchor 1
     (36, 36, 15, 21, 0)],
]


def raw_for(raw: torch.Tensor, spec: Yolo, b: int, a: int, col: int, row: int, box: tuple, size: int = INPUT,
            grid: int = GRID) -> None:
    """Set raw[b] so that anchor ``a`` (mask position) of cell (col, row) decodes to ``box`` (cx, cy, w, h, pixels)."""
    s = spec.scale_x_y
    out = raw.view(raw.shape[0], len(spec.mask), 5 + spec.classes, grid, grid)
    aw, ah = spec.anchors[spec.mask[a]]
    for k, (centre, cell) in enumerate(((box[0], col), (box[1], row))):
        p = (centre / size * grid - cell + (s - 1) / 2) / s
        out[b, a, k, row, col] = math.log(p / (1 - p))
    out[b, a, 2, row, col] = math.log(box[2] / aw)
    out[b, a, 3, row, col] = math.log(box[3] / ah)


def tiny_layer(spec: Yolo, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(3, len(spec.mask), 5 + CLASSES, GRID, GRID, generator=g, dtype=torch.float64) * 0.7
    raw[:, :, 5:] -= 1.0  # class probabilities on both sides of 0.25
    raw = raw.reshape(3, -1, GRID, GRID)
    raw_for(raw, spec, 0, 1, 3, 0, (51.0, 12.5, 21.0, 17.5))  # fits truth 3 (IoU ~0.9) on another anchor
    raw_for(raw, spec, 0, 0, 1, 1, (23.5, 24.5, 9.0, 11.5))   # fits truth 0 in its own slot
    raw_for(raw, spec, 0, 2, 2, 2, (43.0, 37.0, 28.0, 34.0))  # overlaps truth 2 (IoU ~0.7)
    raw_for(raw, spec, 2, 0, 2, 2, (38.0, 38.0, 15.0, 19.0))  # overlaps truth 1 of image 2 (IoU ~0.55)
    raw_for(raw, spec, 2, 0, 1, 2, (31.0, 38.0, 15.0, 19.0))  # overlaps it too (IoU ~0.43), in cell (1, 2),
    raw.view(3, len(spec.mask), 5 + CLASSES, GRID, GRID)[2, 0, 5:, 2, 1] = -3.0  # with no class above 0.25
    return raw


def targets_of(boxes: list[list[tuple]], dtype=torch.float64) -> list[dict[str, torch.Tensor]]:
    return [{"boxes": torch.tensor([[cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2] for cx, cy, w, h, _ in image],
                                   dtype=dtype).reshape(-1, 4),
             "labels": torch.tensor([c for *_, c in image], dtype=torch.int64)} for image in boxes]


def fractions(boxes: list[list[tuple]], size: int = INPUT) -> list[list[tuple]]:
    return [[(cx / size, cy / size, w / size, h / size, c) for cx, cy, w, h, c in image] for image in boxes]


VARIANTS = {
    "v3": (dict(ignore_thresh=0.5), False),
    "alexeyab": (dict(ignore_thresh=0.3, truth_thresh=0.6, iou_thresh=0.2, iou_normalizer=0.5, obj_normalizer=0.4,
                      scale_x_y=1.2, label_smooth_eps=0.1), True),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradient_is_minus_darknets_delta(variant):
    """The autograd gradient w.r.t. every raw output is -delta / N, delta from the transcribed C; the scenario
    really exercises each rule it should (ignored predictions, truths outside the mask, two truths on one slot, and in
    the AlexeyAB variant truth_thresh, iou_thresh, scale_x_y, normalisers, label smoothing, the class match)."""
    keys, class_match = VARIANTS[variant]
    spec = yolo_spec(**keys)
    raw = tiny_layer(spec).requires_grad_()
    truths = darknet_truths(targets_of(BOXES), (INPUT, INPUT), CLASSES)
    losses = yolo_layer_loss(raw, spec, truths, (INPUT, INPUT), normaliser=len(BOXES), ignore_needs_class=class_match)
    sum(losses.values()).backward()
    delta, stats = darknet_deltas(raw, fractions(BOXES), spec, INPUT, INPUT, class_match)
    assert stats["ignored"] > 0 and stats["outside_mask"] > 0 and stats["rewritten"] > 0
    if variant == "alexeyab":
        assert stats["truth_thresh"] > 0 and stats["iou_thresh"] > 0 and stats["class_unmatched"] > 0
    torch.testing.assert_close(raw.grad, -delta / len(BOXES), rtol=0, atol=1e-6)
    assert all(torch.isfinite(v) and v >= 0 for v in losses.values())


def test_float32_matches_too():
    """The same in float32 (the training dtype), to float32 precision."""
    spec = yolo_spec()
    raw = tiny_layer(spec).float().requires_grad_()
    sum(gradient_loss([raw], [spec], targets_of(BOXES, torch.float32), (INPUT, INPUT)).values()).backward()
    delta, _ = darknet_deltas(raw, fractions(BOXES), spec, INPUT, INPUT)
    torch.testing.assert_close(raw.grad.double(), -delta / len(BOXES), rtol=0, atol=2e-6)


def obj_grad(raw: torch.Tensor, spec: Yolo, a: int, col: int, row: int, b: int = 0) -> float:
    return float(raw.grad.view(raw.shape[0], len(spec.mask), 5 + CLASSES, GRID, GRID)[b, a, 4, row, col])


def test_ignore_rule():
    """A prediction overlapping a truth above ignore_thresh gets no objectness gradient; the same prediction moved
    away is pushed to 0 with obj_normalizer * p / N."""
    spec = yolo_spec(ignore_thresh=0.5, obj_normalizer=0.5)
    truth = [[(40, 40, 30, 38, 1)]]  # best anchor 3: no anchor of this layer is responsible
    for box, ignored in (((41.0, 39.0, 30.0, 36.0), True), ((8.0, 8.0, 30.0, 36.0), False)):
        raw = torch.zeros(1, 3 * (5 + CLASSES), GRID, GRID, dtype=torch.float64)
        raw_for(raw, spec, 0, 2, 0 if box[0] < 16 else 2, 0 if box[1] < 16 else 2, box)
        raw.requires_grad_()
        sum(gradient_loss([raw], [spec], targets_of(truth), (INPUT, INPUT)).values()).backward()
        cell = 0 if box[0] < 16 else 2
        expected = 0.0 if ignored else 0.5 * logistic(0.0)
        assert obj_grad(raw, spec, 2, cell, cell) == pytest.approx(expected, abs=1e-12)


def test_iou_thresh_rule():
    """iou_thresh < 1: a second masked anchor of a similar shape is responsible as well (objectness pushed to 1);
    with the default 1 only the best anchor is."""
    truth = [[(40, 40, 10, 16, 0)]]  # shape IoU with anchor 1 (14x20) 0.57, the best; anchor 0 (8x10) 0.5
    for iou_thresh, second in ((1.0, False), (0.45, True)):
        spec = yolo_spec(iou_thresh=iou_thresh)
        raw = torch.zeros(1, 3 * (5 + CLASSES), GRID, GRID, dtype=torch.float64, requires_grad=True)
        sum(gradient_loss([raw], [spec], targets_of(truth), (INPUT, INPUT)).values()).backward()
        assert obj_grad(raw, spec, 1, 2, 2) == pytest.approx(-0.5)  # p - 1 at the best anchor
        assert obj_grad(raw, spec, 0, 2, 2) == pytest.approx(-0.5 if second else 0.5)
        assert obj_grad(raw, spec, 2, 2, 2) == pytest.approx(0.5)  # 24x18: shape IoU 0.37, below 0.45


def test_later_truth_wins_the_box_and_classes_unite():
    """Two truths on one cell and anchor: the box term is the later truth's; the class target is both classes."""
    spec = yolo_spec()
    first, later = (24, 24, 9, 11, 0), (20, 28, 8, 10, 2)
    raw = torch.zeros(1, 3 * (5 + CLASSES), GRID, GRID, dtype=torch.float64, requires_grad=True)
    sum(gradient_loss([raw], [spec], targets_of([[first, later]]), (INPUT, INPUT)).values()).backward()
    grad = raw.grad.view(1, 3, 5 + CLASSES, GRID, GRID)[0, 0, :, 1, 1]
    alone = torch.zeros_like(raw, requires_grad=True)
    sum(gradient_loss([alone], [spec], targets_of([[later]]), (INPUT, INPUT)).values()).backward()
    torch.testing.assert_close(grad[:4], alone.grad.view(1, 3, 5 + CLASSES, GRID, GRID)[0, 0, :4, 1, 1])
    torch.testing.assert_close(grad[5:], torch.tensor([-0.5, 0.5, -0.5], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["iou", "giou", "diou", "ciou"])
def test_iou_losses(kind):
    """The IoU-family box losses: finite values and gradients (also for a box far off), lower for a better box, zero
    for the exact box; iou_normalizer scales them and (2 - wh) does not (as the C)."""
    spec = yolo_spec(iou_loss=kind, iou_normalizer=0.07)
    truth = [[(40, 24, 14, 22, 1)]]

    def box_loss(box: tuple, normalizer: float = 0.07) -> tuple[float, torch.Tensor]:
        raw = torch.zeros(1, 3 * (5 + CLASSES), GRID, GRID, dtype=torch.float64)
        raw_for(raw, spec, 0, 1, 2, 1, box)
        raw.requires_grad_()
        losses = gradient_loss([raw], [replace(spec, iou_normalizer=normalizer)], targets_of(truth), (INPUT, INPUT))
        sum(losses.values()).backward()
        return float(losses["loss_box"].detach()), raw.grad

    exact, _ = box_loss((40.0, 24.0, 14.0, 22.0))
    good, grad_good = box_loss((41.0, 25.0, 15.0, 20.0))
    bad, grad_bad = box_loss((46.0, 20.0, 24.0, 12.0))
    assert exact == pytest.approx(0.0, abs=1e-6)  # torchvision's eps
    assert 0 < good < bad
    assert torch.isfinite(grad_good).all() and torch.isfinite(grad_bad).all()
    doubled, _ = box_loss((46.0, 20.0, 24.0, 12.0), 0.14)
    assert doubled == pytest.approx(2 * bad)
    if kind in ("giou", "diou", "ciou"):  # one minus the torchvision op on fractions of the input
        import torchvision.ops as ops

        pred = torch.tensor([[46.0 - 12, 20.0 - 6, 46.0 + 12, 20.0 + 6]], dtype=torch.float64) / INPUT
        target = torch.tensor([[40.0 - 7, 24.0 - 11, 40.0 + 7, 24.0 + 11]], dtype=torch.float64) / INPUT
        expected = {"giou": ops.generalized_box_iou_loss, "diou": ops.distance_box_iou_loss,
                    "ciou": ops.complete_box_iou_loss}[kind](pred, target)
        assert bad == pytest.approx(0.07 * float(expected), rel=1e-9)


def test_max_delta_clips_the_iou_gradient():
    """max_delta bounds each element of the IoU-loss gradient (before the division by the images), as clip_value."""
    spec = yolo_spec(iou_loss="giou", iou_normalizer=10.0)
    truth = [[(40, 24, 14, 22, 1)]]
    grads = {}
    for max_delta in (math.inf, 0.05):
        raw = torch.zeros(1, 3 * (5 + CLASSES), GRID, GRID, dtype=torch.float64)
        raw_for(raw, spec, 0, 1, 2, 1, (46.0, 20.0, 24.0, 12.0))
        raw.requires_grad_()
        sum(gradient_loss([raw], [replace(spec, max_delta=max_delta)], targets_of(truth), (INPUT, INPUT)).values()
            ).backward()
        grads[max_delta] = raw.grad.view(1, 3, 5 + CLASSES, GRID, GRID)[0, 1, :4, 1, 2]
    assert grads[math.inf].abs().max() > 0.05
    torch.testing.assert_close(grads[0.05], grads[math.inf].clamp(-0.05, 0.05))


def test_truths_as_darknet_reads_them():
    """Boxes clipped to the input, those under one pixel dropped, at most max_boxes used; a bad label is refused."""
    targets = [{"boxes": torch.tensor([[-4.0, 10, 20, 30], [5, 5, 5.5, 20], [30, 30, 70, 50]]),
                "labels": torch.tensor([0, 1, 2])}]
    truths = darknet_truths(targets, (INPUT, INPUT), CLASSES)
    assert truths.valid.tolist() == [[True, True]]
    torch.testing.assert_close(truths.boxes[0, 0], torch.tensor([10 / 64, 20 / 64, 20 / 64, 20 / 64]))
    assert truths.labels.tolist() == [[0, 2]]
    with pytest.raises(UserError, match="label 3 is outside 0..2"):
        darknet_truths([{"boxes": torch.zeros(1, 4), "labels": torch.tensor([3])}], (INPUT, INPUT), CLASSES)
    spec = yolo_spec(max_boxes=1)
    raw = torch.zeros(1, 3 * (5 + CLASSES), GRID, GRID, dtype=torch.float64, requires_grad=True)
    sum(gradient_loss([raw], [spec], targets_of([[(24, 24, 9, 11, 0), (52, 12, 22, 17, 1)]]),
                  (INPUT, INPUT)).values()).backward()
    assert obj_grad(raw, spec, 0, 1, 1) == pytest.approx(-0.5)  # the first truth
    assert obj_grad(raw, spec, 2, 3, 0) == pytest.approx(0.5)  # the second: beyond max=1


# ----------------------------------------------------------------------------- decoding


def test_a_box_built_by_hand_decodes_to_itself():
    """One prediction decodes to its box and score obj * class; a weaker duplicate of the same class is removed by
    NMS, one of another class is kept; nothing below score_thresh."""
    spec = yolo_spec(scale_x_y=1.1)
    raw = torch.full((1, 3 * (5 + CLASSES), GRID, GRID), -20.0, dtype=torch.float64)
    out = raw.view(1, 3, 5 + CLASSES, GRID, GRID)
    box = (37.3, 21.9, 17.0, 26.0)
    raw_for(raw, spec, 0, 1, 2, 1, box)
    out[0, 1, 4, 1, 2], out[0, 1, 5 + 2, 1, 2] = 1.5, 0.8  # objectness and class 2
    raw_for(raw, spec, 0, 2, 2, 1, (38.0, 22.0, 17.0, 25.0))
    out[0, 2, 4, 1, 2], out[0, 2, 5 + 2, 1, 2], out[0, 2, 5 + 0, 1, 2] = 1.0, 0.5, 0.3
    boxes, objectness, classes = decode_yolo_output(raw, spec, (INPUT, INPUT))
    position = (1 * GRID + 1) * GRID + 2  # anchor 1, row 1, column 2
    expected = torch.tensor([box[0] - box[2] / 2, box[1] - box[3] / 2, box[0] + box[2] / 2, box[1] + box[3] / 2],
                            dtype=torch.float64)
    torch.testing.assert_close(boxes[0, position], expected, rtol=0, atol=1e-4)
    detections = postprocess([raw], [spec], (INPUT, INPUT), score_thresh=0.005, nms_thresh=0.45)
    (found,) = detections
    assert found["labels"].tolist() == [2, 0]
    assert found["labels"].dtype == torch.int64
    torch.testing.assert_close(found["boxes"][0], expected, rtol=0, atol=1e-4)
    assert float(found["scores"][0]) == pytest.approx(logistic(1.5) * logistic(0.8))
    assert float(found["scores"][1]) == pytest.approx(logistic(1.0) * logistic(0.3))
    assert float(objectness[0, position]) == pytest.approx(logistic(1.5))
    assert float(classes[0, position, 2]) == pytest.approx(logistic(0.8))


def test_boxes_are_clipped_and_capped():
    spec = yolo_spec()
    raw = torch.zeros(2, 3 * (5 + CLASSES), GRID, GRID)
    raw_for(raw, spec, 0, 2, 3, 3, (62.0, 62.0, 40.0, 40.0))
    detections = postprocess([raw], [spec], (INPUT, INPUT), detections_per_image=7)
    for found in detections:
        assert len(found["boxes"]) == 7
        assert found["boxes"].min() >= 0 and found["boxes"].max() <= INPUT
        assert (found["scores"][:-1] >= found["scores"][1:]).all()


# ----------------------------------------------------------------------------- a yolov3-tiny network


def tiny_cfg(classes: int = CLASSES) -> str:
    """yolov3-tiny's layout (the layers of tests/fixtures/darknet/yolov3-tiny.cfg) at a quarter of its widths, with
    anchors for a ~100 px input."""
    filters = 3 * (5 + classes)

    def conv(n: int, size: int = 3, bn: bool = True, act: str = "leaky") -> str:
        return (f"[convolutional]\n{'batch_normalize=1' + chr(10) if bn else ''}filters={n}\nsize={size}\nstride=1\n"
                f"pad=1\nactivation={act}\n\n")

    yolo = ("[yolo]\nmask = {}\nanchors = 6,8, 12,14, 18,24, 30,28, 44,52, 80,76\n"
            f"classes={classes}\nnum=6\nignore_thresh = .7\ntruth_thresh = 1\n\n")
    pool = "[maxpool]\nsize=2\nstride=2\n\n"
    return ("[net]\nwidth=96\nheight=96\nchannels=3\n\n"
            + conv(4) + pool + conv(8) + pool + conv(16) + pool + conv(32) + pool + conv(64) + pool + conv(64)
            + "[maxpool]\nsize=2\nstride=1\n\n" + conv(128) + conv(32, 1) + conv(64) + conv(filters, 1, False, "linear")
            + yolo.format("3,4,5") + "[route]\nlayers = -4\n\n" + conv(16, 1) + "[upsample]\nstride=2\n\n"
            + "[route]\nlayers = -1, 8\n\n" + conv(32) + conv(filters, 1, False, "linear") + yolo.format("0,1,2"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> DarknetNetwork:
    path = tmp_path_factory.mktemp("cfg") / "tiny.cfg"
    path.write_text(tiny_cfg(), encoding="utf-8")
    torch.manual_seed(0)
    return DarknetNetwork(read_darknet_cfg(path))


def random_batch(n: int, size: int, seed: int) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    images = [torch.rand(3, size, size, generator=g, dtype=torch.float64) for _ in range(n)]
    targets = []
    for k in range(n):
        count = 0 if k == 1 else 1 + k
        corner = torch.rand(count, 2, generator=g, dtype=torch.float64) * size * 0.6
        extent = 4 + torch.rand(count, 2, generator=g, dtype=torch.float64) * size * 0.4
        targets.append({"boxes": torch.cat([corner, corner + extent], dim=1),
                        "labels": torch.randint(0, CLASSES, (count,), generator=g)})
    return images, targets


@pytest.mark.parametrize("dialect", ["gradient", "alexeyab", "pjreddie"])
def test_layout_invariance(tiny, dialect):
    """The loss of a batch of 4 equals the mean of the losses of any split into equal micro-batches (4 x 1, 2 x 2),
    and so do the accumulated gradients (bigbatch averages the micro-batch losses): Darknet's update for every
    batch/subdivisions layout, in every dialect. BatchNorm in eval mode: batch statistics legitimately differ between
    layouts."""
    model = DarknetDetector(copy.deepcopy(tiny), dialect=dialect).double()
    model.train()
    model.network.apply(lambda m: m.eval() if isinstance(m, torch.nn.BatchNorm2d) else None)
    images, targets = random_batch(4, 96, seed=1)

    def step(splits: int) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        total = 0.0
        per = len(images) // splits
        for k in range(splits):
            losses = model(images[k * per:(k + 1) * per], targets[k * per:(k + 1) * per])
            assert set(losses) == {"loss_box", "loss_obj", "loss_cls"}
            loss = sum(losses.values()) / splits
            loss.backward()
            total += float(loss.detach())
        return total, [p.grad.clone() for p in model.parameters()]

    loss_4, grads_4 = step(1)
    for splits in (4, 2):
        loss, grads = step(splits)
        assert loss == pytest.approx(loss_4, abs=1e-5)
        for a, b in zip(grads, grads_4, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert loss_4 > 0 and any(g.abs().sum() > 0 for g in grads_4)


def test_multiscale_grids_and_anchors(tiny):
    """At 96 and 128 px the network returns grids of input / 32 and input / 16; the loss divides the anchors by
    the current input size: a truth of exactly the anchor's size in pixels has zero w, h gradient at w = h = 0."""
    spec_large, spec_small = (h.spec for h in tiny.yolo_heads)
    for size in (96, 128):
        with torch.no_grad():
            outputs = tiny(torch.rand(1, 3, size, size))
        assert [tuple(o.shape[-2:]) for o in outputs] == [(size // 32,) * 2, (size // 16,) * 2]
        assert [o.shape[1] for o in outputs] == [3 * (5 + CLASSES)] * 2
        grid = size // 16
        raw = torch.zeros(1, 3 * (5 + CLASSES), grid, grid, dtype=torch.float64, requires_grad=True)
        aw, ah = spec_small.anchors[1]  # mask 0,1,2: position 1
        truth = [[(size / 2 + 3, size / 2 + 3, aw, ah, 0)]]
        sum(gradient_loss([raw], [spec_small], targets_of(truth), (size, size)).values()).backward()
        cell = grid // 2
        g = raw.grad.view(1, 3, 5 + CLASSES, grid, grid)[0, 1, :, cell, cell]
        assert float(g[4]) == pytest.approx(-0.5)  # responsible
        assert g[2:4].abs().max() < 1e-12
        boxes, _, _ = decode_yolo_output(raw.detach(), spec_small, (size, size))
        position = (1 * grid + cell) * grid + cell
        torch.testing.assert_close(boxes[0, position], torch.tensor(
            [size / 2 + 8 - aw / 2, size / 2 + 8 - ah / 2, size / 2 + 8 + aw / 2, size / 2 + 8 + ah / 2],
            dtype=torch.float64))
    assert spec_large.mask == (3, 4, 5)


def test_eval_output_format(tiny):
    model = DarknetDetector(tiny, score_thresh=0.005, detections_per_image=50)
    model.eval()
    with torch.no_grad():
        detections = model([torch.rand(3, 128, 128), torch.rand(3, 128, 128)])
    assert len(detections) == 2
    for found in detections:
        assert set(found) == {"boxes", "scores", "labels"}
        assert found["boxes"].shape == (len(found["scores"]), 4) and 0 < len(found["scores"]) <= 50
        assert found["labels"].dtype == torch.int64
        assert found["labels"].min() >= 0 and found["labels"].max() < CLASSES
        assert found["boxes"].min() >= 0 and found["boxes"].max() <= 128
        assert (found["scores"] > 0.005).all() and (found["scores"][:-1] >= found["scores"][1:]).all()
    model.train()
    with pytest.raises(ValueError, match="targets"):
        model([torch.rand(3, 96, 96)])


def test_unimplemented_yolo_keys_are_refused(tmp_path):
    path = tmp_path / "focal.cfg"
    path.write_text(tiny_cfg().replace("truth_thresh = 1\n", "truth_thresh = 1\nfocal_loss=1\n", 1), encoding="utf-8")
    network = DarknetNetwork(read_darknet_cfg(path))  # builds: show and export use it
    with pytest.raises(UserError, match=r"focal\.cfg:\d+: \[yolo\] focal_loss.*gradient dialect"):
        check_supported(network, "gradient")  # what a run says before its first step
    with pytest.raises(UserError, match=r"focal\.cfg:\d+: \[yolo\] focal_loss: pjreddie's Darknet does not read"):
        check_supported(network, "pjreddie")
    check_supported(network, "alexeyab")  # AlexeyAB's focal loss is implemented


def test_layer_loss_normalises_by_the_given_count():
    spec = yolo_spec()
    raw = tiny_layer(spec)
    truths = darknet_truths(targets_of(BOXES), (INPUT, INPUT), CLASSES)
    one = yolo_layer_loss(raw, spec, truths, (INPUT, INPUT))
    three = yolo_layer_loss(raw, spec, truths, (INPUT, INPUT), normaliser=3)
    for key in one:
        assert float(three[key]) == pytest.approx(float(one[key]) / 3)


def test_reference_yolov3_tiny_cfg_trains():
    """Darknet's own yolov3-tiny.cfg (tests/fixtures/darknet) at 96 px with 3 classes: a finite loss and gradient."""
    from tests.helpers import DARKNET_DATA

    path = DARKNET_DATA / "yolov3-tiny.cfg"
    from bigbatch.darknet import load_network

    torch.manual_seed(0)
    model = DarknetDetector(load_network(path, 96, 96, classes=CLASSES))
    images, targets = random_batch(2, 96, seed=3)
    loss = sum(model([i.float() for i in images],
                     [{**t, "boxes": t["boxes"].float()} for t in targets]).values())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
