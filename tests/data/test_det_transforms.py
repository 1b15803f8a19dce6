"""Detection transforms on hand-computed cases, detectron2's resize rule, and properties over random
samples: boxes stay inside the image with positive area and aligned with their labels."""

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from bigbatch.data.transforms.det_transforms import (
    PAD_VALUE,
    DarknetColor,
    DarknetJitter,
    RandomFixedCrop,
    RandomRelativeCrop,
    alexeyab_window,
    boxes_to_original,
    clamp_and_sanitize,
    distort_colors,
    distort_hsv,
    eval_transform,
    letterbox_geometry,
    shorter_side_size,
    train_transform,
)


def sample(height, width, boxes, labels=None, value=None, clamping_mode="soft", **extra):
    if value is None:
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    else:
        image = torch.full((3, height, width), value, dtype=torch.uint8)
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    labels = torch.arange(len(boxes)) if labels is None else torch.tensor(labels)
    boxes = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width), clamping_mode=clamping_mode)
    target = {"boxes": boxes, "labels": labels, "image_id": 7, **extra}
    return tv_tensors.Image(image), target


def plain(boxes):
    return boxes.as_subclass(torch.Tensor)


def to_uint8(image):
    """A float image in [0, 1] back to its uint8 values."""
    return (image * 255).round().to(torch.uint8)


def geometry_only(resize, size, **kw):
    return train_transform(resize, size, flip=0.0, crop=False, color_jitter=0.0, **kw)


# ---------------------------------------------------------------------------------------- resize


def test_shorter_side_resize_640x480_to_800():
    # scale = 800 / 480; long side 640 * 5 / 3 = 1066.67 -> int(1067.17) = 1067 (< 1333, no cap).
    # (v2.Resize(800, max_size=1333) would truncate to 1066.)
    image, target = sample(480, 640, [[100, 50, 300, 250]])
    out, t = geometry_only("shorter_side", 800, max_size=1333)(image, target)
    assert out.shape == (3, 800, 1067) and out.dtype == torch.float32
    assert t["boxes"].canvas_size == (800, 1067)
    sx, sy = 1067 / 640, 800 / 480  # each axis by its own exact ratio, as the pixels
    expected = torch.tensor([[100 * sx, 50 * sy, 300 * sx, 250 * sy]])
    torch.testing.assert_close(plain(t["boxes"]), expected)
    torch.testing.assert_close(expected, torch.tensor([[166.71875, 83.33333, 500.15625, 416.66667]]))
    assert t["labels"].tolist() == [0] and t["image_id"] == 7


def test_shorter_side_resize_wide_image_capped_by_max_size():
    # 500 x 2000: 800 / 500 = 1.6 would make the long side 3200 > 1333, so scale = 1333 / 2000 = 0.6665:
    # h = 333.25 -> 333, w = 1333
    image, target = sample(500, 2000, [[1000, 100, 2000, 500]], value=3)
    out, t = geometry_only("shorter_side", 800, max_size=1333)(image, target)
    assert out.shape == (3, 333, 1333)
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[666.5, 66.6, 1333.0, 333.0]]))


def test_max_size_fixed_or_scaling_with_the_multiscale_size():
    image, target = sample(500, 2000, [[0, 0, 2000, 500]], value=3)
    # fixed cap (detectron2): at shorter side 640 the cap is still 1333 -> 0.6665 -> (333.25, 1333)
    out, _ = geometry_only("shorter_side", 800, max_size=1333)(image, target, 640)
    assert out.shape == (3, 333, 1333)
    # scaling cap: 640 * 1333 / 800 = 1066.4 -> 1066; 500 * 1066 / 2000 = 266.5 -> 267
    out, t = geometry_only("shorter_side", 800, max_size_ratio=1333 / 800)(image, target, 640)
    assert out.shape == (3, 267, 1066)
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[0.0, 0.0, 1066.0, 267.0]]))


def detectron2_output_shape(oldh, oldw, short_edge_length, max_size):
    """detectron2 ResizeShortestEdge.get_output_shape, transcribed (float arithmetic)."""
    h, w = oldh, oldw
    size = short_edge_length * 1.0
    scale = size / min(h, w)
    if h < w:
        newh, neww = size, scale * w
    else:
        newh, neww = scale * h, size
    if max(newh, neww) > max_size:
        scale = max_size * 1.0 / max(newh, neww)
        newh = newh * scale
        neww = neww * scale
    return int(newh + 0.5), int(neww + 0.5)


def test_shorter_side_size_equals_detectron2():
    gen = torch.Generator().manual_seed(1)
    checked = 0
    for _ in range(3000):
        h, w = (int(v) for v in torch.randint(16, 3000, (2,), generator=gen))
        short = int(torch.randint(200, 1000, (), generator=gen))
        ours, theirs = shorter_side_size(h, w, short, 1333), detectron2_output_shape(h, w, short, 1333)
        if ours != theirs:  # only an exact .5 tie may round differently in floating point
            scale = min(Fraction(short, min(h, w)), Fraction(1333, max(h, w)))
            ties = [(side * scale).denominator == 2 for side in (h, w)]
            assert any(ties), (h, w, short, ours, theirs)
        else:
            checked += 1
    assert checked > 2900


