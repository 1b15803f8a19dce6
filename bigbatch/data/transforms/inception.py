"""Inception preprocessing as the Inception-v3 TPU recipe runs it, as torchvision v2 transforms.

The reference is TensorFlow's ``inception_preprocessing.py``: the TPU copy
(tensorflow/tpu ``models/experimental/inception/inception_preprocessing.py``, which Cloud TPU's Inception v3 recipe runs
with ``fast_mode=True`` and ``use_fast_color_distort=True``) and slim's (tensorflow/models
``research/slim/preprocessing/inception_preprocessing.py``, the ``fast_mode=False`` variant). The TensorFlow ops
they call are reproduced from their kernels, TF1 semantics throughout (the TPU code is TF1):

- ``tf.image.sample_distorted_bounding_box``: ``core/kernels/image/sample_distorted_bounding_box_op.cc``
  (:class:`DistortedBoundingBoxCrop`).
- ``tf.image.resize_images`` / ``resize_bilinear(align_corners=False)``: ``core/kernels/image/resize_*_op.cc``
  with ``LegacyScaler`` (``core/util/image_resizer_state.h``), the TF1 default: ``src = dst * in / out``, not
  TF2's / torch's half-pixel ``src = (dst + 0.5) * in / out - 0.5`` (:func:`tf1_resize`).
- ``adjust_brightness`` / ``adjust_saturation`` / ``adjust_hue`` / ``adjust_contrast`` (``adjust_*_op.cc``,
  ``python/ops/image_ops_impl.py``) and ``central_crop`` (``image_ops_impl.py``).

Checked once against TensorFlow 2.21 (CPU, ``tf.compat.v1``; not a test dependency): the four resizes, the
saturation and hue kernels bit-identical (contrast and area within 2e-7), ``central_crop`` sizes identical,
:class:`InceptionEval` on ``china.jpg`` bit-identical to ``preprocess_for_eval``, and 3,000 boxes from
``sample_distorted_bounding_box`` on 240x320 and 427x640 images distributed as ours (two-sample KS p >= 0.15 for
height, width, area, top, left; the same degenerate boxes on 10x1, 30x2 and 200x1 images).

Pipelines: :class:`InceptionTrain` (crop, resize, flip, color, ``(x - 0.5) * 2``) and :class:`InceptionEval`
(central crop 0.875, bilinear resize, ``(x - 0.5) * 2``); both output float32 CHW in [-1, 1]. A dataset that
decodes JPEGs at reduced size chooses the box first from the header's size (:meth:`InceptionTrain.sample_box`,
:meth:`InceptionEval.crop_box`), decodes, and calls ``after_crop``. :func:`standard_train` /
:func:`standard_eval` are torchvision's ImageNet recipe, for ``data.preprocessing: standard``.

Randomness comes from torch's global RNG (a dataset seeds it per sample, in a forked RNG: ``data/pipeline/order.py``'s
``sample_rng``). The draws are torch's, not TensorFlow's Philox stream: the same seed gives other boxes and
factors than TF, from the same distributions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import PIL.Image
import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = [
    "DistortColor",
    "DistortColorFast",
    "DistortedBoundingBoxCrop",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "InceptionEval",
    "InceptionTrain",
    "RESIZE_METHODS",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "central_crop_box",
    "sample_distorted_bounding_box",
    "standard_eval",
    "standard_train",
    "tf1_resize",
    "tf1_resize_bilinear",
]

Box = tuple[int, int, int, int]  # (top, left, height, width), as torchvision's F.crop takes it
_f32 = np.float32

# tf.image.ResizeMethod's order in TF1: BILINEAR=0, NEAREST_NEIGHBOR=1, BICUBIC=2, AREA=3 (slim picks one by index).
RESIZE_METHODS = ("bilinear", "nearest", "bicubic", "area")
BRIGHTNESS_DELTA = 32.0 / 255.0  # slim distort_color: random_brightness(max_delta=32/255)
SATURATION_RANGE = (0.5, 1.5)  # random_saturation(lower=0.5, upper=1.5)
HUE_DELTA = 0.2  # random_hue(max_delta=0.2)
CONTRAST_RANGE = (0.5, 1.5)  # random_contrast(lower=0.5, upper=1.5)
# torchvision's ImageNet statistics (references/classification/presets.py).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------------------------------- randomness


def _uniform(low: float, high: float) -> float:
    """One float32 draw from U[low, high) as TF's ``random_uniform``: ``u * (high - low) + low``, u ~ U[0, 1)."""
    u = _f32(torch.rand(()).item())
    return float(u * (_f32(high) - _f32(low)) + _f32(low))


