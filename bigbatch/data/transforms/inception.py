"""Inception preprocessing as the Inception-v3 TPU recipe runs it, as torchvision v2 transforms.

The reference is TensorFlow's ``inception_preprocessing.py``: the TPU copy
(tensorflow/tpu ``models/experimental/inception/inception_preprocessing.py``, which Cloud TPU's Inception v3 recipe runs
with ``fast_mode=True`` and ``use_fast_color_distort=True``) and slim's (tensorflow/models
``research/slim/preprocessing/inception_preprocessing.py``, the ``fast_mode=False`` variant). The TensorFlow ops
they call are ``data/transforms/tf1_ops.py``'s, reproduced from their kernels with TF1 semantics (the TPU code is
TF1). Checked once against TensorFlow 2.21: :class:`InceptionEval` on ``china.jpg`` bit-identical to
``preprocess_for_eval``.

Pipelines: :class:`InceptionTrain` (crop, resize, flip, color, ``(x - 0.5) * 2``) and :class:`InceptionEval`
(central crop 0.875, bilinear resize, ``(x - 0.5) * 2``); both output float32 CHW in [-1, 1]. A dataset that
decodes JPEGs at reduced size chooses the box first from the header's size (:meth:`InceptionTrain.sample_box`,
:meth:`InceptionEval.crop_box`), decodes, and calls ``after_crop``.

Randomness comes from torch's global RNG (a dataset seeds it per sample, in a forked RNG:
``data/pipeline/order.py``'s ``sample_rng``).
"""

from __future__ import annotations

from typing import Any

import PIL.Image
import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from bigbatch.data.transforms.tf1_ops import (
    RESIZE_METHODS,
    Box,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    central_crop_box,
    draw_int,
    draw_uniform,
    f32,
    fast_resize_bilinear,
    fast_to_signed_unit,
    sample_distorted_bounding_box,
    size2,
    tf1_resize,
    tf1_resize_bilinear,
)

BRIGHTNESS_DELTA = 32.0 / 255.0  # slim distort_color: random_brightness(max_delta=32/255)
SATURATION_RANGE = (0.5, 1.5)  # random_saturation(lower=0.5, upper=1.5)
HUE_DELTA = 0.2  # random_hue(max_delta=0.2)
CONTRAST_RANGE = (0.5, 1.5)  # random_contrast(lower=0.5, upper=1.5)


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
        return x.to(torch.float32) * float(f32(1.0 / 255.0))
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
        return draw_uniform(-BRIGHTNESS_DELTA, BRIGHTNESS_DELTA)
    if name == "saturation":  # random_saturation: factor ~ U[0.5, 1.5)
        return draw_uniform(*SATURATION_RANGE)
    if name == "hue":  # random_hue: delta ~ U[-0.2, 0.2)
        return draw_uniform(-HUE_DELTA, HUE_DELTA)
    return draw_uniform(*CONTRAST_RANGE)  # random_contrast: factor ~ U[0.5, 1.5)


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
        ordering = self.ordering if self.ordering is not None else draw_int(4)
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
            "br": draw_uniform(-self.brightness, self.brightness),
            "cb": draw_uniform(-self.cb, self.cb),
            "cr": draw_uniform(-self.cr, self.cr),
        }

    def offsets(self, params: dict[str, float]) -> tuple[float, float, float]:
        """The (R, G, B) offsets of ``params``, in float32 as the TPU code computes them."""
        br, cb, cr = f32(params["br"]), f32(params["cb"]), f32(params["cr"])
        offsets = (
            f32(1.402) * cr + br,
            f32(-0.344136) * cb - f32(0.714136) * cr + br,
            f32(1.772) * cb + br,
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
        self.size = size2(size)
        self.fast = bool(fast)
        self.crop = DistortedBoundingBoxCrop()
        self.color: DistortColorFast | DistortColor = DistortColorFast() if fast else DistortColor(None)

    def sample_box(self, height: int, width: int) -> Box:
        """The crop ``(top, left, height, width)`` for a ``height x width`` image (from its size alone)."""
        return self.crop.sample_box(height, width)

    def draw_params(self) -> dict[str, Any]:
        """Everything drawn after the box: resize method, flip, colour parameters."""
        method = "bilinear" if self.fast else RESIZE_METHODS[draw_int(4)]
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
        return self.after_crop_drawn(image, self.draw_params(), fast=True, out=out)

    def after_crop_drawn(self, image: Any, params: dict[str, Any], fast: bool = False, out: Tensor | None = None
                         ) -> Tensor:
        """:meth:`after_crop` (``fast``: :meth:`after_crop_fast`) with the draws already made (:meth:`draw_params`):
        no random draw, so it may run in another thread than the one that drew."""
        x = _rgb_tensor(image)
        if (not fast or params["method"] != "bilinear" or x.dtype != torch.uint8
                or not isinstance(self.color, DistortColorFast)):
            result = self._finish(x, params)
            return result if out is None else out.copy_(result)
        return fast_to_signed_unit(fast_resize_bilinear(x, self.size, params["flip"]),
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
        self.size = size2(size)
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
        return fast_to_signed_unit(fast_resize_bilinear(x, self.size), out=out)

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