def test_letterbox_landscape_scale_and_centred_pad():
    # 640 x 480 -> 416: scale 0.65, (312, 416), top = (416 - 312) // 2 = 52, bottom 52
    assert letterbox_geometry(480, 640, 416) == (312, 416, 52, 0)
    assert letterbox_geometry(640, 480, 416) == (416, 312, 0, 52)
    image, target = sample(480, 640, [[100, 50, 300, 250]], value=7)
    out, t = eval_transform("letterbox", 416)(image, target)
    assert out.shape == (3, 416, 416)
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[65.0, 84.5, 195.0, 214.5]]))
    pixels = to_uint8(out)
    assert torch.all(pixels[:, :52] == PAD_VALUE) and torch.all(pixels[:, 364:] == PAD_VALUE)
    assert torch.all(pixels[:, 52:364] == 7)
    assert t["image_region"] == (52, 0, 312, 416) and t["orig_size"] == (480, 640)


def test_letterbox_odd_padding_goes_to_the_bottom():
    # 300 x 99 -> 320: h = 99 * 320 // 300 = 105 (105.6 truncated, as Darknet), pad 215 = 107 top + 108 bottom
    image, target = sample(99, 300, [[0, 0, 300, 99], [150, 50, 225, 75]], value=9)
    out, t = geometry_only("letterbox", 320)(image, target)
    assert out.shape == (3, 320, 320)
    # y' = y * 105 / 99 + 107; x' = x * 320 / 300
    expected = torch.tensor([[0.0, 107.0, 320.0, 212.0], [160.0, 50 * 105 / 99 + 107, 240.0, 75 * 105 / 99 + 107]])
    torch.testing.assert_close(plain(t["boxes"]), expected)
    pixels = to_uint8(out)
    assert torch.all(pixels[:, :107] == PAD_VALUE) and torch.all(pixels[:, 212:] == PAD_VALUE)
    assert torch.all(pixels[:, 107:212] == 9)


def darknet_letterbox(im_h: int, im_w: int, w: int, h: int) -> tuple[int, int, int, int]:
    """Darknet's letterbox_image (src/image.c) line for line: (new_h, new_w, dy, dx); C's int division of
    non-negative ints is Python's //, its float division float32."""
    new_w, new_h = im_w, im_h
    if np.float32(w) / np.float32(im_w) < np.float32(h) / np.float32(im_h):
        new_w = w
        new_h = (im_h * w) // im_w
    else:
        new_h = h
        new_w = (im_w * h) // im_h
    return new_h, new_w, (h - new_h) // 2, (w - new_w) // 2


def test_letterbox_geometry_is_darknets_truncating_letterbox_image():
    """333 x 501 at 416: Darknet's new_h = 333 * 416 / 501 = 276 (276.5, truncated), top (416 - 276) / 2 = 70."""
    assert letterbox_geometry(333, 501, 416) == (276, 416, 70, 0)
    assert letterbox_geometry(501, 333, 416) == (416, 276, 0, 70)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3000):
        h, w = (int(v) for v in torch.randint(1, 2000, (2,), generator=gen))
        size = 32 * int(torch.randint(5, 30, (), generator=gen))
        new_h, new_w, top, left = darknet_letterbox(h, w, size, size)
        if min(new_h, new_w) == 0:  # Darknet's resize to nothing: bigbatch keeps one pixel
            new_h, new_w = max(1, new_h), max(1, new_w)
            top, left = (size - new_h) // 2, (size - new_w) // 2
        assert letterbox_geometry(h, w, size) == (new_h, new_w, top, left), (h, w, size)
    image, target = sample(333, 501, [[0, 0, 501, 333]], value=5)
    out, t = eval_transform("letterbox", 416)(image, target)
    assert t["image_region"] == (70, 0, 276, 416)
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[0.0, 70.0, 416.0, 346.0]]))
    torch.testing.assert_close(boxes_to_original(plain(t["boxes"]), t), torch.tensor([[0.0, 0.0, 501.0, 333.0]]))


def test_letterbox_size_follows_the_step_size():
    image, target = sample(90, 130, [[10, 10, 60, 80]])
    transform = train_transform("letterbox", 416, flip=0.5, crop=0.6, color_jitter=0.4)
    for size in (320, 352, 608):
        out, t = transform(image, target, size)
        assert out.shape == (3, size, size) and t["boxes"].canvas_size == (size, size)


# ------------------------------------------------------------------------------------ crop, flip


class FixedCrop(RandomRelativeCrop):
    """The crop with its windows given, in order (the random draw replaced)."""

    def __init__(self, *windows):
        super().__init__(p=1.0, tries=len(windows))
        self.windows = list(windows)

    def sample_window(self, height, width):
        return self.windows.pop(0)


