"""AlexeyAB Darknet's mosaic: one training sample made of four images, one in each quadrant around a random cut point.

The source is ``load_data_detection`` in AlexeyAB's ``src/data.c`` (the OpenCV build), the branch ``use_mixup == 3``
that ``[net] mosaic=1`` selects (``parse_net_options``: ``net->mixup = 3``), with ``image_data_augmentation``
(``src/image_opencv.cpp``) and ``blend_truth_mosaic`` (``src/data.c``). For a network input of ``w x h``:

- the cut point: ``cut_x = rand_int(w * 0.2, w * 0.8)``, ``cut_y = rand_int(h * 0.2, h * 0.8)``, integers drawn
  uniformly, both ends included (``min_offset = 0.2``); quadrant 0 is ``[0, cut_x) x [0, cut_y)`` (top left), 1 top
  right, 2 bottom left, 3 bottom right.
- each quadrant's image ``ow x oh`` is jitter-cropped as without mosaic: ``dw = int(ow * jitter)``,
  ``dh = int(oh * jitter)``, ``pleft, pright = int(U(-dw, dw))`` and ``ptop, pbot = int(U(-dh, dh))`` (each side
  moved in, or out), then, with ``[yolo] resize`` (``data.jitter_resize``), each side by a further zoom, as without
  mosaic (``zoom.zoomed_sides``; a window left empty is the whole image); it is flipped with even odds
  (``use_flip``); with even odds again the image is moved "to the corner, so that most of it is visible": the
  offsets of its two outer sides (left and top for quadrant 0, right and top for 1, ...; mirrored when it is flipped)
  are added to the opposite sides and set to 0. The window
  ``(pleft, ptop, ow - pleft - pright, oh - ptop - pbot)`` is cropped (outside the image: the image's mean colour,
  ``cv::mean``), stretched to ``w x h``, flipped, and its colour distorted (HSV).
- the shifts skip the padded margin of the stretched image on the sides facing the cut, measured as Darknet measures
  it, with ``w / ow`` (after a flip ``pleft`` and ``pright`` are swapped first)::

      left_shift  = min(cut_x,     max(0, floor(-pleft * w / ow)))
      right_shift = min(w - cut_x, max(0, floor(-pright * w / ow)))
      top_shift   = min(cut_y,     max(0, floor(-ptop * h / oh)))
      bot_shift   = min(h - cut_y, max(0, floor(-pbot * h / oh)))

- each quadrant takes the stretched image's pixels ``[x0, x0 + qw) x [y0, y0 + qh)``: ``x0 = w - cut_x -
  right_shift`` in the left column (the image's right part), ``x0 = left_shift`` in the right column, ``y0 = h - cut_y
  - bot_shift`` in the top row, ``y0 = top_shift`` in the bottom row.
- boxes (``blend_truth_mosaic``) move by the same offset as the pixels (the quadrant's origin minus ``(x0, y0)``);
  with ``mosaic_bound=1`` they are clipped to their quadrant, otherwise (the default) only to the image, so a box
  may reach over a neighbouring quadrant's pixels; a box left no wider or taller than one input pixel is dropped
  (``lowest_w = 1 / net_w``).
- Darknet flips its coin (``random_gen() % 2 == 0``: no mosaic) once per call of ``load_data_detection``, for each
  loader thread's share of the batch; half of the images are mosaics on average.

bigbatch: ``data.mosaic`` is the probability that a training sample is a mosaic, drawn per sample (``mosaic=1`` in a
``.cfg`` is 0.5); quadrant 0 holds the sample's own image, the three others are drawn uniformly from the training set
(with replacement), every draw from the sample's seed (``data/pipeline/order.py``). Boxes move through torchvision's
kernels (crop, resize, flip, pad) in exact coordinates, where Darknet truncates the edges of a clipped box to whole
pixels; the stretch is torchvision's antialiased bilinear resize (Darknet: ``cv::INTER_LINEAR``); boxes narrower or
lower than ``min_box_size`` (1 px) are dropped (Darknet: not wider than 1 px). The MegDet keys apply too: ``crop`` and
``color_jitter`` to each image before its window, ``crop_size`` to the mosaic. Evaluation never uses mosaic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from bigbatch.data.transforms.zoom import zoomed_sides

Sample = tuple[tv_tensors.Image, dict[str, Any]]
Stage = Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]]

MIN_OFFSET_PERCENT = 20  # Darknet's min_offset = 0.2: the cut point lies in [0.2, 0.8] of each side
PIECES = 4
PER_BOX_KEYS = ("labels", "iscrowd", "area")


def draw_cut(height: int, width: int) -> tuple[int, int]:
    """``(cut_y, cut_x)``: ``cut_x = rand_int(int(0.2 w), int(0.8 w))`` (both ends included), likewise ``cut_y``
    (AlexeyAB ``load_data_detection``)."""
    low_y, high_y = height * MIN_OFFSET_PERCENT // 100, height * (100 - MIN_OFFSET_PERCENT) // 100
    low_x, high_x = width * MIN_OFFSET_PERCENT // 100, width * (100 - MIN_OFFSET_PERCENT) // 100
    cut_x = int(torch.randint(low_x, high_x + 1, ()))
    cut_y = int(torch.randint(low_y, high_y + 1, ()))
    return cut_y, cut_x


@dataclass(frozen=True)
class PiecePlan:
    """Where one image goes: its jitter ``window`` ``(top, left, height, width)`` on the image (may reach outside it),
    whether the stretched window is flipped, and the rectangle ``(top, left, height, width)`` of the stretched image
    copied into the mosaic at ``(dst_top, dst_left)``."""

    window: tuple[int, int, int, int]
    flip: bool
    src: tuple[int, int, int, int]
    dst_top: int
    dst_left: int


@dataclass(frozen=True)
class MosaicPlan:
    """The random part of one mosaic: its ``size`` ``(h, w)``, the cut point ``(cut_y, cut_x)`` and each quadrant's
    :class:`PiecePlan`, quadrant ``k`` in the top (``k < 2``) or bottom row, left (``k`` even) or right column."""

    size: tuple[int, int]
    cut: tuple[int, int]
    pieces: tuple[PiecePlan, ...]

    def quadrant(self, k: int) -> tuple[int, int, int, int]:
        """Quadrant ``k`` as ``(top, left, height, width)``."""
        return quadrant(k, self.size, self.cut)


def quadrant(k: int, size: tuple[int, int], cut: tuple[int, int]) -> tuple[int, int, int, int]:
    """Quadrant ``k`` of a mosaic of ``size`` ``(h, w)`` cut at ``(cut_y, cut_x)``, as ``(top, left, height, width)``:
    0 top left, 1 top right, 2 bottom left, 3 bottom right."""
    (h, w), (cut_y, cut_x) = size, cut
    top, height = (0, cut_y) if k < 2 else (cut_y, h - cut_y)
    left, width = (0, cut_x) if k % 2 == 0 else (cut_x, w - cut_x)
    return top, left, height, width


def _side_offset(d: int) -> int:
    """``int(U(-d, d))``: Darknet's ``rand_precalc_random(-d, d, r)`` stored in an int (truncated towards zero)."""
    return int(float(torch.rand(())) * 2 * d - d)


