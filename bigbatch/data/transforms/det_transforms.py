"""Detection transforms: the sizes are decided here, every box moves through torchvision.transforms.v2.

A sample is ``(image, target)``: ``image`` a ``tv_tensors.Image`` uint8 [3, H, W] (float32 in [0, 1] after
the final ``ToDtype``), ``target`` a dict with ``boxes`` (``tv_tensors.BoundingBoxes`` float32 XYXY pixels,
``canvas_size=(H, W)``), ``labels`` (int64 [N]) and ``image_id``. v2's kernels (resize, pad, crop, flip,
clamp, sanitize) do all the box arithmetic; this module only chooses the output sizes:

- shorter-side resize (MegDet / detectron2 ``ResizeShortestEdge``, 800 / 1333):
  ``scale = min(short_target / min(h, w), max_size / max(h, w))``, each side ``int(side * scale + 0.5)``.
  ``v2.Resize(size, max_size=...)`` truncates (``int()``) and requires ``max_size > size``, so the size is
  computed here (in exact rational arithmetic) and v2 resizes to an explicit ``(h, w)``.
- letterbox for square-input detectors (Darknet ``letterbox_image``, src/image.c): the longer side becomes
  ``size``, the shorter ``side * size // longer`` (C's integer division: truncated), centred on a
  ``size x size`` canvas (``left = (size - new_w) // 2``, the odd pixel goes right / bottom, as Darknet's
  integer division), padded with grey 114 (as YOLOv5/8).
- stretch to ``size x size``, the aspect ratio not kept (Darknet's ``resize_image`` for ``letter_box=0``, the
  default; torchvision's SSD ``Resize((300, 300))``): each axis scaled on its own.
- random crop (detectron2 ``RandomCrop("relative_range")``, see :class:`RandomRelativeCrop`).
- AlexeyAB Darknet's mosaic of four images (``data/transforms/mosaic.py``), which the training transform carries for the
  dataset (it needs three more records).

Pipelines (:func:`train_transform`, :func:`eval_transform`) return a callable
``(image, target, size=None) -> (image, target)`` where ``size`` is this step's multi-scale size (the
shorter side, or the square side for letterbox and stretch). ``image_id``, ``orig_size`` and any other non-box entry of
the target pass through untouched; the per-box entries ``labels``, ``iscrowd`` and ``area`` are dropped
together with their boxes (``area`` is not recomputed after a crop or a resize).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from bigbatch.data.transforms.mosaic import Mosaic
from bigbatch.data.transforms.zoom import precalc, zoomed_sides

try:
    from bigbatch.data import _hsv  # csrc/hsv.c: distort_hsv in one pass
except ImportError:  # not built where the package was installed
    _hsv = None

ResizeMode = Literal["shorter_side", "letterbox", "stretch"]
Target = dict[str, Any]

PAD_VALUE = 114  # letterbox grey, as YOLOv5/YOLOv8 (Darknet uses 0.5 on float images)
PER_BOX_KEYS = ("labels", "iscrowd", "area")
DEFAULT_CROP_FRACTION = 0.5  # crop=True: each side of the crop is U(0.5, 1) of the image's


def _round(x: Fraction) -> int:
    """``int(x + 0.5)``: detectron2's rounding of a resized side, here on the exact value."""
    return int(x + Fraction(1, 2))


def shorter_side_size(height: int, width: int, short: int, max_size: int | None = None) -> tuple[int, int]:
    """``(new_h, new_w)`` with ``scale = min(short / min(h, w), max_size / max(h, w))`` and each side
    ``int(side * scale + 0.5)`` (detectron2 ``ResizeShortestEdge.get_output_shape``, MegDet 800 / 1333)."""
    scale = Fraction(short, min(height, width))
    if max_size is not None:
        scale = min(scale, Fraction(max_size, max(height, width)))
    return max(1, _round(height * scale)), max(1, _round(width * scale))


def letterbox_geometry(height: int, width: int, size: int) -> tuple[int, int, int, int]:
    """``(new_h, new_w, top, left)`` as Darknet's ``letterbox_image`` (src/image.c) computes them for a
    ``size x size`` input: if ``(float)size / w < (float)size / h`` (float32), ``new_w = size`` and
    ``new_h = h * size / w`` in C's integer division (truncated), else ``new_h = size`` and ``new_w = w * size / h``;
    the offsets centre it, ``(size - new) / 2`` truncated. A side is at least 1 pixel (Darknet would make it 0).
    E.g. 333 x 501 (h x w) at 416: ``new_h = 138528 // 501 = 276`` (276.5 truncated), ``top = 70``."""
    if np.float32(size) / np.float32(width) < np.float32(size) / np.float32(height):
        new_h, new_w = height * size // width, size
    else:
        new_h, new_w = size, width * size // height
    new_h, new_w = max(1, new_h), max(1, new_w)
    return new_h, new_w, (size - new_h) // 2, (size - new_w) // 2