@pytest.mark.parametrize("clamping_mode", ["soft", None])  # None: v2's kernels do not clip, the pipeline must
def test_crop_drops_outside_boxes_with_labels_clips_and_shifts(clamping_mode):
    image, target = sample(100, 200, [
        [10, 10, 50, 50],      # crosses the top-left corner -> [0, 0, 10, 30]
        [60, 30, 100, 70],     # inside -> shifted by (40, 20)
        [150, 10, 190, 90],    # entirely right of the crop (x >= 140): dropped
        [130, 70, 180, 95],    # crosses the bottom-right corner -> [90, 50, 100, 60]
        [30, 10, 40.5, 50],    # clipped to 0.5 px wide: dropped (under 1 px)
    ], labels=[5, 6, 7, 8, 9], iscrowd=torch.tensor([0, 1, 0, 1, 0]), clamping_mode=clamping_mode)
    crop = v2.Compose([FixedCrop((20, 40, 60, 100)), clamp_and_sanitize()])
    out, t = crop(image, target)
    assert torch.equal(out, image[:, 20:80, 40:140])
    assert t["boxes"].canvas_size == (60, 100)
    expected = torch.tensor([[0.0, 0.0, 10.0, 30.0], [20.0, 10.0, 60.0, 50.0], [90.0, 50.0, 100.0, 60.0]])
    torch.testing.assert_close(plain(t["boxes"]), expected)
    assert t["labels"].tolist() == [5, 6, 8] and t["iscrowd"].tolist() == [0, 1, 1]
    assert t["image_id"] == 7


def test_crop_redraws_until_a_box_survives_else_leaves_the_image():
    image, target = sample(100, 200, [[150, 60, 190, 90]])
    out, t = FixedCrop((0, 0, 50, 100), (40, 100, 60, 100))(image, target)  # the first misses the box
    assert torch.equal(out, image[:, 40:100, 100:200])
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[50.0, 20.0, 90.0, 50.0]]))
    out, t = FixedCrop((0, 0, 50, 100), (0, 0, 60, 150))(image, target)  # no window keeps it
    assert torch.equal(out, image) and torch.equal(plain(t["boxes"]), plain(target["boxes"]))
    empty_image, empty = sample(100, 200, [])
    out, _ = FixedCrop((10, 20, 30, 40))(empty_image, empty)  # no boxes: any window
    assert out.shape == (3, 30, 40)


def test_crop_windows_cover_the_relative_range_inside_the_image():
    torch.manual_seed(0)
    crop = RandomRelativeCrop(min_fraction=0.5, p=1.0)
    fractions = []
    for _ in range(500):
        top, left, h, w = crop.sample_window(100, 200)
        assert 50 <= h <= 100 and 100 <= w <= 200
        assert 0 <= top <= 100 - h and 0 <= left <= 200 - w
        fractions += [h / 100, w / 200]
    assert min(fractions) < 0.53 and max(fractions) > 0.97
    never = RandomRelativeCrop(0.5, p=0.0)
    image, target = sample(100, 200, [[10, 10, 50, 50]])
    assert all(torch.equal(never(image, target)[0], image) for _ in range(20))


def test_horizontal_flip():
    # W = 64: x1' = W - x2, x2' = W - x1; shorter side 48 = the image's, so no resize
    image, target = sample(48, 64, [[10, 5, 30, 25], [0, 0, 64, 48]])
    out, t = train_transform("shorter_side", 48, flip=1.0)(image, target)
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[34.0, 5.0, 54.0, 25.0], [0.0, 0.0, 64.0, 48.0]]))
    torch.testing.assert_close(out, image.flip(-1).float() / 255)


def test_colour_jitter_changes_pixels_not_boxes_and_keeps_the_letterbox_grey():
    image, target = sample(60, 120, [[10, 10, 50, 50]])
    torch.manual_seed(3)
    plain_out, plain_t = geometry_only("letterbox", 128)(image, target)
    jittered, jit_t = train_transform("letterbox", 128, flip=0.0, color_jitter=0.4)(image, target)
    assert torch.equal(plain(jit_t["boxes"]), plain(plain_t["boxes"]))
    top = (128 - 64) // 2  # 60 x 120 -> 64 x 128
    assert not torch.allclose(jittered[:, top:top + 64], plain_out[:, top:top + 64])
    pixels = to_uint8(jittered)
    assert torch.all(pixels[:, :top] == PAD_VALUE) and torch.all(pixels[:, top + 64:] == PAD_VALUE)


# ----------------------------------------------------------------------- COCO, eval round trip


@pytest.mark.parametrize("resize, size, max_size", [("shorter_side", 800, 1333), ("shorter_side", 600, 1000),
                                                    ("letterbox", 416, None), ("letterbox", 608, None),
                                                    ("stretch", 416, None), ("stretch", 96, None)])
