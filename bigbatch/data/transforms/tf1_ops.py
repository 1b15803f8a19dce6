"""TensorFlow 1's image kernels, reproduced in torch: what the Inception v3 TPU recipe's preprocessing calls
(``data/transforms/inception.py`` composes them).

- ``tf.image.sample_distorted_bounding_box``: ``core/kernels/image/sample_distorted_bounding_box_op.cc``
  (:func:`sample_distorted_bounding_box`).
- ``tf.image.resize_images`` / ``resize_bilinear(align_corners=False)``: ``core/kernels/image/resize_*_op.cc``
  with ``LegacyScaler`` (``core/util/image_resizer_state.h``), the TF1 default: ``src = dst * in / out``, not
  TF2's / torch's half-pixel ``src = (dst + 0.5) * in / out - 0.5`` (:func:`tf1_resize`).
- ``adjust_brightness`` / ``adjust_saturation`` / ``adjust_hue`` / ``adjust_contrast`` (``adjust_*_op.cc``,
  ``python/ops/image_ops_impl.py``) and ``central_crop`` (``image_ops_impl.py``).

Checked once against TensorFlow 2.21 (CPU, ``tf.compat.v1``; not a test dependency): the four resizes, the
saturation and hue kernels bit-identical (contrast and area within 2e-7), ``central_crop`` sizes identical, and 3,000
boxes from ``sample_distorted_bounding_box`` on 240x320 and 427x640 images distributed as ours (two-sample KS p >=
0.15 for height, width, area, top, left; the same degenerate boxes on 10x1, 30x2 and 200x1 images).

Randomness comes from torch's global RNG (a dataset seeds it per sample). The draws are torch's, not TensorFlow's
Philox stream: the same seed gives other boxes and factors than TF, from the same distributions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

Box = tuple[int, int, int, int]  # (top, left, height, width), as torchvision's F.crop takes it
f32 = np.float32
"""TF's attributes and arithmetic are float32: values are rounded through it where the kernels round."""

# tf.image.ResizeMethod's order in TF1: BILINEAR=0, NEAREST_NEIGHBOR=1, BICUBIC=2, AREA=3 (slim picks one by index).
RESIZE_METHODS = ("bilinear", "nearest", "bicubic", "area")


# --------------------------------------------------------------------------------------------------- randomness


def draw_uniform(low: float, high: float) -> float:
    """One float32 draw from U[low, high) as TF's ``random_uniform``: ``u * (high - low) + low``, u ~ U[0, 1)."""
    u = f32(torch.rand(()).item())
    return float(u * (f32(high) - f32(low)) + f32(low))


def draw_int(n: int) -> int:
    """Uniform integer in [0, n) (TF's ``SimplePhilox::Uniform(n)``, ``random_uniform(maxval=n, dtype=int32)``)."""
    return int(torch.randint(n, ()).item())


# ------------------------------------------------------------------------------- sample_distorted_bounding_box


def _lrint(x: np.float32) -> int:
    """C's ``lrintf`` in the default rounding mode: round half to even."""
    return int(np.rint(x))


