"""Darknet's classifier augmentation (``data.preprocessing: darknet``, ``data.darknet``), in crop-first form.

Data-side code, as ``det_transforms.DarknetColor`` is: the folder and shard formats use it with any classifier;
nothing here reads a ``.cfg`` (``darknet/recipe.py`` fills ``data.darknet`` from one).

Training, as AlexeyAB's ``load_data_augment`` -> ``random_augment_image`` (src/data.c, src/image.c), on an image of
``H x W`` for a ``size x size`` input: an aspect ``a = rand_scale(aspect)`` (``u ~ U[1, aspect]``, then ``u`` or
``1 / u``), a scale ``s = r / min(H, W * a)`` with ``r`` uniform in ``[min_crop, max_crop] * size`` (Darknet's
``min_crop``/``max_crop`` are pixels at the cfg's width; here fractions of the input size, so that a reduced
``data.size`` keeps the cfg's augmentation), a window of ``size * a / s x size / s`` source pixels centred at the
image's centre moved by ``dx ~ U(+-(W s / a - size) / 2)``, ``dy ~ U(+-(H s - size) / 2)`` output pixels (clamped to
the image), resized to ``size x size``, rotated by ``U(-angle, angle)`` degrees (torchvision's rotation of the crop
about its centre, where Darknet rotates the sampling grid: the same distribution of views), flipped with
probability 1/2 (``flip``), then Darknet's colour distortion (``hue``, ``saturation``, ``exposure``:
``det_transforms.DarknetColor``). Evaluation, as ``validate_classifier_single`` (src/classifier.c): the shorter side
resized to ``size``, the centre ``size x size`` kept. Pixels are RGB in [0, 1], as Darknet feeds its networks (no
mean or deviation is subtracted).
"""

from __future__ import annotations

import math

import torch
import torchvision.transforms.v2.functional as TF

from bigbatch.config.data_keys import DarknetAugment
from bigbatch.data.transforms.crops import into


def rand_scale(s: float) -> float:
    from bigbatch.data.transforms.det_transforms import rand_scale as darknet_rand_scale

    return darknet_rand_scale(s)


class DarknetTrainCrop:
    """The training crop (the module's formula); ``box`` draws the window, ``finish`` the rest."""

    def __init__(self, size: int, augment: DarknetAugment, fast: bool = False) -> None:
        from bigbatch.data.transforms.det_transforms import DarknetColor

        self.size, self.augment, self.fast = size, augment, fast
        self.color = DarknetColor(augment.hue, augment.saturation, augment.exposure)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        size, augment = self.size, self.augment
        a = rand_scale(augment.aspect)
        low, high = augment.min_crop * size, augment.max_crop * size
        r = low + float(torch.rand(())) * (high - low)
        s = r / min(height, width * a)
        box_w, box_h = min(width, size * a / s), min(height, size / s)
        dx = (width * s / a - size) / 2
        dy = (height * s - size) / 2
        cx = width / 2 + float(torch.empty(()).uniform_(-abs(dx), abs(dx))) * a / s
        cy = height / 2 + float(torch.empty(()).uniform_(-abs(dy), abs(dy))) / s
        left = min(max(0.0, cx - box_w / 2), width - box_w)
        top = min(max(0.0, cy - box_h / 2), height - box_h)
        h, w = max(1, round(box_h)), max(1, round(box_w))
        return min(int(top), height - h), min(int(left), width - w), h, w

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        image = TF.to_dtype(TF.resize(crop, [self.size, self.size], antialias=True), torch.float32, scale=True)
        if self.augment.angle:
            image = TF.rotate(image, float(torch.empty(()).uniform_(-self.augment.angle, self.augment.angle)),
                              interpolation=TF.InterpolationMode.BILINEAR)
        if self.augment.flip and float(torch.rand(())) < 0.5:
            image = TF.horizontal_flip(image)
        return into(self.color(image), out)


class DarknetEvalCrop:
    """The evaluation crop: the shorter side to ``size`` (the longer truncated, as ``resize_min``), the centre kept at
    Darknet's offset ``((h - size) // 2, (w - size) // 2)``: ``validate_classifier_single`` crops at ``(resized.w -
    net.w)/2`` in C's integer division, where torchvision's ``center_crop`` rounds (a pixel apart for odd margins). In
    [0, 1]."""

    def __init__(self, size: int, fast: bool = False) -> None:
        self.size, self.fast = size, fast

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return 0, 0, height, width

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        shorter = min(box_height, box_width)
        return (math.ceil(box_height * self.size / shorter), math.ceil(box_width * self.size / shorter))

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        image = TF.resize(crop, self.size, antialias=True)
        height, width = image.shape[-2:]
        image = TF.crop(image, (height - self.size) // 2, (width - self.size) // 2, self.size, self.size)
        return into(TF.to_dtype(image, torch.float32, scale=True), out)
