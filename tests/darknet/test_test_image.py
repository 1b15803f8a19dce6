"""Darknet's test-time preprocessing and NMS (bigbatch/darknet/test_image.py) against direct re-implementations of
Darknet's loops (src/image.c resize_image, src/box.c box_diou) and torchvision's NMS."""

import numpy as np
import pytest
import torch
from torchvision.ops import batched_nms

from bigbatch.darknet.test_image import (
    correct_boxes,
    darknet_nms,
    diou_matrix,
    geometry,
    letterbox_image,
    letterbox_size,
    preprocess,
    resize_image,
)

f32 = np.float32


def darknet_resize(im: np.ndarray, w: int, h: int) -> np.ndarray:
    """src/image.c resize_image, loop for loop, in float32 scalars (height 1: row 0, where Darknet's index is
    undefined)."""
    c_, ih, iw = im.shape
    part = np.zeros((c_, ih, w), np.float32)
    w_scale = f32(iw - 1) / f32(w - 1) if w > 1 else f32(0)
    h_scale = f32(ih - 1) / f32(h - 1) if h > 1 else f32(0)
    for k in range(c_):
        for r in range(ih):
            for c in range(w):
                if c == w - 1 or iw == 1:
                    val = im[k, r, iw - 1]
                else:
                    sx = f32(c) * w_scale
                    ix = int(sx)
                    dx = f32(sx - f32(ix))
                    val = f32(f32(1) - dx) * im[k, r, ix] + dx * im[k, r, ix + 1]
                part[k, r, c] = val
    out = np.zeros((c_, h, w), np.float32)
    for k in range(c_):
        for r in range(h):
            sy = f32(r) * h_scale
            iy = int(sy)
            dy = f32(sy - f32(iy))
            for c in range(w):
                out[k, r, c] = f32(f32(1) - dy) * part[k, iy, c]
            if r == h - 1 or ih == 1:
                continue
            for c in range(w):
                out[k, r, c] = f32(out[k, r, c] + dy * part[k, iy + 1, c])
    return out


@pytest.mark.parametrize(("in_w", "in_h", "w", "h"), [
    (7, 5, 13, 11), (13, 11, 7, 5), (9, 6, 9, 4), (1, 5, 4, 3), (6, 1, 3, 4), (5, 4, 1, 6), (1, 1, 3, 2),
    (23, 17, 16, 29), (3, 2, 4, 42),
])
def test_resize_image_is_darknets(in_w, in_h, w, h):
    image = torch.rand(3, in_h, in_w, generator=torch.Generator().manual_seed(in_w * 100 + in_h))
    expected = darknet_resize(image.numpy(), w, h)
    got = resize_image(image, w, h)
    assert got.shape == (3, h, w)
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-6)


def test_resize_image_last_row_quirk():
    # 41 * (float)(1 / 41) rounds below 1: Darknet's last row is (1 - dy) * row 0 with dy just under 1, nearly 0
    # (its last column is special-cased, its last row is not); scream.jpg (448 high) to 416 does the same
    out = resize_image(torch.ones(1, 2, 3), 3, 42)
    assert out[0, -1].abs().max() < 1e-6 and out[0, -2].min() > 0.99


def test_resize_image_same_size_is_a_copy():
    image = torch.rand(3, 4, 5)
    out = resize_image(image, 5, 4)
    assert torch.equal(out, image) and out.data_ptr() != image.data_ptr()


@pytest.mark.parametrize(("image_size", "net_size", "resized", "offset"), [
    ((375, 500), (416, 416), (312, 416), (52, 0)),   # wider: new_h = 375 * 416 // 500 = 312
    ((500, 333), (416, 416), (416, 277), (0, 69)),   # taller: new_w = 333 * 416 // 500 = 277, (416 - 277) // 2 = 69
    ((101, 99), (320, 416), (320, 313), (0, 51)),    # 416 / 99 > 320 / 101: new_w = 99 * 320 // 101 = 313
    ((3, 7), (9, 9), (3, 9), (3, 0)),
])
def test_letterbox_geometry(image_size, net_size, resized, offset):
    assert letterbox_size(image_size, net_size) == resized
    placed = geometry(image_size, net_size, True)
    assert (placed.resized, placed.offset) == (resized, offset)


def test_letterbox_image_fills_with_half_and_embeds_the_resized_image():
    image = torch.rand(3, 7, 5)
    canvas, placed = letterbox_image(image, 9, 6)
    (new_h, new_w), (dy, dx) = placed.resized, placed.offset
    assert (new_h, new_w, dy, dx) == (6, 4, 0, 2)  # 6 / 7 < 9 / 5: new_w = 5 * 6 // 7 = 4, (9 - 4) // 2 = 2
    assert torch.equal(canvas[:, dy:dy + new_h, dx:dx + new_w], resize_image(image, new_w, new_h))
    assert (canvas[:, :, :dx] == 0.5).all() and (canvas[:, :, dx + new_w:] == 0.5).all()


def test_preprocess_scales_bytes_and_stretches():
    image = torch.randint(0, 256, (3, 10, 14), dtype=torch.uint8)
    x, placed = preprocess(image, (8, 6), letter=False)
    assert x.shape == (3, 8, 6) and not placed.letter and placed.image_size == (10, 14)
    assert torch.equal(x, resize_image((image.double() / 255).float(), 6, 8))