def _generate_random_crop(
    width: int,
    height: int,
    min_area_fraction: np.float32,
    max_area_fraction: np.float32,
    aspect_ratio: np.float32,
) -> Box | None:
    """One attempt of TF's ``GenerateRandomCrop`` (float32 arithmetic as the kernel's); None when it fails.

    ``min_area = a0 * W * H``, ``max_area = a1 * W * H``; the height is drawn uniformly from the integers
    ``[lrint(sqrt(min_area / r)), max_height]`` with ``max_height = lrint(sqrt(max_area / r))``, lowered until
    ``lrint(max_height * r) <= W`` and capped at ``H``; ``width = lrint(height * r)``. If the area falls below
    ``min_area`` the height goes up by one (above ``max_area``, down by one), the width recomputed; then the crop
    fails unless ``min_area <= w * h <= max_area``, ``0 < w <= W``, ``0 < h <= H``. Offsets:
    ``y ~ Uniform(H - h)``, ``x ~ Uniform(W - w)``, i.e. in ``[0, H - h - 1]``: a crop shorter than the image
    never touches its bottom (nor a narrower one its right edge), TF's own quirk, kept.
    """
    if max_area_fraction <= 0 or aspect_ratio <= 0 or width <= 0 or height <= 0:
        return None
    if min_area_fraction > max_area_fraction:
        return None
    min_area = min_area_fraction * f32(width) * f32(height)
    max_area = max_area_fraction * f32(width) * f32(height)
    h = _lrint(np.sqrt(min_area / aspect_ratio))
    max_h = _lrint(np.sqrt(max_area / aspect_ratio))
    if _lrint(f32(max_h) * aspect_ratio) > width:
        # the kernel: smallest max_height with round(max_height * r) <= W, computed in double, truncated
        max_h = int((width + 0.5 - float(f32(1e-7))) / float(aspect_ratio))
        if _lrint(f32(max_h) * aspect_ratio) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += draw_int(max_h - h + 1)  # closed range [h, max_h]
    w = _lrint(f32(h) * aspect_ratio)
    area = f32(w * h)
    if area < min_area:  # rounding left the area too small: one row more
        h += 1
        w = _lrint(f32(h) * aspect_ratio)
        area = f32(w * h)
    if area > max_area:  # too large: one row less
        h -= 1
        w = _lrint(f32(h) * aspect_ratio)
        area = f32(w * h)
    if area < min_area or area > max_area or w > width or h > height or w <= 0 or h <= 0:
        return None
    top = draw_int(height - h) if h < height else 0
    left = draw_int(width - w) if w < width else 0
    return top, left, h, w


def sample_distorted_bounding_box(
    height: int,
    width: int,
    area: tuple[float, float] = (0.05, 1.0),
    aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    min_object_covered: float = 0.1,
    max_attempts: int = 100,
) -> Box:
    """TF's ``sample_distorted_bounding_box`` with no boxes given (``use_image_if_no_bounding_boxes=True``).

    Source: tensorflow ``core/kernels/image/sample_distorted_bounding_box_op.cc``. Each attempt draws the
    aspect ratio (width / height) ``r = u * (r1 - r0) + r0`` and runs ``GenerateRandomCrop`` with the area
    range (see :func:`_generate_random_crop`); the crop is then kept if it covers at least
    ``min_object_covered`` of one supplied box. With no boxes the only box is the whole image, so the check reads
    ``w * h / (W * H) >= min_object_covered``: ``min_object_covered`` is a second lower bound on the crop's area
    fraction, and the effective area range is ``[max(area[0], min_object_covered), area[1]]`` = [0.1, 1] for
    the defaults, not [0.05, 1]. As in the kernel, a crop drawn between 0.05 and 0.1 is rejected and costs an
    attempt (the heights are drawn from the 0.05 bound): the accepted boxes have TF's distribution, which is not
    that of a draw with ``area=(0.1, 1)``. After ``max_attempts`` failed attempts: the whole image.
    Returns ``(top, left, height, width)``.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"sample_distorted_bounding_box: the image size must be positive, got {height}x{width}")
    a0, a1 = f32(area[0]), f32(area[1])  # TF's attrs are float32
    r0, r1 = f32(aspect_ratio[0]), f32(aspect_ratio[1])
    covered = f32(min_object_covered)
    image_area = f32(width * height)
    for _ in range(max_attempts):
        u = f32(torch.rand(()).item())
        r = u * (r1 - r0) + r0
        box = _generate_random_crop(width, height, a0, a1, r)
        if box is None:
            continue
        crop_area = f32(box[2] * box[3])
        # SatisfiesOverlapConstraints: crop area >= 1 and intersection / object area >= min_object_covered
        if crop_area >= 1 and crop_area / image_area >= covered:
            return box
    return 0, 0, height, width


def central_crop_box(height: int, width: int, central_fraction: float = 0.875) -> Box:
    """TF's ``central_crop`` box: per side ``start = int((n - n * f) / 2)`` (double, truncated), ``size = n - 2 start``.

    Source: ``tf.image.central_crop`` (``python/ops/image_ops_impl.py``). E.g. n = 375: start 23, size 329
    (not round(375 * 0.875) = 328). Returns ``(top, left, height, width)``.
    """
    if not (0.0 < central_fraction <= 1.0):
        raise ValueError(f"central_fraction must be in (0, 1], got {central_fraction}")
    top = int((float(height) - float(height) * central_fraction) / 2)
    left = int((float(width) - float(width) * central_fraction) / 2)
    return top, left, height - 2 * top, width - 2 * left


# ------------------------------------------------------------------------------------------------ TF1 resizes


def size2(size: int | Sequence[int]) -> tuple[int, int]:
    """``size`` as ``(height, width)``: an int is a square."""
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size}")
    return int(size[0]), int(size[1])


def _legacy_source(out_size: int, in_size: int, device: torch.device) -> Tensor:
    """TF1's ``LegacyScaler``: ``src = float32(dst) * float32(in / out)`` (``CalculateResizeScale``, float32)."""
    scale = f32(in_size) / f32(out_size)
    return torch.arange(out_size, dtype=torch.float32, device=device) * float(scale)