def test_boxes_to_original_inverts_eval_transform(resize, size, max_size):
    gen = torch.Generator().manual_seed(size)
    transform = eval_transform(resize, size, max_size)
    for h, w in [(480, 640), (640, 480), (333, 1500), (97, 101)]:
        xy = torch.rand(20, 2, generator=gen) * torch.tensor([w, h]) * 0.8
        wh = torch.rand(20, 2, generator=gen) * torch.tensor([w, h]) * 0.2 + 0.5
        boxes = torch.cat([xy, xy + wh], dim=1)
        image, target = sample(h, w, boxes.tolist(), value=1)
        _, t = transform(image, target)
        torch.testing.assert_close(boxes_to_original(plain(t["boxes"]), t), boxes, atol=1e-3, rtol=0)


def test_stretch_scales_each_axis_to_the_square_as_darknets_resize_image():
    """``resize: stretch`` (Darknet's default ``letter_box=0``, SSD): a 480 x 640 image becomes 416 x 416, x scaled
    by 416 / 640 and y by 416 / 480, no padding; the whole input is the image (``image_region``)."""
    image, target = sample(480, 640, [[64.0, 48.0, 320.0, 240.0]])
    out, t = eval_transform("stretch", 416)(image, target)
    assert tuple(out.shape[-2:]) == (416, 416) and t["image_region"] == (0, 0, 416, 416)
    torch.testing.assert_close(plain(t["boxes"]), torch.tensor([[41.6, 41.6, 208.0, 208.0]]))
    trained, tt = train_transform("stretch", 416, flip=0.0)(image, target, size=320)  # the step's size
    assert tuple(trained.shape[-2:]) == (320, 320)
    torch.testing.assert_close(plain(tt["boxes"]), torch.tensor([[32.0, 32.0, 160.0, 160.0]]))


def test_boxes_to_original_clips_to_the_original_image():
    # letterbox 640 x 480 -> 416: region (top 52, left 0, 312 x 416); a box reaching into the pad and
    # past the left edge: [-10, 0, 100, 60] -> region [0, 0, 100, 8] -> x * 640 / 416, y * 480 / 312
    image, target = sample(480, 640, [[0, 0, 1, 1]], orig_size=torch.tensor([480, 640]))
    out, t = eval_transform("letterbox", 416)(image, target)
    assert t["orig_size"] is target["orig_size"] and t["image_id"] == 7  # passed through untouched
    mapped = boxes_to_original(torch.tensor([[-10.0, 0.0, 100.0, 60.0], [0.0, 400.0, 500.0, 416.0]]), t)
    expected = torch.tensor([[0.0, 0.0, 100 * 640 / 416, 8 * 480 / 312], [0.0, 480.0, 640.0, 480.0]])
    torch.testing.assert_close(mapped, expected)
    assert boxes_to_original(torch.zeros(0, 4), t).shape == (0, 4)


def test_transforms_leave_the_input_target_alone():
    image, target = sample(50, 70, [[1, 2, 30, 40], [40, 10, 69, 49]], orig_size=(50, 70))
    before = plain(target["boxes"]).clone()
    _, t = train_transform("shorter_side", 64, max_size=100, crop=True, crop_prob=1.0, color_jitter=0.4)(image, target)
    assert torch.equal(plain(target["boxes"]), before) and target["labels"].tolist() == [0, 1]
    assert t["orig_size"] == (50, 70) and t["image_id"] == 7 and "image_region" not in t


# --------------------------------------------------------------------------------- properties


def painted_sample(gen):
    """Boxes on a 3 x 3 grid of cells (disjoint, integer, >= 6 px), box i painted red = 20 + 25 i."""
    h, w = (int(v) for v in torch.randint(48, 161, (2,), generator=gen))
    image = torch.zeros(3, h, w, dtype=torch.uint8)
    boxes, labels = [], []
    for cell in range(9):
        if torch.rand((), generator=gen) < 0.3:
            continue
        cy, cx = divmod(cell, 3)
        y0, x0, ch, cw = cy * h // 3, cx * w // 3, h // 3, w // 3
        bh, bw = (int(torch.randint(6, side + 1, (), generator=gen)) for side in (ch, cw))
        top = y0 + int(torch.randint(0, ch - bh + 1, (), generator=gen))
        left = x0 + int(torch.randint(0, cw - bw + 1, (), generator=gen))
        image[0, top:top + bh, left:left + bw] = 20 + 25 * cell
        image[1, top:top + bh, left:left + bw] = 200
        boxes.append([left, top, left + bw, top + bh])
        labels.append(cell)
    _, target = sample(h, w, boxes, labels=labels)
    return tv_tensors.Image(image), target