def _canvas_size(flat_inputs: list[Any]) -> tuple[int, int]:
    """``(H, W)`` of the sample: from its image, else from its boxes' canvas."""
    for inpt in flat_inputs:
        if isinstance(inpt, (tv_tensors.Image, tv_tensors.BoundingBoxes)):
            h, w = F.get_size(inpt)
            return h, w
    raise TypeError("a detection sample needs a tv_tensors.Image or tv_tensors.BoundingBoxes")


def _boxes(flat_inputs: list[Any]) -> tv_tensors.BoundingBoxes | None:
    return next((x for x in flat_inputs if isinstance(x, tv_tensors.BoundingBoxes)), None)


class ResizeShorterSide(v2.Transform):
    """Resize so the shorter side is ``size`` and the longer at most ``max_size`` (:func:`shorter_side_size`);
    boxes follow through ``v2.functional.resize``."""

    def __init__(self, size: int, max_size: int | None = None):
        super().__init__()
        self.size, self.max_size = size, max_size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        h, w = _canvas_size(flat_inputs)
        return {"size": list(shorter_side_size(h, w, self.size, self.max_size))}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return F.resize(inpt, params["size"], antialias=True)


class Letterbox(v2.Transform):
    """Resize the longer side to ``size`` keeping the aspect, then pad to ``size x size``, centred, with
    ``fill`` (images; masks get 0) (:func:`letterbox_geometry`); boxes follow through v2's resize and pad."""

    def __init__(self, size: int, fill: int = PAD_VALUE):
        super().__init__()
        self.size, self.fill = size, fill

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        h, w = _canvas_size(flat_inputs)
        new_h, new_w, top, left = letterbox_geometry(h, w, self.size)
        padding = [left, top, self.size - new_w - left, self.size - new_h - top]  # left, top, right, bottom
        return {"size": [new_h, new_w], "padding": padding}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        out = F.resize(inpt, params["size"], antialias=True)
        return F.pad(out, params["padding"], fill=self.fill if isinstance(inpt, tv_tensors.Image) else 0)