def _randint(n: int) -> int:
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
    min_area = min_area_fraction * _f32(width) * _f32(height)
    max_area = max_area_fraction * _f32(width) * _f32(height)
    h = _lrint(np.sqrt(min_area / aspect_ratio))
    max_h = _lrint(np.sqrt(max_area / aspect_ratio))
    if _lrint(_f32(max_h) * aspect_ratio) > width:
        # the kernel: smallest max_height with round(max_height * r) <= W, computed in double, truncated
        max_h = int((width + 0.5 - float(_f32(1e-7))) / float(aspect_ratio))
        if _lrint(_f32(max_h) * aspect_ratio) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += _randint(max_h - h + 1)  # closed range [h, max_h]
    w = _lrint(_f32(h) * aspect_ratio)
    area = _f32(w * h)
    if area < min_area:  # rounding left the area too small: one row more
        h += 1
        w = _lrint(_f32(h) * aspect_ratio)
        area = _f32(w * h)
    if area > max_area:  # too large: one row less
        h -= 1
        w = _lrint(_f32(h) * aspect_ratio)
        area = _f32(w * h)
    if area < min_area or area > max_area or w > width or h > height or w <= 0 or h <= 0:
        return None
    top = _randint(height - h) if h < height else 0
    left = _randint(width - w) if w < width else 0
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
    a0, a1 = _f32(area[0]), _f32(area[1])  # TF's attrs are float32
    r0, r1 = _f32(aspect_ratio[0]), _f32(aspect_ratio[1])
    covered = _f32(min_object_covered)
    image_area = _f32(width * height)
    for _ in range(max_attempts):
        u = _f32(torch.rand(()).item())
        r = u * (r1 - r0) + r0
        box = _generate_random_crop(width, height, a0, a1, r)
        if box is None:
            continue
        crop_area = _f32(box[2] * box[3])
        # SatisfiesOverlapConstraints: crop area >= 1 and intersection / object area >= min_object_covered
        if crop_area >= 1 and crop_area / image_area >= covered:
            return box
    return 0, 0, height, width


# ---------------------------------------------------------------------------------------------- v2 plumbing


def _is_pure_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) and not isinstance(x, tv_tensors.TVTensor)


def _query_size(flat_inputs: list[Any]) -> tuple[int, int]:
    sizes = {tuple(F.get_size(x)) for x in flat_inputs if isinstance(x, (Tensor, PIL.Image.Image))}
    if len(sizes) != 1:
        raise ValueError(f"expected one image size among the inputs, found {sorted(sizes) or 'none'}")
    h, w = sizes.pop()
    return int(h), int(w)


def _check_classification_inputs(flat_inputs: list[Any], name: str) -> None:
    if any(isinstance(x, (tv_tensors.BoundingBoxes, tv_tensors.Mask, tv_tensors.Video)) for x in flat_inputs):
        raise TypeError(f"{name} transforms images for classification; boxes, masks and videos are not supported")


def _image_tensor(inpt: Any, name: str) -> Tensor:
    """A float CHW image tensor (colour transforms take float images in [0, 1], as TF's ops do)."""
    if isinstance(inpt, PIL.Image.Image) or not isinstance(inpt, Tensor):
        raise TypeError(f"{name} expects a float CHW tensor in [0, 1], got {type(inpt).__name__}")
    if not inpt.is_floating_point():
        raise TypeError(f"{name} expects a float image in [0, 1], got dtype {inpt.dtype}")
    if inpt.ndim != 3 or inpt.shape[0] != 3:
        raise ValueError(f"{name} expects one RGB image of shape (3, H, W), got {tuple(inpt.shape)}")
    return inpt.as_subclass(Tensor)