def test_property_boxes_inside_positive_and_aligned_with_labels():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    colour_checks = 0
    for trial in range(150):
        image, target = painted_sample(gen)
        resize = "letterbox" if trial % 2 else "shorter_side"
        size = int(torch.randint(32, 97, (), generator=gen))
        crop = [False, True, 0.3, 0.8][trial % 4]
        cap = {"max_size_ratio": 1.6} if trial % 3 == 0 and resize == "shorter_side" else {}
        transform = train_transform(resize, 64, flip=0.5, crop=crop, crop_prob=0.7, **cap)
        out, t = transform(image, target, size)
        boxes, labels = plain(t["boxes"]), t["labels"]
        _, h, w = out.shape
        assert t["boxes"].canvas_size == (h, w)
        assert len(boxes) == len(labels)
        assert torch.all(boxes >= 0) and torch.all(boxes[:, [0, 2]] <= w) and torch.all(boxes[:, [1, 3]] <= h)
        assert torch.all(boxes[:, 2:] - boxes[:, :2] >= 1)
        assert set(labels.tolist()) <= set(target["labels"].tolist())
        for (x1, y1, x2, y2), label in zip(boxes.tolist(), labels.tolist(), strict=True):
            if min(x2 - x1, y2 - y1) >= 6:  # the centre is > 2 px inside: no blending with the background
                red = out[0, int((y1 + y2) / 2), int((x1 + x2) / 2)] * 255
                assert abs(float(red) - (20 + 25 * label)) < 6, (trial, label, float(red))
                colour_checks += 1
    assert colour_checks > 300


def test_property_random_overlapping_boxes_with_jitter():
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(1)
    for trial in range(100):
        h, w = (int(v) for v in torch.randint(20, 120, (2,), generator=gen))
        n = int(torch.randint(0, 12, (), generator=gen))
        xy = torch.rand(n, 2, generator=gen) * torch.tensor([w, h])
        wh = torch.rand(n, 2, generator=gen) * torch.tensor([w, h])
        boxes = torch.cat([xy, torch.minimum(xy + wh + 0.1, torch.tensor([w, h]))], dim=1)
        image, target = sample(h, w, boxes.tolist(), iscrowd=torch.arange(n) % 2,
                               clamping_mode=[None, "soft", "hard"][trial % 3])
        resize = "letterbox" if trial % 2 else "shorter_side"
        transform = train_transform(resize, 64, max_size=96, flip=0.5, crop=0.4, crop_prob=0.8, color_jitter=0.4)
        out, t = transform(image, target, int(torch.randint(16, 129, (), generator=gen)))
        out_boxes, labels = plain(t["boxes"]), t["labels"]
        assert out.dtype == torch.float32 and 0 <= out.min() and out.max() <= 1
        assert len(out_boxes) == len(labels) == len(t["iscrowd"])
        assert torch.equal(t["iscrowd"], labels % 2)  # the per-box entries stay aligned
        assert torch.all(labels[1:] > labels[:-1])  # kept in order, none duplicated
        assert torch.all(out_boxes >= 0) and torch.all(out_boxes[:, [0, 2]] <= out.shape[2])
        assert torch.all(out_boxes[:, [1, 3]] <= out.shape[1])
        assert torch.all(out_boxes[:, 2:] - out_boxes[:, :2] >= 1)


def test_fixed_crop_is_at_most_size_by_size_and_keeps_a_box():
    """MegDet's 800 x 800 after the shorter-side 800 resize, at a small scale: a 64 x 160 image gives a 64 x 64
    window at a uniform offset; every sampled window keeps a box; the pixels are the image's own."""
    image, target = sample(64, 160, [[10, 10, 30, 30], [120, 20, 150, 50]])
    crop = RandomFixedCrop(64)
    lefts = set()
    for seed in range(60):
        torch.manual_seed(seed)
        top, left, h, w = crop.make_params([image, target["boxes"]])["window"]
        assert (top, h, w) == (0, 64, 64) and 0 <= left <= 96
        lefts.add(left)
        torch.manual_seed(seed)  # the same draw again, inside the transform
        out, out_target = clamp_and_sanitize()(*crop(image, target))
        assert out.shape[-2:] == (64, 64) and len(out_target["boxes"]) >= 1
        assert torch.equal(out, image[:, :, left:left + 64])
    assert len(lefts) > 20  # offsets spread over the image, not one fixed window


def test_fixed_crop_keeps_small_sides_whole_and_falls_back_to_a_box():
    image, target = sample(40, 50, [[1, 1, 5, 5]])
    out, _ = RandomFixedCrop(64)(image, target)
    assert out.shape[-2:] == (40, 50)  # both sides below the crop: the image as it is
    image, target = sample(64, 400, [[390, 30, 398, 40]])  # one box at the far right edge
    crop = RandomFixedCrop(64, tries=0)  # no random window: straight to the fallback
    torch.manual_seed(0)
    top, left, h, w = crop.make_params([image, target["boxes"]])["window"]
    assert (top, left, h, w) == (0, 336, 64, 64)  # centred on the box, clamped to the image
    out, out_target = clamp_and_sanitize()(*crop(image, target))
    assert plain(out_target["boxes"]).tolist() == [[54.0, 30.0, 62.0, 40.0]]


def test_train_transform_crops_after_the_resize():
    image, target = sample(100, 150, [[10, 10, 90, 90], [100, 20, 140, 80]])
    transform = train_transform("shorter_side", 64, max_size_ratio=1333 / 800, crop_size=64, flip=0.0)
    for seed in range(5):
        torch.manual_seed(seed)
        out, out_target = transform(image, target)
        assert out.shape[-2:] == (64, 64) and out.dtype == torch.float32  # 64 x 96 cropped to 64 x 64
        boxes = plain(out_target["boxes"])
        assert len(boxes) >= 1 and (boxes >= 0).all() and (boxes <= 64).all()