def _shift(offset: int, out: int, side: int, limit: int) -> int:
    """``min(limit, max(0, -offset * out / side))`` in C's integer arithmetic: the padded margin skipped."""
    return min(limit, max(0, (-offset * out) // side)) if offset < 0 else 0


def draw_piece(k: int, image_size: tuple[int, int], size: tuple[int, int], cut: tuple[int, int], jitter: float,
               flip: float, resize: float = 1.0) -> PiecePlan:
    """The :class:`PiecePlan` of quadrant ``k`` for an image of ``image_size`` ``(oh, ow)`` in a mosaic of ``size``
    ``(h, w)`` cut at ``cut``: the jitter window (and ``resize``'s zoom), the flip (probability ``flip``), the move to
    the corner (even odds) and the shifts, as the module docstring's formulas."""
    (oh, ow), (h, w), (cut_y, cut_x) = image_size, size, cut
    dw, dh = int(ow * jitter), int(oh * jitter)
    pleft, pright, ptop, pbot = (_side_offset(d) for d in (dw, dw, dh, dh))
    if resize != 1.0:
        zoom = torch.rand(2).tolist()
        pleft, pright, ptop, pbot = zoomed_sides(oh, ow, resize, (pleft, pright, ptop, pbot), *zoom)
    flipped = flip > 0 and float(torch.rand(())) < flip
    # the offsets as seen on the stretched, flipped image (Darknet swaps pleft and pright after a flip)
    left, right = (pright, pleft) if flipped else (pleft, pright)
    if float(torch.rand(())) < 0.5:  # "move each 2nd image to the corner": the outer sides keep no offset
        if k % 2 == 0:
            left, right = 0, right + left
        else:
            left, right = left + right, 0
        if k < 2:
            top, bottom = 0, pbot + ptop
        else:
            top, bottom = ptop + pbot, 0
        ptop, pbot = top, bottom
    pleft, pright = (right, left) if flipped else (left, right)
    if ow - pleft - pright <= 0 or oh - ptop - pbot <= 0 or ow - pleft <= 0 or oh - ptop <= 0:
        pleft = pright = ptop = pbot = left = right = 0  # Darknet's "invalid resize": the whole image
    window = (ptop, pleft, oh - ptop - pbot, ow - pleft - pright)
    left_shift = _shift(left, w, ow, cut_x)
    right_shift = _shift(right, w, ow, w - cut_x)
    top_shift = _shift(ptop, h, oh, cut_y)
    bot_shift = _shift(pbot, h, oh, h - cut_y)
    src_left = w - cut_x - right_shift if k % 2 == 0 else left_shift  # the left column shows the image's right part
    src_top = h - cut_y - bot_shift if k < 2 else top_shift  # the top row its bottom part
    dst_top, dst_left, height, width = quadrant(k, size, cut)
    return PiecePlan(window, flipped, (src_top, src_left, height, width), dst_top, dst_left)


def draw_plan(image_sizes: Sequence[tuple[int, int]], size: tuple[int, int], jitter: float, flip: float,
              resize: float = 1.0) -> MosaicPlan:
    """The cut point, then each quadrant's :class:`PiecePlan` in order, drawn from torch's RNG."""
    cut = draw_cut(*size)
    return MosaicPlan(size, cut, tuple(draw_piece(k, image_sizes[k], size, cut, jitter, flip, resize)
                                       for k in range(PIECES)))


def crop_with_mean(image: torch.Tensor, window: tuple[int, int, int, int]) -> torch.Tensor:
    """The ``window`` ``(top, left, height, width)`` of a uint8 ``[3, H, W]`` image; where it reaches outside the
    image, the image's mean colour, rounded (``image_data_augmentation``: ``cropped.setTo(cv::mean(img))``)."""
    top, left, height, width = window
    mean = image.float().mean(dim=(-2, -1)).round().to(image.dtype)
    out = mean.view(-1, 1, 1).expand(-1, height, width).clone()
    y0, x0 = max(0, top), max(0, left)
    y1, x1 = min(image.shape[-2], top + height), min(image.shape[-1], left + width)
    if y1 > y0 and x1 > x0:
        out[:, y0 - top:y1 - top, x0 - left:x1 - left] = image[:, y0:y1, x0:x1]
    return out


def _per_box(targets: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The per-box entries every target holds, concatenated (an entry some lack is left out)."""
    keys = [k for k in PER_BOX_KEYS if all(isinstance(t.get(k), torch.Tensor) for t in targets)]
    return {k: torch.cat([t[k] for t in targets]) for k in keys}


def compose(samples: Sequence[Sample], plan: MosaicPlan, bound: bool = False,
            color: Callable[[tv_tensors.Image], tv_tensors.Image] | None = None) -> Sample:
    """The mosaic of four ``(image, target)`` (uint8 images, XYXY boxes) laid out by ``plan``: a float32 image in
    [0, 1] of ``plan.size`` and the target of ``samples[0]`` with every image's boxes, moved as their pixels, clipped to
    their quadrant (``bound``, Darknet's ``mosaic_bound=1``) or to the image. ``color`` distorts each image's colours
    (its own draw), as Darknet does to each stretched image. Boxes left without area are dropped by the caller's
    sanitize (``det_transforms.clamp_and_sanitize``); here they are only clipped."""
    h, w = plan.size
    canvas = torch.empty(3, h, w, dtype=torch.float32)
    boxes, problems = [], []
    for piece, (image, target) in zip(plan.pieces, samples, strict=True):
        pixels = crop_with_mean(image.as_subclass(torch.Tensor), piece.window)
        moved = F.crop(target["boxes"], *piece.window)  # shifted to the window, clipped to it
        pixels, moved = F.resize(pixels, [h, w], antialias=True), F.resize(moved, [h, w])
        if piece.flip:
            pixels, moved = F.horizontal_flip(pixels), F.horizontal_flip(moved)
        src_top, src_left, height, width = piece.src
        region = tv_tensors.Image(pixels[:, src_top:src_top + height, src_left:src_left + width])
        region = F.to_dtype(region, torch.float32, scale=True)
        if color is not None:  # per pixel: the same on the region as on the whole stretched image
            region = color(region)
        canvas[:, piece.dst_top:piece.dst_top + height, piece.dst_left:piece.dst_left + width] = region
        if bound:  # the pixels' region, then moved to the quadrant
            moved = F.crop(moved, src_top, src_left, height, width)
            moved = F.pad(moved, [piece.dst_left, piece.dst_top, w - piece.dst_left - width,
                                  h - piece.dst_top - height])
        else:  # moved by the same offset over the whole image, clipped to it
            moved = F.crop(moved, src_top - piece.dst_top, src_left - piece.dst_left, h, w)
        boxes.append(moved.as_subclass(torch.Tensor))
        problems += target.get("data_problems", [])
    main = samples[0][1]
    out = {k: v for k, v in main.items() if k not in PER_BOX_KEYS and k != "data_problems"}
    out["boxes"] = tv_tensors.BoundingBoxes(torch.cat(boxes), format=tv_tensors.BoundingBoxFormat.XYXY,
                                            canvas_size=(h, w))
    out.update(_per_box([t for _, t in samples]))
    if problems:
        out["data_problems"] = problems
    return tv_tensors.Image(canvas), out


class Mosaic:
    """A training transform's mosaic (``data.mosaic``, ``data.mosaic_bound``): :meth:`chosen` says whether this sample
    is one, :meth:`partners` draws the other three images, and the call makes it (``DetectionDataset`` does the three,
    under the sample's seed).

    ``before``: each image's own transforms before its window (MegDet's ``crop``, ``color_jitter``); ``color``: each
    stretched image's colour distortion (Darknet's ``hue``, ``saturation``, ``exposure``); ``after``: the mosaic's
    (``crop_size``, then clip and drop the boxes under ``min_box_size``)."""

    def __init__(self, p: float, size: int, bound: bool = False, jitter: float = 0.0, flip: float = 0.5,
                 before: Stage | None = None, color: v2.Transform | None = None, after: Stage | None = None,
                 resize: float = 1.0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"mosaic probability must be in [0, 1], got {p}")
        if not 0.0 <= jitter < 0.5:
            raise ValueError(f"jitter must be in [0, 0.5), got {jitter}")
        self.p, self.size, self.bound, self.jitter, self.flip = p, size, bound, jitter, flip
        self.resize = resize  # AlexeyAB's [yolo] resize: each image's window zoomed as without mosaic
        self.before, self.color, self.after = before, color, after

    def chosen(self) -> bool:
        """Whether this sample is a mosaic: probability ``p`` (no draw at 0 or 1)."""
        return self.p >= 1.0 or (self.p > 0.0 and float(torch.rand(())) < self.p)

    def partners(self, count: int) -> list[int]:
        """The dataset indices of quadrants 1-3, uniform over ``count`` records (with replacement)."""
        return [int(i) for i in torch.randint(count, (PIECES - 1,))]

    def __call__(self, samples: Sequence[Sample], size: int | None = None) -> Sample:
        size = self.size if size is None else size
        if self.before is not None:
            samples = [self.before(image, target) for image, target in samples]
        plan = draw_plan([tuple(F.get_size(image)) for image, _ in samples], (size, size), self.jitter, self.flip,
                         self.resize)
        image, target = compose(samples, plan, self.bound, self.color)
        return self.after(image, target) if self.after is not None else (image, target)