def _rewrap(out: Tensor, like: Any) -> Any:
    return tv_tensors.wrap(out, like=like) if isinstance(like, tv_tensors.TVTensor) else out


def _rgb_tensor(image: Any) -> Tensor:
    """uint8 or float CHW tensor / PIL image -> a three-channel CHW tensor of the same values (not yet float).

    One grey channel is repeated to three (TF decodes with ``channels=3``)."""
    if isinstance(image, PIL.Image.Image):
        image = F.pil_to_tensor(image if image.mode == "RGB" else image.convert("RGB"))
    if not isinstance(image, Tensor):
        raise TypeError(f"expected an image tensor or a PIL image, got {type(image).__name__}")
    x = image.as_subclass(Tensor)
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise TypeError(f"expected a uint8 or float image, got dtype {x.dtype}")
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise ValueError(f"expected one image of shape (3, H, W) or (1, H, W), got {tuple(x.shape)}")
    return x.expand(3, -1, -1) if x.shape[0] == 1 else x


def _unit_float(x: Tensor) -> Tensor:
    """uint8 -> float32 in [0, 1] as TF's ``convert_image_dtype``: ``float(x) * float32(1 / 255)``; a float tensor
    is taken to be in [0, 1] already (made float32)."""
    if x.dtype == torch.uint8:
        return x.to(torch.float32) * float(_f32(1.0 / 255.0))
    return x.to(torch.float32)


class _Transform(v2.Transform):
    """A v2 transform written against torchvision's public names (``make_params``, ``transform``)."""

    # torchvision < 0.21 calls these private names
    def _get_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        return self.make_params(flat_inputs)

    def _transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self.transform(inpt, params)


# --------------------------------------------------------------------------------------------------- the crop