def test_darknet_jitter_moves_each_side_and_pads_black():
    """pjreddie's load_data_detection: each side moves by an integer in (-jitter * side, jitter * side); the window is
    stretched to the input; outside the image is black; boxes follow."""
    image, target = sample(100, 200, [[20, 20, 180, 80]], value=200)
    jitter = DarknetJitter(0.3)
    for seed in range(30):
        torch.manual_seed(seed)
        top, left, h, w = jitter.make_params([image, target["boxes"]])["window"]
        assert -30 < top < 30 and -60 < left < 60
        assert 100 - 60 < h < 100 + 60 and 200 - 120 < w < 200 + 120
        torch.manual_seed(seed)
        out, out_target = clamp_and_sanitize()(*jitter(image, target))
        assert out.shape[-2:] == (h, w)
        if top < 0:  # rows above the image are black, the image's first row is not
            assert (out[:, : -top] == 0).all() and (out[:, -top, max(0, -left)] == 200).all()
        box = plain(out_target["boxes"])[0].tolist()
        expected = [max(0, 20 - left), max(0, 20 - top), min(w, 180 - left), min(h, 80 - top)]
        assert box == pytest.approx(expected)
    transform = train_transform("letterbox", 64, flip=0.0, jitter=0.3)
    for seed in range(5):
        torch.manual_seed(seed)
        out, out_target = transform(image, target)
        assert out.shape[-2:] == (64, 64)  # stretched, not letterboxed (Darknet's letter_box=0)
        assert (plain(out_target["boxes"]) <= 64).all()