@pytest.mark.parametrize("letter", [False, True])
def test_correct_boxes_maps_the_image_back(letter):
    image_size, net_size = (375, 500), (416, 416)
    new_h, new_w = geometry(image_size, net_size, letter).resized
    # the whole placed image (at Darknet's float offset) maps to the whole original image
    half = ((net_size[1] - new_w) / 2, (net_size[0] - new_h) / 2)
    inside = torch.tensor([[half[0], half[1], half[0] + new_w, half[1] + new_h]])
    back = correct_boxes(inside, image_size, net_size, letter)
    torch.testing.assert_close(back, torch.tensor([[0.0, 0.0, 500.0, 375.0]]))
    box = torch.tensor([[10.0, 60.0, 200.0, 300.0]])
    there = box / torch.tensor([500, 375] * 2) * torch.tensor([new_w, new_h] * 2) + torch.tensor(half * 2)
    torch.testing.assert_close(correct_boxes(there, image_size, net_size, letter), box)


def test_correct_boxes_uses_the_float_half_offset():
    # new_w = 277, so the input's offset is 69 pixels but Darknet corrects with 69.5
    out = correct_boxes(torch.tensor([[69.5, 0.0, 69.5 + 277, 416.0]]), (500, 333), (416, 416), True)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 333.0, 500.0]]))


def darknet_diou(a, b, beta):
    """src/box.c box_diou / box_diounms on XYXY boxes (Darknet's are centre, size)."""
    ax, ay, aw, ah = (a[0] + a[2]) / 2, (a[1] + a[3]) / 2, a[2] - a[0], a[3] - a[1]
    bx, by, bw, bh = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = 0 if iw < 0 or ih < 0 else iw * ih
    union = aw * ah + bw * bh - inter
    iou = 0 if inter == 0 or union == 0 else inter / union
    c = (max(a[2], b[2]) - min(a[0], b[0])) ** 2 + (max(a[3], b[3]) - min(a[1], b[1])) ** 2
    if c == 0:
        return iou
    return iou - (((ax - bx) ** 2 + (ay - by) ** 2) / c) ** beta


def test_diou_matrix_is_box_diou():
    boxes = torch.tensor([[0.0, 0, 10, 10], [2, 1, 12, 9], [20, 20, 25, 30], [3, 3, 4, 4]])
    got = diou_matrix(boxes, 0.6)
    for i in range(4):
        for j in range(4):
            assert got[i, j].item() == pytest.approx(darknet_diou(boxes[i].tolist(), boxes[j].tolist(), 0.6),
                                                     abs=1e-6)


# squares of side 10, 1.8 apart on both axes: IoU 0.51 (> 0.45), but the centres are apart: d / c = 0.023, so
# greedynms' DIoU is 0.51 - 0.023^0.6 = 0.40 (< 0.45) while diounms' with beta 1 is 0.51 - 0.023 = 0.48 (> 0.45)
PAIR = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.8, 1.8, 11.8, 11.8]])


def test_the_pair_is_where_iou_and_diou_disagree():
    a, b = PAIR.tolist()
    assert 67.24 / 132.76 == pytest.approx(darknet_diou(a, b, 1.0) + 3.24 / 139.24)  # the IoU
    assert darknet_diou(a, b, 0.6) < 0.45 < darknet_diou(a, b, 1.0) < 67.24 / 132.76


@pytest.mark.parametrize(("kind", "beta", "kept"), [
    ("default", 0.6, [0]), ("cornersnms", 0.6, [0]), ("greedynms", 1.0, [0, 1]), ("diounms", 1.0, [0]),
    ("diounms", 0.6, [0, 1]),
])
def test_darknet_nms_kinds(kind, beta, kept):
    scores = torch.tensor([0.9, 0.8])
    labels = torch.tensor([3, 3])
    assert darknet_nms(PAIR, scores, labels, 0.45, kind, beta).tolist() == kept
    # another class never suppresses
    assert sorted(darknet_nms(PAIR, scores, torch.tensor([3, 4]), 0.45, kind, beta).tolist()) == [0, 1]


def test_a_suppressed_box_does_not_suppress():
    # tall boxes (so the DIoU term is small): 1 overlaps 0 (IoU 0.54) and 2 (IoU 0.54), 0 and 2 little (0.25);
    # 0 suppresses 1, so 2 is kept
    boxes = torch.tensor([[0.0, 0, 10, 100], [3, 0, 13, 100], [6, 0, 16, 100]])
    scores = torch.tensor([0.95, 0.9, 0.5])
    labels = torch.zeros(3, dtype=torch.int64)
    for kind in ("default", "greedynms", "diounms"):
        assert darknet_nms(boxes, scores, labels, 0.45, kind, 0.6).tolist() == [0, 2]


def test_default_is_torchvisions_batched_nms():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(200, 2, generator=g) * 20
    boxes = torch.cat([xy, xy + 5 + torch.rand(200, 2, generator=g) * 20], dim=1)
    scores = torch.rand(200, generator=g)
    labels = torch.randint(0, 4, (200,), generator=g)
    expected = batched_nms(boxes, scores, labels, 0.45)
    assert len(expected) < 150  # some suppressed
    assert torch.equal(darknet_nms(boxes, scores, labels, 0.45, "default"), expected)