class RandomRelativeCrop(v2.Transform):
    """With probability ``p``, crop a random window whose sides are ``U(min_fraction, 1)`` of the image's,
    at a uniform position (detectron2 ``RandomCrop("relative_range", (f, f))``: ``crop = int(side * U + 0.5)``,
    offset ``randint(side - crop + 1)``).

    The window must keep at least one box at least ``min_size`` pixels wide and high after clipping (when
    the image has boxes): up to ``tries`` windows are drawn and, if none qualifies, the image is left
    uncropped, so a crop never turns an annotated image into an empty one. The crop itself is
    ``v2.functional.crop`` (boxes shifted by the window origin and clipped to it); follow it with
    :func:`clamp_and_sanitize` to drop the boxes left with no area, with their labels.
    """

    def __init__(self, min_fraction: float = DEFAULT_CROP_FRACTION, p: float = 0.5, tries: int = 10,
                 min_size: float = 1.0):
        super().__init__()
        if not 0.0 < min_fraction <= 1.0:
            raise ValueError(f"crop fraction must be in (0, 1], got {min_fraction}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"crop probability must be in [0, 1], got {p}")
        self.min_fraction, self.p, self.tries, self.min_size = min_fraction, p, tries, min_size

    def sample_window(self, height: int, width: int) -> tuple[int, int, int, int]:
        """A random ``(top, left, crop_h, crop_w)`` inside an image of ``height x width``."""
        frac = self.min_fraction + torch.rand(2) * (1.0 - self.min_fraction)
        crop_h = min(height, max(1, int(height * float(frac[0]) + 0.5)))
        crop_w = min(width, max(1, int(width * float(frac[1]) + 0.5)))
        top = int(torch.randint(height - crop_h + 1, ()))
        left = int(torch.randint(width - crop_w + 1, ()))
        return top, left, crop_h, crop_w

    def keeps_a_box(self, boxes: tv_tensors.BoundingBoxes, window: tuple[int, int, int, int]) -> bool:
        """Whether some box is still ``min_size`` wide and high once cropped to ``window`` and clipped."""
        cropped = F.clamp_bounding_boxes(F.crop(boxes, *window), clamping_mode="hard")
        xyxy = F.convert_bounding_box_format(cropped, new_format=tv_tensors.BoundingBoxFormat.XYXY)
        sides = xyxy[:, 2:] - xyxy[:, :2]
        return bool((sides >= self.min_size).all(dim=1).any())

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        if self.p < 1.0 and float(torch.rand(())) >= self.p:
            return {"window": None}
        height, width = _canvas_size(flat_inputs)
        boxes = _boxes(flat_inputs)
        for _ in range(self.tries):
            window = self.sample_window(height, width)
            if boxes is None or len(boxes) == 0 or self.keeps_a_box(boxes, window):
                return {"window": window}
        return {"window": None}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if params["window"] is None:
            return inpt
        return F.crop(inpt, *params["window"])


class RandomFixedCrop(RandomRelativeCrop):
    """A random ``size x size`` window (a side shorter than ``size`` is kept whole), at a uniform position: MegDet's
    800 x 800 training crop after the shorter side is resized to 800 (MegDet, arXiv 1711.07240).

    As :class:`RandomRelativeCrop`, a window must keep at least one box ``min_size`` wide and high (up to ``tries``
    draws); after that the window is centred on a box (clamped to the image), so the output is never larger than
    ``size`` (the planned memory) and never loses every box."""

    def __init__(self, size: int, tries: int = 10, min_size: float = 1.0):
        super().__init__(1.0, p=1.0, tries=tries, min_size=min_size)
        if size < 1:
            raise ValueError(f"crop size must be >= 1, got {size}")
        self.size = int(size)

    def sample_window(self, height: int, width: int) -> tuple[int, int, int, int]:
        crop_h, crop_w = min(height, self.size), min(width, self.size)
        top = int(torch.randint(height - crop_h + 1, ()))
        left = int(torch.randint(width - crop_w + 1, ()))
        return top, left, crop_h, crop_w

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        params = super().make_params(flat_inputs)
        if params["window"] is not None:
            return params
        height, width = _canvas_size(flat_inputs)
        boxes = _boxes(flat_inputs)
        if boxes is None or len(boxes) == 0:
            return {"window": self.sample_window(height, width)}
        boxes = F.convert_bounding_box_format(boxes, new_format=tv_tensors.BoundingBoxFormat.XYXY)
        x1, y1, x2, y2 = (float(v) for v in boxes[int(torch.randint(len(boxes), ()))])
        crop_h, crop_w = min(height, self.size), min(width, self.size)
        top = min(max(0, round((y1 + y2 - crop_h) / 2)), height - crop_h)
        left = min(max(0, round((x1 + x2 - crop_w) / 2)), width - crop_w)
        return {"window": (top, left, crop_h, crop_w)}


def alexeyab_window(height: int, width: int, jitter: float, resize: float, draws: Sequence[float]
                    ) -> tuple[int, int, int, int]:
    """The crop window ``(top, left, height, width)`` of AlexeyAB's ``load_data_detection`` (src/data.c,
    ``letter_box=0``, no mosaic) for an ``height x width`` image, line for line in C's float32 and its truncating
    int conversions, with ``draws = (r1, r2, r3, r4, resize_r1, resize_r2)`` in [0, 1]:

        dw = (int)(ow * jitter),  dh likewise
        min_rdw = (int)(ow * (1 - 1 / resize_down) / 2)   (resize_down = min(resize, 1 / resize): <= 0)
        max_rdw = (int)(ow * (1 - 1 / resize_up) / 2)     (resize_up = max(resize, 1 / resize): >= 0)
        pleft  = (int)(r1 * 2 dw - dw),  pright with r2, ptop with r3 (dh), pbot with r4
        pleft  = (int)(pleft + R(min_rdw, max_rdw, resize_r1)),  ptop with resize_r1 (min_rdh, max_rdh),
        pright, pbot likewise with resize_r2                  (R(a, b, r) = r * (b - a) + a, float)

    where ``max_rdw`` is 0 when ``resize < 1`` (only a zoom out). So each side moves by the jitter and then by a
    zoom of up to ``resize`` in or out, the left and top sides by one draw, the right and bottom by another. A
    window of no width or height, or that starts past the image (``ow - pleft <= 0``), is the whole image."""
    f32, ow, oh = np.float32, np.float32(width), np.float32(height)
    r1, r2, r3, r4, resize_r1, resize_r2 = (f32(d) for d in draws)
    dw, dh = int(ow * f32(jitter)), int(oh * f32(jitter))
    pleft, pright = int(precalc(f32(-dw), f32(dw), r1)), int(precalc(f32(-dw), f32(dw), r2))
    ptop, pbot = int(precalc(f32(-dh), f32(dh), r3)), int(precalc(f32(-dh), f32(dh), r4))
    pleft, pright, ptop, pbot = zoomed_sides(height, width, resize, (pleft, pright, ptop, pbot), resize_r1, resize_r2)
    swidth, sheight = width - pleft - pright, height - ptop - pbot
    if swidth <= 0 or sheight <= 0 or width - pleft <= 0 or height - ptop <= 0:  # "invalid resize"
        return 0, 0, height, width
    return ptop, pleft, sheight, swidth


class DarknetJitter(v2.Transform):
    """Darknet's jitter crop (``load_data_detection`` in ``src/data.c``): each side of the image moves by an integer
    drawn in ``(-jitter * side, jitter * side)``, inwards or outwards; outside the image is black
    (``get_pixel_extend``). The window is then stretched to the network's input (Darknet's ``letter_box=0``):
    :class:`TrainTransform` follows it with a plain resize. Boxes are shifted, clipped and dropped as by
    :func:`clamp_and_sanitize`.

    Without ``resize`` (1, the default), the draw is pjreddie's (``int pleft = rand_uniform(-dw, dw)``, ``dw = jitter
    * side``). With AlexeyAB's ``[yolo] resize`` (e.g. 1.5: a random zoom of up to 1.5 in or out; below 1, out
    only), the window is AlexeyAB's, jitter and zoom together: :func:`alexeyab_window`, from six uniform draws."""

    def __init__(self, jitter: float, resize: float = 1.0) -> None:
        super().__init__()
        if not 0.0 <= jitter < 0.5:
            raise ValueError(f"jitter must be in [0, 0.5), got {jitter}")
        if not (math.isfinite(resize) and resize > 0):
            raise ValueError(f"resize must be a finite number > 0, got {resize}")
        self.jitter, self.resize = jitter, resize

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _canvas_size(flat_inputs)
        if self.resize != 1.0:
            return {"window": alexeyab_window(height, width, self.jitter, self.resize, torch.rand(6).tolist())}
        dw, dh = self.jitter * width, self.jitter * height
        left, right, top, bottom = (int(float(torch.empty(()).uniform_(-d, d))) for d in (dw, dw, dh, dh))
        return {"window": (top, left, max(1, height - top - bottom), max(1, width - left - right))}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return F.crop(inpt, *params["window"])  # beyond the image: zero-padded, boxes shifted


def rand_scale(s: float) -> float:
    """Darknet's ``rand_scale``: ``u ~ U[1, s]``, then ``u`` or ``1 / u`` with even odds."""
    u = 1.0 + float(torch.rand(())) * (s - 1.0)
    return u if float(torch.rand(())) < 0.5 else 1.0 / u


_HSV_CHANNEL_OFFSETS = torch.tensor([5.0, 3.0, 1.0]).view(3, 1, 1)  # R, G, B in hsv_to_rgb's closed form


def distort_hsv(image: torch.Tensor, hue: float, saturation: float, exposure: float) -> torch.Tensor:
    """Darknet's ``distort_image`` on a float RGB image (3, H, W) in [0, 1], in one HSV round trip.

    ``rgb_to_hsv`` (as TF's kernels and ``colorsys``): ``v = max``, ``s = (max - min) / v`` (0 where v = 0), the
    hue in sixths ``h = (g - b) / span`` mod 6 where r is the max, ``(b - r) / span + 2`` where g is, else
    ``(r - g) / span + 4``. The distortion: ``s' = clip(s * saturation, 0, 1)`` (Darknet leaves ``s'`` unclipped:
    :class:`DarknetColor`), ``h' = (h + 6 hue) mod 6``.
    Back to RGB by the closed form of ``hsv_to_rgb``: channel ``n`` (R 5, G 3, B 1) is
    ``v (1 - s' clip(min(k, 4 - k), 0, 1))`` with ``k = (n + h') mod 6``; then times ``exposure`` and clipped to
    [0, 1] (``constrain_image``). Equal, to float rounding, to TF's ``adjust_saturation`` then ``adjust_hue``
    (``data/transforms/tf1_ops.py``) then the scale, which it replaces because it is several times faster.
    """
    if hue == 0.0 and saturation == 1.0:
        return (image * exposure).clamp_(0.0, 1.0)
    r, g, b = image.unbind(-3)
    v, argmax = image.max(dim=-3)
    span = v - image.amin(dim=-3)
    safe = span.clamp_min(torch.finfo(image.dtype).tiny)
    # argmax takes the first maximum: r, then g, as the kernels' comparisons r == v, then g == v
    sixths = torch.where(argmax == 0, (g - b) / safe, torch.where(argmax == 1, (b - r) / safe + 2, (r - g) / safe + 4))
    sixths = torch.remainder(sixths + 6.0 * hue, 6.0)
    scaled = (span / v.clamp_min(torch.finfo(image.dtype).tiny) * saturation).clamp_(0.0, 1.0)
    k = torch.remainder(_HSV_CHANNEL_OFFSETS + sixths, 6.0)
    weight = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    return (v * exposure * (1.0 - scaled * weight)).clamp_(0.0, 1.0)


def distort_colors(image: torch.Tensor, hue: float, saturation: float, exposure: float) -> torch.Tensor:
    """:func:`distort_hsv` of a float image, or of a uint8 one first made float32 in [0, 1] as
    ``v2.ToDtype(torch.float32, scale=True)`` makes it. Where the C kernel was built (``csrc/hsv.c``) and applies (a
    CPU float32 or uint8 image of 3 channels, ``|hue| <= 0.5`` turns), in one pass with the same float32 operations,
    so the result is the torch version's bit for bit; about 9x faster at 128 px (0.11 against 1.0 ms, one thread)."""
    if (_hsv is not None and image.dtype in (torch.uint8, torch.float32) and image.ndim == 3 and image.shape[0] == 3
            and image.device.type == "cpu" and -0.5 <= hue <= 0.5 and not image.requires_grad):
        pixels = image.as_subclass(torch.Tensor).contiguous()
        out = torch.empty(pixels.shape, dtype=torch.float32)
        _hsv.distort(pixels.numpy(), out.numpy(), pixels.dtype == torch.uint8, pixels.shape[1], pixels.shape[2], hue,
                     saturation, exposure)
        return out
    if not image.is_floating_point():
        image = F.to_dtype(image, torch.float32, scale=True)
    return distort_hsv(image, hue, saturation, exposure)


class DarknetColor(v2.Transform):
    """Darknet's colour distortion (``random_distort_image``): on an RGB image in [0, 1] (float, or uint8 made float32
    as ``v2.ToDtype(scale=True)`` does), the HSV saturation times ``rand_scale(saturation)`` (clipped at 1), the hue
    shifted by ``U(-hue, hue)`` turns (wrapped), the value (exposure) times ``rand_scale(exposure)``, then clipped to
    [0, 1] (``constrain_image``): :func:`distort_colors`. One departure from Darknet: the saturation is clamped to 1
    before the conversion back to RGB, which Darknet's ``distort_image`` does not do (its ``hsv_to_rgb`` takes an
    ``s`` above 1, so a colour's smaller channels fall further, clipped at 0 by ``constrain_image``: a more saturated
    colour; RGB (1, .5, .2) at saturation x1.5 is (1, .25, 0) there, (1, .375, 0) here); the clamp is kept on purpose
    from TF's ``adjust_saturation`` (``tf1_ops.py``), which :func:`distort_hsv` equals and replaced."""

    _transformed_types = (tv_tensors.Image,)

    def __init__(self, hue: float = 0.0, saturation: float = 1.0, exposure: float = 1.0) -> None:
        super().__init__()
        self.hue, self.saturation, self.exposure = hue, saturation, exposure

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        hue = float(torch.empty(()).uniform_(-self.hue, self.hue)) if self.hue else 0.0
        return {"hue": hue, "saturation": rand_scale(self.saturation), "exposure": rand_scale(self.exposure)}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        image = distort_colors(inpt.as_subclass(torch.Tensor), params["hue"], params["saturation"], params["exposure"])
        return tv_tensors.wrap(image, like=inpt)


def _per_box_entries(inputs: Any) -> tuple[torch.Tensor, ...]:
    """The target's tensors indexed like its boxes, for ``SanitizeBoundingBoxes(labels_getter=...)``."""
    target = inputs[1]
    return tuple(target[k] for k in PER_BOX_KEYS if isinstance(target.get(k), torch.Tensor))


def clamp_and_sanitize(min_size: float = 1.0) -> v2.Compose:
    """Clip boxes to the image, then drop those narrower or lower than ``min_size`` pixels together with
    their ``labels`` (and ``iscrowd`` / ``area``): v2.ClampBoundingBoxes + v2.SanitizeBoundingBoxes."""
    return v2.Compose([
        v2.ClampBoundingBoxes(clamping_mode="hard"),
        v2.SanitizeBoundingBoxes(min_size=min_size, labels_getter=_per_box_entries),
    ])


def _image_and_boxes(image: Any, target: Any) -> bool:
    """Whether a sample is a ``tv_tensors.Image`` and a dict whose only TVTensor is its ``boxes`` (XYXY, unrotated),
    with one entry per box in each per-box tensor: what :meth:`TrainTransform._after_directly` takes."""
    if not isinstance(image, tv_tensors.Image) or not isinstance(target, dict):
        return False
    boxes = target.get("boxes")
    if not isinstance(boxes, tv_tensors.BoundingBoxes) or boxes.format != tv_tensors.BoundingBoxFormat.XYXY:
        return False
    for key, value in target.items():
        if key != "boxes" and _holds_tv_tensor(value):
            return False
        if key in PER_BOX_KEYS and isinstance(value, torch.Tensor) and (value.ndim == 0
                                                                         or value.shape[0] != boxes.shape[0]):
            return False
    return True


def _holds_tv_tensor(value: Any) -> bool:
    if isinstance(value, tv_tensors.TVTensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tv_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tv_tensor(v) for v in value)
    return False


def resize_transform(resize: ResizeMode, size: int, max_size: int | None = None) -> v2.Transform:
    """The geometric resize of a pipeline: :class:`ResizeShorterSide`, :class:`Letterbox` or a stretch to
    ``size x size`` (``v2.Resize``)."""
    if resize == "shorter_side":
        return ResizeShorterSide(size, max_size)
    if resize == "letterbox":
        return Letterbox(size)
    if resize == "stretch":
        return v2.Resize((size, size))
    raise ValueError(f"resize must be 'shorter_side', 'letterbox' or 'stretch', got {resize!r}")


class TrainTransform:
    """``(image, target, size=None) -> (image, target)``: crop, colour jitter, resize (to this step's
    ``size``), fixed-size crop, horizontal flip, clamp + sanitize, float32 in [0, 1]. See :func:`train_transform`.
    With ``mosaic``, its :attr:`mosaic` makes the samples it picks of four images (``DetectionDataset`` asks it)."""

    def __init__(self, resize: ResizeMode, size: int, max_size: int | None = None,
                 max_size_ratio: float | None = None, flip: float = 0.5, crop: bool | float = False,
                 crop_prob: float = 0.5, color_jitter: float = 0.0, min_box_size: float = 1.0,
                 crop_size: int | None = None, jitter: float = 0.0, hue: float = 0.0, saturation: float = 1.0,
                 exposure: float = 1.0, mosaic: float = 0.0, mosaic_bound: bool = False, jitter_resize: float = 1.0):
        if max_size is not None and max_size_ratio is not None:
            raise ValueError("give max_size or max_size_ratio, not both")
        resize_transform(resize, size)  # validates the mode
        self.resize, self.size, self.max_size, self.max_size_ratio = resize, size, max_size, max_size_ratio
        before: list[v2.Transform] = []
        if crop:
            fraction = DEFAULT_CROP_FRACTION if crop is True else float(crop)
            before.append(RandomRelativeCrop(fraction, p=crop_prob, min_size=min_box_size))
        if color_jitter:
            # before the letterbox, so the padding stays grey 114
            before.append(v2.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter))
        each_image = list(before)  # a mosaic's images: these, then its own jitter window
        if jitter or jitter_resize != 1.0:
            before.append(DarknetJitter(jitter, jitter_resize))
        self.jitter = jitter or jitter_resize != 1.0  # a window to stretch to the input
        self.before = v2.Compose(before) if before else None
        fixed_crop = [RandomFixedCrop(crop_size, min_size=min_box_size)] if crop_size else []
        after: list[v2.Transform] = list(fixed_crop)
        after += [v2.RandomHorizontalFlip(flip)] if flip else []
        after.append(clamp_and_sanitize(min_box_size))
        color = DarknetColor(hue, saturation, exposure) if hue or saturation != 1.0 or exposure != 1.0 else None
        # the colours make the uint8 image float32 in their own pass, as v2.ToDtype would before them
        after.append(color if color is not None else v2.ToDtype(torch.float32, scale=True))
        self.after = v2.Compose(after)
        # the same steps without v2's per-sample dispatch, where the sample is an image and a dict of boxes
        self.direct = not crop_size
        self.flip, self.min_box_size, self.color = flip, min_box_size, color
        self.mosaic: Mosaic | None = None  # data.mosaic: the dataset makes a sample it picks of four images
        if mosaic:
            self.mosaic = Mosaic(mosaic, size, mosaic_bound, jitter, flip,
                                 before=v2.Compose(each_image) if each_image else None, color=color,
                                 after=v2.Compose([*fixed_crop, clamp_and_sanitize(min_box_size)]),
                                 resize=jitter_resize)

    def max_size_for(self, size: int) -> int | None:
        """The cap on the longer side at shorter side ``size``: fixed ``max_size`` (detectron2 keeps 1333
        for every sampled shorter side), or ``int(size * max_size_ratio + 0.5)`` (the cap scales with
        the multi-scale size), or none."""
        if self.max_size_ratio is not None:
            return _round(size * Fraction(str(self.max_size_ratio)))
        return self.max_size

    def __call__(self, image: Any, target: Target, size: int | None = None) -> tuple[Any, Target]:
        size = self.size if size is None else size
        if self.before is not None:
            image, target = self.before(image, target)
        direct = self.direct and _image_and_boxes(image, target)
        if self.jitter and direct:  # v2.Resize's kernels, called without its dispatch
            image, target = F.resize(image, [size, size]), {**target, "boxes": F.resize(target["boxes"], [size, size])}
        elif self.jitter:  # Darknet stretches the jittered window to the input (letter_box=0)
            image, target = v2.Resize((size, size))(image, target)
        else:
            image, target = resize_transform(self.resize, size, self.max_size_for(size))(image, target)
        return self._after_directly(image, target) if direct else self.after(image, target)

    def _after_directly(self, image: tv_tensors.Image, target: Target) -> tuple[Any, Target]:
        """:attr:`after` (flip, clamp + sanitize, float32 and the colours) by the torchvision kernels its transforms
        call, in its order and with its draws, but without v2's dispatch over the sample's tree for each transform,
        which took more time than the kernels at 128 px (``tests/data/test_det_transforms.py`` compares the two)."""
        boxes = target["boxes"]
        if self.flip and not bool(torch.rand(1) >= self.flip):  # v2's _RandomApplyTransform draw
            image, boxes = F.horizontal_flip(image), F.horizontal_flip(boxes)
        boxes, valid = F.sanitize_bounding_boxes(F.clamp_bounding_boxes(boxes, clamping_mode="hard"),
                                                 min_size=self.min_box_size)
        target = {**target, "boxes": boxes}
        for key in PER_BOX_KEYS:
            if isinstance(target.get(key), torch.Tensor):
                target[key] = target[key].as_subclass(torch.Tensor)[valid]
        if self.color is not None:
            return self.color.transform(image, self.color.make_params([image])), target
        return F.to_dtype(image, torch.float32, scale=True), target