def f32(x: float) -> float:
    """``x`` rounded to float32 (one C float operation: the double result, rounded, is the float one)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def darknet_window(oh: int, ow: int, jitter: float, resize: float, draws) -> tuple[int, int, int, int]:
    """AlexeyAB's load_data_detection (src/data.c), letter_box=0 and no mosaic, written out in C's order with each
    float operation rounded to float32 and each int conversion truncated: (top, left, height, width)."""
    r1, r2, r3, r4, rr1, rr2 = (f32(d) for d in draws)
    jitter, resize = f32(jitter), f32(resize)
    dw, dh = math.trunc(f32(ow * jitter)), math.trunc(f32(oh * jitter))
    resize_down = resize if resize <= 1.0 else f32(1 / resize)
    min_rdw = math.trunc(f32(f32(ow * f32(1 - f32(1 / resize_down))) / 2))
    min_rdh = math.trunc(f32(f32(oh * f32(1 - f32(1 / resize_down))) / 2))
    resize_up = resize if resize >= 1.0 else f32(1 / resize)
    max_rdw = math.trunc(f32(f32(ow * f32(1 - f32(1 / resize_up))) / 2))
    max_rdh = math.trunc(f32(f32(oh * f32(1 - f32(1 / resize_up))) / 2))

    def rand_precalc_random(low: float, high: float, part: float) -> float:
        low, high = min(low, high), max(low, high)
        return f32(f32(part * f32(high - low)) + low)

    pleft, pright = (math.trunc(rand_precalc_random(-dw, dw, r)) for r in (r1, r2))
    ptop, pbot = (math.trunc(rand_precalc_random(-dh, dh, r)) for r in (r3, r4))
    if resize < 1:
        max_rdw = max_rdh = 0
    pleft = math.trunc(f32(pleft + rand_precalc_random(min_rdw, max_rdw, rr1)))
    pright = math.trunc(f32(pright + rand_precalc_random(min_rdw, max_rdw, rr2)))
    ptop = math.trunc(f32(ptop + rand_precalc_random(min_rdh, max_rdh, rr1)))
    pbot = math.trunc(f32(pbot + rand_precalc_random(min_rdh, max_rdh, rr2)))
    swidth, sheight = ow - pleft - pright, oh - ptop - pbot
    if swidth <= 0 or sheight <= 0 or ow - pleft <= 0 or oh - ptop <= 0:
        swidth, sheight, pleft, ptop = ow, oh, 0, 0
    return ptop, pleft, sheight, swidth


def test_alexeyab_resize_window_extremes_by_hand():
    """500 x 375 (w x h), jitter .3, resize 1.5: dw = 150, dh = 112; the zoom moves a side by
    int(500 * (1 - 1.5) / 2) = -125 .. int(500 * (1 - 1 / 1.5) / 2) = 83 (-93 .. 62 vertically)."""
    assert alexeyab_window(375, 500, 0.3, 1.5, [0.0] * 6) == (-112 - 93, -150 - 125, 375 + 2 * 205, 500 + 2 * 275)
    assert alexeyab_window(375, 500, 0.3, 1.5, [1.0] * 6) == (112 + 62, 150 + 83, 375 - 2 * 174, 500 - 2 * 233)
    # resize below 1 zooms out only: -int(500 * (1 / 0.75 - 1) / 2) = -83 .. 0
    assert alexeyab_window(375, 500, 0.0, 0.75, [0.5, 0.5, 0.5, 0.5, 0.0, 1.0]) == (-62, -83, 375 + 62, 500 + 83)
    # int pleft += float: the sum truncated, not each part: left = int(6 + -2.7001) = 3, not 6 + int(-2.7001) = 4
    assert alexeyab_window(100, 100, 0.3, 1.5, [0.6, 0.5, 0.5, 0.5, 0.5439, 0.5]) == (-2, 3, 106, 101)
    # a window of no width is the whole image ("invalid resize")
    assert alexeyab_window(100, 100, 0.45, 3.0, [1.0] * 6) == (0, 0, 100, 100)


@pytest.mark.parametrize(("jitter", "resize"), [(0.3, 1.5), (0.2, 1.5), (0.0, 1.5), (0.3, 0.75), (0.3, 1.0),
                                                (0.45, 2.5), (0.1, 1.1)])
def test_alexeyab_window_is_data_c_over_random_draws(jitter, resize):
    """Against the transcription above (float32 by rounding each double result), over random sizes and draws; the
    window's sides stay within the jitter plus the zoom, left and top moved by one zoom draw, right and bottom by
    the other."""
    generator = torch.Generator().manual_seed(int(resize * 100 + jitter * 10))
    for _ in range(2000):
        oh, ow = (int(v) for v in torch.randint(1, 1500, (2,), generator=generator))
        draws = torch.rand(6, generator=generator, dtype=torch.float64).tolist()
        window = alexeyab_window(oh, ow, jitter, resize, draws)
        assert window == darknet_window(oh, ow, jitter, resize, draws), (oh, ow, draws)
        top, left, height, width = window
        if (height, width) != (oh, ow) or (top, left) != (0, 0):
            zoom_out = ow * (1 - max(resize, 1 / resize)) / 2  # <= 0
            zoom_in = ow * (1 - 1 / resize) / 2 if resize > 1 else 0.0
            assert zoom_out - jitter * ow - 1 < left < zoom_in + jitter * ow + 1
            right = ow - left - width
            assert zoom_out - jitter * ow - 1 < right < zoom_in + jitter * ow + 1


def test_darknet_jitter_with_resize_zooms_and_stretches_to_the_input():
    """train_transform's jitter_resize: AlexeyAB's window (zoomed in and out), stretched to size x size; without it,
    the jitter's draws are those it always made."""
    image, target = sample(100, 200, [[20, 20, 180, 80]], value=200)
    zoom = DarknetJitter(0.0, 1.5)
    windows = set()
    for seed in range(60):
        torch.manual_seed(seed)
        top, left, h, w = zoom.make_params([image, target["boxes"]])["window"]
        assert -50 <= left <= 33 and -25 <= top <= 16  # int(200 * -0.5 / 2) .. int(200 / 6), likewise 100
        windows.add((h > 100, w > 200))
        assert abs(h / 100 - w / 200) < 0.03  # one draw moves left and top, another right and bottom: a zoom
    assert windows == {(True, True), (False, False)}  # in and out
    transform = train_transform("letterbox", 64, flip=0.0, jitter=0.3, jitter_resize=1.5)
    for seed in range(5):
        torch.manual_seed(seed)
        out, out_target = transform(image, target)
        assert out.shape[-2:] == (64, 64) and (plain(out_target["boxes"]) <= 64).all()
    torch.manual_seed(3)
    plain_window = DarknetJitter(0.3).make_params([image, target["boxes"]])["window"]
    torch.manual_seed(3)
    assert DarknetJitter(0.3, 1.0).make_params([image, target["boxes"]])["window"] == plain_window


def test_darknet_color_scales_value_and_saturation_and_keeps_grey_grey():
    grey = tv_tensors.Image(torch.full((3, 4, 4), 0.4))
    colour = DarknetColor(hue=0.1, saturation=1.5, exposure=1.5)
    seen = set()
    for seed in range(40):
        torch.manual_seed(seed)
        params = colour.make_params([grey])
        assert -0.1 <= params["hue"] <= 0.1
        assert 1 / 1.5 <= params["saturation"] <= 1.5 and 1 / 1.5 <= params["exposure"] <= 1.5
        seen.add(params["exposure"] > 1)
        out = colour.transform(grey, params)
        assert torch.allclose(out, torch.full_like(grey, min(0.4 * params["exposure"], 1.0)), atol=1e-6)
    assert seen == {True, False}  # a scale and its inverse, both drawn
    red = tv_tensors.Image(torch.tensor([0.8, 0.4, 0.4]).view(3, 1, 1).expand(3, 2, 2).clone())
    out = colour.transform(red, {"hue": 0.0, "saturation": 0.5, "exposure": 1.0})
    assert torch.allclose(out[:, 0, 0], torch.tensor([0.8, 0.6, 0.6]), atol=1e-6)  # HSV saturation 0.5 -> 0.25