def tf1_resize_bilinear(image: Tensor, size: int | Sequence[int],
                        convert: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """TensorFlow 1's ``resize_bilinear(align_corners=False)`` on a (N)CHW tensor; float32 out.

    Source: ``core/kernels/image/resize_bilinear_op.cc`` with ``LegacyScaler``. Per axis, in float32:
    ``src = dst * (in / out)``, ``lower = max(floor(src), 0)``, ``upper = min(ceil(src), in - 1)``,
    ``lerp = src - floor(src)``; then ``top = tl + (tr - tl) * x_lerp``, ``bottom = bl + (br - bl) * x_lerp``,
    ``out = top + (bottom - top) * y_lerp`` (the kernel's operations in its order). The source grid is anchored
    at the top-left pixel, so the image shifts by half a source pixel against the half-pixel mapping
    ``src = (dst + 0.5) * in / out - 0.5`` of TF2 and of torch, and the last rows/columns repeat on upsampling.

    ``convert`` turns the input's values into the float32 the kernel reads (default: ``.to(float32)``); it is
    applied to the gathered samples only, so a uint8 image is gathered as bytes (a conversion is elementwise:
    converting before or after a gather gives the same values). Columns are gathered as rows of the transposed
    image (a gather along the last dimension is several times slower in torch), and every operation after
    a gather runs in place; the arithmetic is the kernel's, bit for bit.

    Measured against torch's ``F.interpolate(mode='bilinear', align_corners=False, antialias=False)`` on
    scikit-learn's ``china.jpg`` (427x640, float in [0, 1]) resized to 299x299: max |difference| 0.419, mean
    0.0269 (twice that on the [-1, 1] scale after ``(x - 0.5) * 2``); torch 2.14.1, 2026-12-01. Against
    TensorFlow 2.21's ``tf.compat.v1.image.resize_bilinear`` (CPU) on the same photo: bit-identical.
    """
    oh, ow = size2(size)
    if image.ndim < 2:
        raise ValueError(f"tf1_resize_bilinear expects a (N)CHW tensor, got shape {tuple(image.shape)}")
    convert = convert or (lambda v: v.to(torch.float32))
    x = image.as_subclass(Tensor)
    ih, iw = x.shape[-2:]
    if (oh, ow) == (ih, iw):
        return convert(x).clone()  # the kernel's no-op shortcut (the legacy mapping is the identity there anyway)

    def axis(out_size: int, in_size: int) -> tuple[Tensor, Tensor, Tensor]:
        src = _legacy_source(out_size, in_size, x.device)
        floor = torch.floor(src)
        lower = floor.long().clamp(min=0)
        upper = torch.ceil(src).long().clamp(max=in_size - 1)
        return lower, upper, src - floor

    y0, y1, yl = axis(oh, ih)
    x0, x1, xl = axis(ow, iw)
    columns = x.transpose(-1, -2).contiguous()  # (..., W, H): column j of the image is row j of this
    if ih <= 2 * oh:  # fewer source rows than the two per output row: lerp every source row along x once
        along_x = convert(columns.index_select(-2, x0))
        right = convert(columns.index_select(-2, x1))
        along_x.add_(right.sub_(along_x).mul_(xl[:, None]))  # tl + (tr - tl) * x_lerp for every source row
        rows = along_x.transpose(-1, -2).contiguous()
        top, bottom = rows.index_select(-2, y0), rows.index_select(-2, y1)
    else:
        left = columns.index_select(-2, x0).transpose(-1, -2)
        right = columns.index_select(-2, x1).transpose(-1, -2)
        top, top_right = convert(left.index_select(-2, y0)), convert(right.index_select(-2, y0))
        bottom, bottom_right = convert(left.index_select(-2, y1)), convert(right.index_select(-2, y1))
        top.add_(top_right.sub_(top).mul_(xl))
        bottom.add_(bottom_right.sub_(bottom).mul_(xl))
    return top.add_(bottom.sub_(top).mul_(yl[:, None]))


def fast_resize_bilinear(image: Tensor, size: int | Sequence[int], flip: bool = False) -> Tensor:
    """The fast path's stand-in for :func:`tf1_resize_bilinear`: torch's bilinear resize of a uint8 CHW image,
    computed in channels-last layout (torch's vectorised uint8 kernel), no antialiasing, optionally mirrored
    left-right; uint8 CHW out (a channels-last view).

    torch maps an output pixel to ``src = (dst + 0.5) * in / out - 0.5`` (half-pixel centres) and rounds to
    uint8; TF1's legacy scaler maps it to ``src = dst * in / out`` in float32 (:func:`tf1_resize_bilinear`).
    The output moves by ``0.5 * (in / out - 1)`` source pixels against TF1's and loses the float's fraction
    of a grey level. The half-pixel mapping is symmetric, so the flip is done on the input, in the copy the
    channels-last layout needs anyway. How far the Inception outputs differ is measured in ``docs/data.md``.
    """
    oh, ow = size2(size)
    x = image.as_subclass(Tensor).unsqueeze(0)
    x = x.flip(-1).contiguous(memory_format=torch.channels_last) if flip else \
        x.contiguous(memory_format=torch.channels_last)
    return torch.nn.functional.interpolate(x, size=(oh, ow), mode="bilinear", align_corners=False,
                                           antialias=False)[0]


def fast_to_signed_unit(x: Tensor, offset: Sequence[float] = (0.0, 0.0, 0.0), out: Tensor | None = None) -> Tensor:
    """uint8 CHW (any layout) -> float32 ``clip(x / 255 + offset, 0, 1) * 2 - 1``, computed as
    ``clip(x * 2/255 + (2 offset - 1), -1, 1)`` in one conversion and two in-place passes (the fast path's
    arithmetic: equal to the exact path's up to float rounding), into ``out`` when given (a batch's slot), else a
    new contiguous tensor."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device) if out is None else out
    out.copy_(x)
    shift = torch.tensor([2 * o - 1 for o in offset], dtype=torch.float32, device=x.device)
    return out.mul_(2 / 255).add_(shift[:, None, None]).clamp_(-1.0, 1.0)


def _resize_nearest(x: Tensor, oh: int, ow: int) -> Tensor:
    """TF1 ``resize_nearest_neighbor`` (legacy): ``src = min(floor(dst * in / out), in - 1)`` in float32."""
    ih, iw = x.shape[-2:]
    ys = torch.floor(_legacy_source(oh, ih, x.device)).long().clamp(max=ih - 1)
    xs = torch.floor(_legacy_source(ow, iw, x.device)).long().clamp(max=iw - 1)
    return x.index_select(-2, ys).index_select(-1, xs)


def _bicubic_table() -> tuple[np.ndarray, np.ndarray]:
    """TF's Keys cubic table (A = -0.75, 1024 steps): ``k1(t) = ((A+2)t - (A+3))t^2 + 1`` at t = i/1024 and
    ``k2(t) = ((A t - 5A)t + 8A)t - 4A`` at t = 1 + i/1024 (``InitCoeffsTable``: double arithmetic, float table)."""
    a = -0.75
    t = (np.arange(1025, dtype=np.float64) / 1024).astype(np.float32).astype(np.float64)
    k1 = (((a + 2) * t - (a + 3)) * t * t + 1).astype(np.float32)
    t2 = (t + 1.0).astype(np.float32).astype(np.float64)
    k2 = (((a * t2 - 5 * a) * t2 + 8 * a) * t2 - 4 * a).astype(np.float32)
    return k1, k2


_K1, _K2 = _bicubic_table()


def _bicubic_axis(out_size: int, in_size: int) -> tuple[Tensor, Tensor]:
    """Indices (4, out) and weights (4, out) of TF1's legacy bicubic (``GetWeightsAndIndices<LegacyScaler>``).

    ``src = dst * in / out``, ``i = floor(src)``, ``offset = lrint((src - i) * 1024)``; the taps ``i-1 .. i+2``
    (clamped to the image) weigh ``k2[offset], k1[offset], k1[1024 - offset], k2[1024 - offset]``.
    """
    src = (np.arange(out_size).astype(np.float32)) * (f32(in_size) / f32(out_size))
    base = np.floor(src).astype(np.int64)
    offset = np.rint((src - base.astype(np.float32)) * f32(1024)).astype(np.int64)
    index = np.clip(base[None, :] + np.arange(-1, 3)[:, None], 0, in_size - 1)
    weight = np.stack([_K2[offset], _K1[offset], _K1[1024 - offset], _K2[1024 - offset]])
    return torch.from_numpy(index), torch.from_numpy(weight)


def _resize_bicubic(x: Tensor, oh: int, ow: int) -> Tensor:
    """TF1 ``resize_bicubic(align_corners=False)``: 4 taps along y, then 4 along x, sums in the kernel's order."""
    ih, iw = x.shape[-2:]
    yi, yw = (t.to(x.device) for t in _bicubic_axis(oh, ih))
    xi, xw = (t.to(x.device) for t in _bicubic_axis(ow, iw))
    rows = [x.index_select(-2, yi[k]) * yw[k][:, None] for k in range(4)]
    cols = ((rows[0] + rows[1]) + rows[2]) + rows[3]
    taps = [cols.index_select(-1, xi[k]) * xw[k] for k in range(4)]
    return ((taps[0] + taps[1]) + taps[2]) + taps[3]


def _area_matrix(out_size: int, in_size: int) -> tuple[Tensor, np.float32]:
    """Weights (out, in) of TF's ``resize_area`` along one axis, and the axis scale ``in / out`` (float32).

    Output cell ``o`` spans ``[o s, (o + 1) s)``, ``s = in / out``; source cell ``i`` in
    ``[floor(o s), ceil((o + 1) s))`` (clamped into the image) weighs its overlap: ``s`` if it covers the span,
    ``i + 1 - o s`` if it starts before it, ``(o + 1) s - i`` if it ends after it, else 1.
    """
    s = f32(in_size) / f32(out_size)
    o = np.arange(out_size)
    lo = o.astype(np.float32) * s
    hi = (o + 1).astype(np.float32) * s
    start = np.floor(lo).astype(np.int64)
    end = np.ceil(hi).astype(np.int64)
    cells = start[:, None] + np.arange(int((end - start).max()))[None, :]
    cf = cells.astype(np.float32)
    lo_, hi_ = lo[:, None], hi[:, None]
    ends_after = cf + f32(1) > hi_
    weight = np.where(cf < lo_, np.where(ends_after, s, cf + f32(1) - lo_), np.where(ends_after, hi_ - cf, f32(1)))
    weight = np.where(cells < end[:, None], weight, 0).astype(np.float32)
    matrix = np.zeros((out_size, in_size), dtype=np.float32)
    np.add.at(matrix, (np.broadcast_to(o[:, None], cells.shape), np.clip(cells, 0, in_size - 1)), weight)
    return torch.from_numpy(matrix), s


def _resize_area(x: Tensor, oh: int, ow: int) -> Tensor:
    """TF's ``resize_area``: ``out = sum_ij wy_i wx_j x_ij / (sy * sx)`` (weights from :func:`_area_matrix`)."""
    ih, iw = x.shape[-2:]
    my, sy = _area_matrix(oh, ih)
    mx, sx = _area_matrix(ow, iw)
    scale = float(f32(1.0 / float(sy * sx)))
    my, mx = my.to(x.device), mx.to(x.device)
    return torch.matmul(my, torch.matmul(x, mx.T)) * scale


def tf1_resize(image: Tensor, size: int | Sequence[int], method: str = "bilinear") -> Tensor:
    """TF1's ``tf.image.resize_images(image, size, method)`` (``align_corners=False``) on a (N)CHW tensor.

    All four of slim's methods follow TF1's CPU kernels (legacy ``src = dst * in / out`` mapping), none is
    torch's approximation. Checked against TensorFlow 2.21's ``tf.compat.v1.image.resize_images`` (CPU) on
    random images up- and downsampled: bilinear, nearest and bicubic bit-identical, area within 2e-7 (float32
    summation order). ``bilinear`` (:func:`tf1_resize_bilinear`), ``nearest``
    (``floor(dst * in / out)``: the same indices as torch's ``mode='nearest'``), ``bicubic`` (Keys A = -0.75 from
    TF's 1024-step table, taps clamped at the border; torch's bicubic uses the half-pixel mapping), ``area``
    (exact fractional-overlap averaging; torch's ``mode='area'`` is adaptive average pooling over whole cells).
    Output float32 (nearest keeps the input's values); bicubic can overshoot [0, 1], as TF's does.
    """
    oh, ow = size2(size)
    if method == "bilinear":
        return tf1_resize_bilinear(image, (oh, ow))
    x = image.as_subclass(Tensor)
    x = x if method == "nearest" else x.to(torch.float32)
    if method == "nearest":
        return _resize_nearest(x, oh, ow)
    if method == "bicubic":
        return _resize_bicubic(x, oh, ow)
    if method == "area":
        return _resize_area(x, oh, ow)
    raise ValueError(f"method must be one of {RESIZE_METHODS}, got {method!r}")


# ------------------------------------------------------------------------------------------------- colour ops


def adjust_brightness(image: Tensor, delta: float) -> Tensor:
    """TF's ``adjust_brightness`` on a float image: ``x + delta`` (no clipping)."""
    return image + delta


def adjust_contrast(image: Tensor, factor: float) -> Tensor:
    """TF's ``adjust_contrast`` (``AdjustContrastv2``): ``mean_c + factor * (x - mean_c)``, one mean per channel
    over the image's pixels (torchvision's ``adjust_contrast`` blends with one grey mean instead)."""
    mean = image.mean(dim=(-2, -1), keepdim=True)
    return mean + factor * (image - mean)


def adjust_saturation(image: Tensor, factor: float) -> Tensor:
    """TF's ``adjust_saturation`` kernel on float RGB (..., 3, H, W): HSV saturation ``s' = clip(s * factor, 0, 1)``.

    ``rgb_to_hsv``: ``v = max``, ``range = v - min``, ``s = range / v`` (0 if v <= 0), hue
    ``h = (g - b) / (6 range)`` if r is the max, ``(b - r) / (6 range) + 2/6`` if g, else
    ``(r - g) / (6 range) + 4/6``, 0 for grey, +1 if negative; ``hsv_to_rgb``: ``c = s' v``, ``m = v - c``,
    sector ``int(6 h)``, ``x = c (1 - |(6 h mod 2) - 1|)``. torchvision's ``adjust_saturation`` blends with a
    greyscale image instead. Source: ``core/kernels/image/adjust_saturation_op.cc``.
    """
    r, g, b = image.unbind(-3)
    v = torch.maximum(r, torch.maximum(g, b))
    span = v - torch.minimum(r, torch.minimum(g, b))
    s = torch.where(v > 0, span / v, torch.zeros_like(v))
    norm = 1.0 / (6.0 * span)
    # the kernel adds the double constants 2/6 and 4/6 in double, then stores a float
    h = torch.where(
        r == v,
        norm * (g - b),
        torch.where(
            g == v,
            ((norm * (b - r)).double() + 2.0 / 6.0).float(),
            ((norm * (r - g)).double() + 4.0 / 6.0).float(),
        ),
    )
    h = torch.where(span <= 0, torch.zeros_like(h), h)
    h = torch.where(h < 0, h + 1, h)
    s = torch.clamp(s * factor, 0.0, 1.0)
    c = s * v
    m = v - c
    dh = h * 6
    sector = dh.long()
    fmodu = dh - 2 * torch.floor(dh / 2)  # the kernel's loops: dh brought into [0, 2)
    x = c * (1 - torch.abs(fmodu - 1))
    zero = torch.zeros_like(c)
    table = {0: (c, x, zero), 1: (x, c, zero), 2: (zero, c, x), 3: (zero, x, c), 4: (x, zero, c), 5: (c, zero, x)}
    out = [zero, zero, zero]  # the kernel's default branch (sector 6 when h rounds to 1.0)
    for k, rgb in table.items():
        out = [torch.where(sector == k, new, old) for new, old in zip(rgb, out, strict=True)]
    return torch.stack([channel + m for channel in out], dim=-3)


def adjust_hue(image: Tensor, delta: float) -> Tensor:
    """TF's ``adjust_hue`` kernel on float RGB (..., 3, H, W): hue rotated by ``delta`` turns, wrapped into [0, 1).

    Per pixel, keeping ``v_min`` and ``v_max``: the hue ``h`` in [0, 6) from the sector of the channel order
    and ``(mid - min) / (max - min)``; ``h += 6 delta`` wrapped into [0, 6); the middle channel becomes
    ``min + ratio (max - min)``. Source: ``core/kernels/image/adjust_hue_op.cc`` (``rgb_to_hv_range``).
    """
    r, g, b = image.unbind(-3)
    r_lt_g = r < g
    # sectors (the kernel's comparisons): r<g: b<r 1, b>g 3, else 2; r>=g: b<g 0, b>r 4, else 5
    sector = torch.where(
        r_lt_g,
        torch.where(b < r, 1, torch.where(b > g, 3, 2)),
        torch.where(b < g, 0, torch.where(b > r, 4, 5)),
    )
    vmax = torch.maximum(r, torch.maximum(g, b))
    vmin = torch.minimum(r, torch.minimum(g, b))
    mid = torch.where((sector == 0) | (sector == 3), g, torch.where((sector == 1) | (sector == 4), r, b))
    increase = sector % 2 == 0
    ratio = (mid - vmin) / (vmax - vmin)
    h = sector.to(image.dtype) + torch.where(increase, ratio, 1 - ratio)
    h = torch.where(vmax == vmin, torch.zeros_like(h), h)
    h = h + float(f32(delta) * f32(6))
    h = torch.where(h < 0, h + 6, h)
    h = torch.where(h >= 6, h - 6, h)
    sector = h.long()
    ratio = h - sector.to(h.dtype)
    ratio = torch.where(sector % 2 == 0, ratio, 1 - ratio)
    vmid = vmin + ratio * (vmax - vmin)
    table = {
        0: (vmax, vmid, vmin),
        1: (vmid, vmax, vmin),
        2: (vmin, vmax, vmid),
        3: (vmin, vmid, vmax),
        4: (vmid, vmin, vmax),
    }
    out = [vmax, vmin, vmid]  # sector 5 and the kernel's default
    for k, rgb in table.items():
        out = [torch.where(sector == k, new, old) for new, old in zip(rgb, out, strict=True)]
    return torch.stack(out, dim=-3)