def train_transform(resize: ResizeMode, size: int, max_size: int | None = None,
                    max_size_ratio: float | None = None, flip: float = 0.5, crop: bool | float = False,
                    crop_prob: float = 0.5, color_jitter: float = 0.0, min_box_size: float = 1.0,
                    crop_size: int | None = None, jitter: float = 0.0, hue: float = 0.0, saturation: float = 1.0,
                    exposure: float = 1.0, mosaic: float = 0.0, mosaic_bound: bool = False,
                    jitter_resize: float = 1.0) -> TrainTransform:
    """The training pipeline, a callable ``(image, target, size=None) -> (image, target)``.

    In order: :class:`RandomRelativeCrop` with probability ``crop_prob`` (``crop``: ``False`` none,
    ``True`` sides ``U(0.5, 1)``, a float ``f`` sides ``U(f, 1)``); ``v2.ColorJitter`` of brightness,
    contrast and saturation ``color_jitter`` (MegDet: 0.4); the resize to ``size`` (the step's multi-scale
    size; default the ``size`` given here): ``"shorter_side"`` with the longer side capped by ``max_size``
    (fixed, detectron2) or ``size * max_size_ratio`` (MegDet 1333 / 800, scaling with the size), or
    ``"letterbox"`` or ``"stretch"`` to ``size x size``; with ``crop_size``, :class:`RandomFixedCrop` (MegDet's
    800 x 800);
    ``v2.RandomHorizontalFlip(flip)``; :func:`clamp_and_sanitize` (boxes under ``min_box_size`` pixels
    dropped with their labels); ``v2.ToDtype(float32, scale=True)``. Darknet's options: with ``jitter`` (and
    ``jitter_resize``, AlexeyAB's ``[yolo] resize``, also on each of a mosaic's images), :class:`DarknetJitter`
    after the colour jitter, and the window stretched to ``size x size`` in place of the resize, whatever
    ``resize`` (Darknet's ``letter_box=1`` first widens the window to the input's shape: not followed); with ``hue``,
    ``saturation`` or ``exposure``, :class:`DarknetColor` last, in place of the ``ToDtype`` (it makes the uint8
    image float32 in its own pass, as ``ToDtype`` would). For an image and a dict of XYXY boxes the steps after
    the resize run as torchvision's kernels, without v2's dispatch: the same samples.

    With ``mosaic`` (a probability), the transform carries a :class:`~bigbatch.data.transforms.mosaic.Mosaic` (its
    ``mosaic`` attribute), with which the training dataset makes a sample of four images, ``size x size``: AlexeyAB's
    mosaic (``mosaic_bound``: boxes clipped to their quadrant), each image through the crop and colour jitter, then its
    own jitter window, flip and Darknet colours; the mosaic through the fixed-size crop and the clamp + sanitize.
    """
    return TrainTransform(resize, size, max_size, max_size_ratio, flip, crop, crop_prob, color_jitter,
                          min_box_size, crop_size, jitter, hue, saturation, exposure, mosaic, mosaic_bound,
                          jitter_resize)