@pytest.mark.parametrize("seed", range(6))
def test_distort_hsv_is_the_kernels_saturation_then_hue_then_exposure(seed: int):
    """The one-pass HSV distortion equals TF's exact kernels applied in Darknet's order (saturation, hue, value),
    to float rounding, on random pixels, on pixels with tied channels (where the hue's sector is decided by
    the order of comparison), on grey, black and saturated pixels."""
    from bigbatch.data.transforms.tf1_ops import adjust_hue, adjust_saturation

    generator = torch.Generator().manual_seed(seed)
    image = torch.rand(3, 23, 29, generator=generator)
    if seed % 2:
        image = (image * 4).round() / 4  # many ties between channels
    image[:, 0, :4] = torch.tensor([[0.4, 0.0, 1.0, 1.0], [0.4, 0.0, 1.0, 0.0], [0.4, 0.0, 0.0, 0.0]])
    hue = float(torch.empty(()).uniform_(-0.5, 0.5, generator=generator))
    saturation = float(torch.empty(()).uniform_(0.2, 3.0, generator=generator))
    exposure = float(torch.empty(()).uniform_(0.5, 1.7, generator=generator))
    expected = (adjust_hue(adjust_saturation(image, saturation), hue) * exposure).clamp(0, 1)
    torch.testing.assert_close(distort_hsv(image, hue, saturation, exposure), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(distort_hsv(image, 0.0, 1.0, exposure), (image * exposure).clamp(0, 1))


def test_the_saturation_is_clamped_to_1_where_darknet_leaves_it_above():
    """The departure DarknetColor's docstring states. RGB (1, .5, .2): v = 1, s = .8, hue .375 sixths (sector 0,
    f = .375); saturation x1.5 makes s 1.2. Darknet's hsv_to_rgb takes it as is: (v, t, p) = (1, 1 - 1.2 (1 - f),
    1 - 1.2) = (1, .25, -.2), (1, .25, 0) after constrain_image; clamped to 1 (TF's adjust_saturation): (1, .375, 0).
    Below 1 the two agree: x1.2 makes s .96, (1, 1 - .96 * .625, 1 - .96) in both."""
    pixel = torch.tensor([1.0, 0.5, 0.2]).view(3, 1, 1)
    torch.testing.assert_close(distort_hsv(pixel, 0.0, 1.5, 1.0).flatten(), torch.tensor([1.0, 0.375, 0.0]))
    torch.testing.assert_close(distort_colors(pixel, 0.0, 1.5, 1.0).flatten(), torch.tensor([1.0, 0.375, 0.0]))
    torch.testing.assert_close(distort_hsv(pixel, 0.0, 1.2, 1.0).flatten(), torch.tensor([1.0, 0.4, 0.04]))


@pytest.mark.parametrize("options", [dict(jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5),
                                     dict(jitter=0.2), dict(flip=0.0, hue=0.05), dict(min_box_size=3.0)])
def test_the_direct_steps_after_the_resize_equal_the_v2_chain(options: dict):
    """TrainTransform calls torchvision's kernels directly for an image and a dict of boxes: the same samples, bit for
    bit and draw for draw, as its v2 chain, with boxes leaving the image, degenerate boxes and per-box entries."""
    generator = torch.Generator().manual_seed(7)
    transform = train_transform("letterbox", 48, **options)
    chain = train_transform("letterbox", 48, **options)
    chain.direct = False
    for seed in range(24):
        h, w = (int(v) for v in torch.randint(20, 90, (2,), generator=generator))
        image = tv_tensors.Image(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator))
        n = seed % 5
        corners = torch.rand(n, 2, generator=generator) * torch.tensor([w, h]) * 1.2 - 5
        sides = torch.rand(n, 2, generator=generator) * torch.tensor([w, h]) * (0.5 if seed % 3 else 0.01)
        boxes = torch.cat([corners, corners + sides], dim=1)
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w)),
                  "labels": torch.arange(n), "iscrowd": torch.zeros(n, dtype=torch.int64),
                  "area": (sides[:, 0] * sides[:, 1]), "image_id": seed, "data_problems": ["a note"]}
        outputs = []
        for each in (transform, chain):
            torch.manual_seed(seed)
            pixels, out = each(image, target)
            outputs.append((pixels, out, torch.rand(())))
        (pixels, out, after), (pixels_v2, out_v2, after_v2) = outputs
        assert type(pixels) is type(pixels_v2) is tv_tensors.Image and pixels.dtype == torch.float32
        assert torch.equal(pixels.view(torch.int32), pixels_v2.view(torch.int32))
        assert list(out) == list(out_v2)
        assert out["boxes"].canvas_size == out_v2["boxes"].canvas_size == (48, 48)
        for key in ("boxes", "labels", "iscrowd", "area"):
            assert type(out[key]) is type(out_v2[key]) and torch.equal(out[key], out_v2[key]), key
        assert out["image_id"] == seed and out["data_problems"] == ["a note"]
        assert torch.equal(after, after_v2)  # the same draws were taken