class DistortedBoundingBoxCrop(_Transform):
    """Crop a random box drawn as TF's ``sample_distorted_bounding_box`` with the whole image as the only box.

    Defaults as the TPU code's ``distorted_bounding_box_crop``: ``area=(0.05, 1.0)``, ``aspect_ratio=(3/4, 4/3)``
    (width / height), ``min_object_covered=0.1``, ``max_attempts=100``; after ``max_attempts`` failures the
    whole image. The effective area range is ``[max(area[0], min_object_covered), area[1]]``
    (:attr:`effective_area`; see :func:`sample_distorted_bounding_box` for why, and for the exact rounding).

    :meth:`sample_box` chooses a box from a size alone (a dataset can read the size from a JPEG header, then
    decode at reduced size). Called on an image (CHW tensor, ``tv_tensors``, PIL), it crops it with
    ``v2.functional.crop`` (boxes and masks given with it are cropped alike).
    """

    def __init__(
        self,
        area: tuple[float, float] = (0.05, 1.0),
        aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        min_object_covered: float = 0.1,
        max_attempts: int = 100,
    ) -> None:
        super().__init__()
        if not (0 < area[0] <= area[1] <= 1):
            raise ValueError(f"area must satisfy 0 < area[0] <= area[1] <= 1, got {tuple(area)}")
        if not (0 < aspect_ratio[0] <= aspect_ratio[1]):
            raise ValueError(f"aspect_ratio must satisfy 0 < low <= high, got {tuple(aspect_ratio)}")
        if min_object_covered < 0:
            raise ValueError(f"min_object_covered must be >= 0, got {min_object_covered}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.area = (float(area[0]), float(area[1]))
        self.aspect_ratio = (float(aspect_ratio[0]), float(aspect_ratio[1]))
        self.min_object_covered = float(min_object_covered)
        self.max_attempts = int(max_attempts)

    @property
    def effective_area(self) -> tuple[float, float]:
        """The area fraction range of a sampled box: ``(max(area[0], min_object_covered), area[1])``."""
        return max(self.area[0], self.min_object_covered), self.area[1]

    def sample_box(self, height: int, width: int) -> Box:
        """``(top, left, height, width)`` of a box in a ``height x width`` image."""
        return sample_distorted_bounding_box(
            height, width, self.area, self.aspect_ratio, self.min_object_covered, self.max_attempts
        )

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _query_size(flat_inputs)
        return {"box": self.sample_box(height, width)}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        top, left, h, w = params["box"]
        return F.crop(inpt, top, left, h, w)


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


def _size2(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size}")
    return int(size[0]), int(size[1])


def _legacy_source(out_size: int, in_size: int, device: torch.device) -> Tensor:
    """TF1's ``LegacyScaler``: ``src = float32(dst) * float32(in / out)`` (``CalculateResizeScale``, float32)."""
    scale = _f32(in_size) / _f32(out_size)
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
    oh, ow = _size2(size)
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
    oh, ow = _size2(size)
    x = image.as_subclass(Tensor).unsqueeze(0)
    x = x.flip(-1).contiguous(memory_format=torch.channels_last) if flip else \
        x.contiguous(memory_format=torch.channels_last)
    return torch.nn.functional.interpolate(x, size=(oh, ow), mode="bilinear", align_corners=False,
                                           antialias=False)[0]


def _fast_to_signed_unit(x: Tensor, offset: Sequence[float] = (0.0, 0.0, 0.0), out: Tensor | None = None) -> Tensor:
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
    src = (np.arange(out_size).astype(np.float32)) * (_f32(in_size) / _f32(out_size))
    base = np.floor(src).astype(np.int64)
    offset = np.rint((src - base.astype(np.float32)) * _f32(1024)).astype(np.int64)
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
    s = _f32(in_size) / _f32(out_size)
    o = np.arange(out_size)
    lo = o.astype(np.float32) * s
    hi = (o + 1).astype(np.float32) * s
    start = np.floor(lo).astype(np.int64)
    end = np.ceil(hi).astype(np.int64)
    cells = start[:, None] + np.arange(int((end - start).max()))[None, :]
    cf = cells.astype(np.float32)
    lo_, hi_ = lo[:, None], hi[:, None]
    ends_after = cf + _f32(1) > hi_
    weight = np.where(cf < lo_, np.where(ends_after, s, cf + _f32(1) - lo_), np.where(ends_after, hi_ - cf, _f32(1)))
    weight = np.where(cells < end[:, None], weight, 0).astype(np.float32)
    matrix = np.zeros((out_size, in_size), dtype=np.float32)
    np.add.at(matrix, (np.broadcast_to(o[:, None], cells.shape), np.clip(cells, 0, in_size - 1)), weight)
    return torch.from_numpy(matrix), s


def _resize_area(x: Tensor, oh: int, ow: int) -> Tensor:
    """TF's ``resize_area``: ``out = sum_ij wy_i wx_j x_ij / (sy * sx)`` (weights from :func:`_area_matrix`)."""
    ih, iw = x.shape[-2:]
    my, sy = _area_matrix(oh, ih)
    mx, sx = _area_matrix(ow, iw)
    scale = float(_f32(1.0 / float(sy * sx)))
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
    oh, ow = _size2(size)
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
    h = h + float(_f32(delta) * _f32(6))
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


_COLOR_OPS = {
    "brightness": adjust_brightness,
    "saturation": adjust_saturation,
    "hue": adjust_hue,
    "contrast": adjust_contrast,
}
# slim's distort_color orderings
_ORDERINGS = {
    0: ("brightness", "saturation", "hue", "contrast"),
    1: ("saturation", "brightness", "contrast", "hue"),
    2: ("contrast", "hue", "brightness", "saturation"),
    3: ("hue", "saturation", "contrast", "brightness"),
}
_FAST_ORDERINGS = {0: ("brightness", "saturation"), 1: ("saturation", "brightness")}


def _draw_color_op(name: str) -> float:
    if name == "brightness":  # random_brightness: delta ~ U[-32/255, 32/255)
        return _uniform(-BRIGHTNESS_DELTA, BRIGHTNESS_DELTA)
    if name == "saturation":  # random_saturation: factor ~ U[0.5, 1.5)
        return _uniform(*SATURATION_RANGE)
    if name == "hue":  # random_hue: delta ~ U[-0.2, 0.2)
        return _uniform(-HUE_DELTA, HUE_DELTA)
    return _uniform(*CONTRAST_RANGE)  # random_contrast: factor ~ U[0.5, 1.5)


class DistortColor(_Transform):
    """slim's ``distort_color(image, color_ordering, fast_mode)`` on a float RGB image in [0, 1].

    Orderings (``fast_mode=False``): 0 brightness, saturation, hue, contrast; 1 saturation, brightness, contrast,
    hue; 2 contrast, hue, brightness, saturation; 3 hue, saturation, contrast, brightness. ``fast_mode=True``:
    0 brightness, saturation; 1, 2, 3 saturation, brightness. Each op as TF defines it, its parameter drawn
    when it is applied: brightness ``x + d``, ``d ~ U[-32/255, 32/255)``; saturation (HSV ``s * f``, clipped,
    ``f ~ U[0.5, 1.5)``, :func:`adjust_saturation`); hue (``h + d`` wrapped, ``d ~ U[-0.2, 0.2)``,
    :func:`adjust_hue`); contrast (``(x - mean_c) * f + mean_c``, ``f ~ U[0.5, 1.5)``, :func:`adjust_contrast`).
    No clipping between the ops, then ``clip(x, 0, 1)``. ``ordering=None`` draws the ordering per image from
    {0, 1, 2, 3}, as slim's ``apply_with_random_selector(..., num_cases=4)``.
    """

    _transformed_types = (tv_tensors.Image, PIL.Image.Image, _is_pure_tensor)

    def __init__(self, ordering: int | None, fast_mode: bool = False) -> None:
        super().__init__()
        if ordering is not None and ordering not in _ORDERINGS:
            raise ValueError(f"ordering must be 0, 1, 2, 3 or None (random), got {ordering!r}")
        self.ordering = ordering
        self.fast_mode = bool(fast_mode)

    def ops(self, ordering: int) -> tuple[str, ...]:
        """The op names slim applies for ``ordering``, in order."""
        if self.fast_mode:
            return _FAST_ORDERINGS[0 if ordering == 0 else 1]
        return _ORDERINGS[ordering]

    def draw_params(self) -> dict[str, Any]:
        """``{"ordering": k, "ops": [(name, value), ...]}``: the ordering, then each op's parameter in order."""
        ordering = self.ordering if self.ordering is not None else _randint(4)
        return {"ordering": ordering, "ops": [(name, _draw_color_op(name)) for name in self.ops(ordering)]}

    def apply(self, image: Tensor, params: dict[str, Any]) -> Tensor:
        """Apply drawn ``params`` (from :meth:`draw_params`) to a float image, then clip to [0, 1]."""
        for name, value in params["ops"]:
            image = _COLOR_OPS[name](image, value)
        return image.clamp(0.0, 1.0)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        return self.draw_params()

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return _rewrap(self.apply(_image_tensor(inpt, "DistortColor"), params), inpt)


class DistortColorFast(_Transform):
    """The TPU code's ``distort_color_fast``: brightness and YCbCr chroma offsets on a float RGB image in [0, 1].

    Per image ``br ~ U[-brightness, brightness)``, ``cb ~ U[-cb, cb)``, ``cr ~ U[-cr, cr)`` (defaults 32/255,
    0.1, 0.1); ``R += 1.402 cr + br``, ``G += -0.344136 cb - 0.714136 cr + br``, ``B += 1.772 cb + br``
    (the YCbCr -> RGB matrix applied to an offset (br, cb, cr)); then ``clip(x, 0, 1)``.
    """

    _transformed_types = (tv_tensors.Image, PIL.Image.Image, _is_pure_tensor)

    def __init__(self, brightness: float = 32 / 255, cb: float = 0.1, cr: float = 0.1) -> None:
        super().__init__()
        self.brightness, self.cb, self.cr = float(brightness), float(cb), float(cr)

    def draw_params(self) -> dict[str, float]:
        """``{"br", "cb", "cr"}`` drawn in the TPU code's order."""
        return {
            "br": _uniform(-self.brightness, self.brightness),
            "cb": _uniform(-self.cb, self.cb),
            "cr": _uniform(-self.cr, self.cr),
        }

    def offsets(self, params: dict[str, float]) -> tuple[float, float, float]:
        """The (R, G, B) offsets of ``params``, in float32 as the TPU code computes them."""
        br, cb, cr = _f32(params["br"]), _f32(params["cb"]), _f32(params["cr"])
        offsets = (
            _f32(1.402) * cr + br,
            _f32(-0.344136) * cb - _f32(0.714136) * cr + br,
            _f32(1.772) * cb + br,
        )
        return tuple(float(o) for o in offsets)

    def apply(self, image: Tensor, params: dict[str, float]) -> Tensor:
        offset = torch.tensor(self.offsets(params), dtype=image.dtype, device=image.device)
        return (image + offset[:, None, None]).clamp(0.0, 1.0)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        return self.draw_params()

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return _rewrap(self.apply(_image_tensor(inpt, "DistortColorFast"), params), inpt)


# -------------------------------------------------------------------------------------------------- pipelines


class InceptionTrain(_Transform):
    """Inception training preprocessing as the TPU recipe runs it; float32 CHW in [-1, 1] out.

    ``fast=True`` (``preprocess_for_train(fast_mode=True)`` with ``use_fast_color_distort=True``): a
    :class:`DistortedBoundingBoxCrop`, a resize to ``size x size`` ignoring the aspect ratio with TF1 bilinear
    (:func:`tf1_resize_bilinear`), a horizontal flip with p = 0.5 (``random_flip_left_right``: flip if
    ``u < 0.5``), :class:`DistortColorFast`, then ``(x - 0.5) * 2``. ``fast=False`` (slim's
    ``fast_mode=False``): the resize method drawn from TF1's four (bilinear, nearest, bicubic, area;
    :func:`tf1_resize`) and :class:`DistortColor` with an ordering drawn from the four.

    Input: a uint8 CHW tensor, a float CHW tensor in [0, 1], or a PIL image (converted to RGB). Draw order:
    the box, the resize method (``fast=False``), the flip, the colour parameters. A dataset that decodes at
    reduced size calls ``box = t.sample_box(H, W)``, crops while decoding, then ``t.after_crop(crop)``; from
    the same RNG state this matches ``t(image)`` on the fully decoded image.
    """

    _transformed_types = (tv_tensors.Image, PIL.Image.Image, _is_pure_tensor)

    def __init__(self, size: int = 299, fast: bool = True) -> None:
        super().__init__()
        self.size = _size2(size)
        self.fast = bool(fast)
        self.crop = DistortedBoundingBoxCrop()
        self.color: DistortColorFast | DistortColor = DistortColorFast() if fast else DistortColor(None)

    def sample_box(self, height: int, width: int) -> Box:
        """The crop ``(top, left, height, width)`` for a ``height x width`` image (from its size alone)."""
        return self.crop.sample_box(height, width)

    def draw_params(self) -> dict[str, Any]:
        """Everything drawn after the box: resize method, flip, colour parameters."""
        method = "bilinear" if self.fast else RESIZE_METHODS[_randint(4)]
        flip = torch.rand(()).item() < 0.5
        return {"method": method, "flip": flip, "color": self.color.draw_params()}

    def _finish(self, image: Tensor, params: dict[str, Any]) -> Tensor:
        """Resize (gathering from the crop's own values), flip, colour, scale to [-1, 1]."""
        if params["method"] == "bilinear":
            x = tf1_resize_bilinear(image, self.size, convert=_unit_float)
        else:
            x = tf1_resize(_unit_float(image), self.size, params["method"])
        if params["flip"]:
            x = x.flip(-1)
        x = self.color.apply(x, params["color"])
        return x.sub_(0.5).mul_(2.0)  # (x - 0.5) * 2, on the tensor the colour step just made

    def after_crop(self, image: Any) -> Tensor:
        """Everything after the crop, on an already cropped image (uint8 / float CHW tensor or PIL)."""
        return self._finish(_rgb_tensor(image), self.draw_params())

    def after_crop_fast(self, image: Any, out: Tensor | None = None) -> Tensor:
        """:meth:`after_crop` with the bilinear resize done by :func:`fast_resize_bilinear` on the uint8 pixels
        (``data.decode: fast``); the same random draws in the same order, so the same box, flip and colours.
        Only the bilinear method with the fast colour distortion has a fast form; any other runs as
        :meth:`after_crop`. With ``out`` the result is written there (a batch's slot)."""
        x, params = _rgb_tensor(image), self.draw_params()
        if params["method"] != "bilinear" or x.dtype != torch.uint8 or not isinstance(self.color, DistortColorFast):
            result = self._finish(x, params)
            return result if out is None else out.copy_(result)
        return _fast_to_signed_unit(fast_resize_bilinear(x, self.size, params["flip"]),
                                    self.color.offsets(params["color"]), out)

    def check_inputs(self, flat_inputs: list[Any]) -> None:
        _check_classification_inputs(flat_inputs, "InceptionTrain")

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _query_size(flat_inputs)
        box = self.sample_box(height, width)
        return {"box": box, **self.draw_params()}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        top, left, h, w = params["box"]
        return _rewrap(self._finish(_rgb_tensor(F.crop(inpt, top, left, h, w)), params), inpt)


class InceptionEval(v2.Transform):
    """Inception evaluation preprocessing (``preprocess_for_eval``); float32 CHW in [-1, 1] out.

    TF's ``central_crop(central_fraction)`` with its integer rounding (:func:`central_crop_box`), TF1
    ``resize_bilinear(align_corners=False)`` to ``size x size`` (:func:`tf1_resize_bilinear`), ``(x - 0.5) * 2``.
    :meth:`crop_box` gives the crop from the size alone; :meth:`after_crop` does the rest.
    """

    _transformed_types = (tv_tensors.Image, PIL.Image.Image, _is_pure_tensor)

    def __init__(self, size: int = 299, central_fraction: float = 0.875) -> None:
        super().__init__()
        if not (0.0 < central_fraction <= 1.0):
            raise ValueError(f"central_fraction must be in (0, 1], got {central_fraction}")
        self.size = _size2(size)
        self.central_fraction = float(central_fraction)

    def crop_box(self, height: int, width: int) -> Box:
        """``(top, left, height, width)`` of the central crop of a ``height x width`` image."""
        return central_crop_box(height, width, self.central_fraction)

    def after_crop(self, image: Any) -> Tensor:
        """Resize and scale an already cropped image (uint8 / float CHW tensor or PIL)."""
        return (tf1_resize_bilinear(_rgb_tensor(image), self.size, convert=_unit_float) - 0.5) * 2.0

    def after_crop_fast(self, image: Any, out: Tensor | None = None) -> Tensor:
        """:meth:`after_crop` with :func:`fast_resize_bilinear` for a uint8 image (``data.decode: fast``), into
        ``out`` when given."""
        x = _rgb_tensor(image)
        if x.dtype != torch.uint8:
            result = self.after_crop(x)
            return result if out is None else out.copy_(result)
        return _fast_to_signed_unit(fast_resize_bilinear(x, self.size), out=out)

    def check_inputs(self, flat_inputs: list[Any]) -> None:
        _check_classification_inputs(flat_inputs, "InceptionEval")

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        return {"box": self.crop_box(*_query_size(flat_inputs))}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        top, left, h, w = params["box"]
        return _rewrap(self.after_crop(F.crop(inpt, top, left, h, w)), inpt)

    # torchvision < 0.21 calls these private names
    def _get_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        return self.make_params(flat_inputs)

    def _transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self.transform(inpt, params)


def standard_train(size: int = 224) -> v2.Compose:
    """torchvision's ImageNet training recipe (``references/classification/presets.py``), as a v2 Compose.

    ``RandomResizedCrop(size)`` (area U[0.08, 1], aspect log-uniform [3/4, 4/3], bilinear, antialias), horizontal
    flip p = 0.5, to float [0, 1], ``Normalize(IMAGENET_MEAN, IMAGENET_STD)``. Input PIL or uint8 CHW tensor;
    output a plain float32 tensor. Randomness: torch's global RNG.
    """
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            v2.ToPureTensor(),
        ]
    )


def standard_eval(size: int = 224) -> v2.Compose:
    """torchvision's ImageNet evaluation recipe: ``Resize(int(size / 0.875))`` (shorter side; 256 for 224),
    ``CenterCrop(size)``, to float [0, 1], ``Normalize(IMAGENET_MEAN, IMAGENET_STD)``; a plain float32 tensor."""
    return v2.Compose(
        [
            v2.Resize(int(size / 0.875), antialias=True),
            v2.CenterCrop(size),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            v2.ToPureTensor(),
        ]
    )