class EvalTransform:
    """``(image, target, size=None) -> (image, target)``: the deterministic resize and ``ToDtype``; records
    in the target what :func:`boxes_to_original` needs. See :func:`eval_transform`."""

    def __init__(self, resize: ResizeMode, size: int, max_size: int | None = None):
        resize_transform(resize, size)  # validates the mode
        self.resize, self.size, self.max_size = resize, size, max_size
        self.to_float = v2.ToDtype(torch.float32, scale=True)

    def __call__(self, image: Any, target: Target, size: int | None = None) -> tuple[Any, Target]:
        size = self.size if size is None else size
        height, width = F.get_size(image)
        if self.resize == "letterbox":
            new_h, new_w, top, left = letterbox_geometry(height, width, size)
        elif self.resize == "stretch":
            new_h, new_w, top, left = size, size, 0, 0
        else:
            (new_h, new_w), top, left = shorter_side_size(height, width, size, self.max_size), 0, 0
        image, target = resize_transform(self.resize, size, self.max_size)(image, target)
        target = dict(target)
        target.setdefault("orig_size", (height, width))
        target["image_region"] = (top, left, new_h, new_w)
        return self.to_float(image), target


def eval_transform(resize: ResizeMode, size: int, max_size: int | None = None) -> EvalTransform:
    """The evaluation pipeline: resize (``"shorter_side"`` capped by ``max_size``, ``"letterbox"`` or
    ``"stretch"``), no
    augmentation, float32 in [0, 1]. Boxes follow but are neither clipped nor dropped. The target gains
    ``image_region = (top, left, height, width)``, where the resized original lies in the network input,
    and ``orig_size = (H, W)`` of the image given, unless the dataset already set it (it must then be that
    same size)."""
    return EvalTransform(resize, size, max_size)


def boxes_to_original(boxes: torch.Tensor, target: Target) -> torch.Tensor:
    """Map XYXY boxes [N, 4] predicted on an :func:`eval_transform` output back to the original image:
    undo the padding (``v2.functional.crop`` to ``image_region``, clipping to it), then the scale
    (``v2.functional.resize`` of that region to ``orig_size``): ``x = (x' - left) * W / new_w``, likewise
    y. The result lies within the original image."""
    top, left, height, width = (int(v) for v in target["image_region"])
    orig_h, orig_w = (int(v) for v in target["orig_size"])
    canvas = (top + height, left + width)
    wrapped = tv_tensors.BoundingBoxes(boxes.reshape(-1, 4), format="XYXY", canvas_size=canvas,
                                       clamping_mode="hard")
    region = F.crop(wrapped, top, left, height, width)  # shifts by (left, top) and clips ("hard" clamping)
    return F.resize(region, [orig_h, orig_w]).as_subclass(torch.Tensor)
