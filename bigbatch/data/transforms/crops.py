"""The preprocessings of ``data.preprocessing`` in crop-first form (``data/formats/encoded_images.py``'s
``CropFirst``): the crop box is chosen from the image's size, the file decoded only as finely as the output needs,
then finished.

``inception``: the Inception v3 TPU code's preprocessing (``data/transforms/inception.py``): a distorted bounding-box
crop, resized to size x size, flipped, colour-distorted, scaled to [-1, 1]; for evaluation TF's central crop of 87.5 %.
``standard``: torchvision's and timm's ImageNet recipe with the keys of ``data.standard`` (timm's ``train.py`` flags):
``RandomResizedCrop(size, scale, ratio)`` (defaults 0.08-1, 3/4-4/3; bilinear, bicubic, or one of the two at random per
image as timm's ``random``), a horizontal flip with probability ``hflip``, an optional ``ColorJitter(color_jitter,
color_jitter, color_jitter)``, normalised with ImageNet's mean and std; for evaluation the shorter side resized to size
/ ``crop_pct`` (0.875: 256 for 224) and the centre size x size crop.

Randomness comes from torch's global RNG, which the dataset seeds per sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from bigbatch.config.data_keys import StandardAugment
from bigbatch.data.transforms.inception import InceptionEval, InceptionTrain
from bigbatch.data.transforms.standard import IMAGENET_MEAN, IMAGENET_STD

INTERPOLATIONS = (TF.InterpolationMode.BILINEAR, TF.InterpolationMode.BICUBIC)


def into(image: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``image``, or copied into ``out`` (its slot in a batch: ``data/formats/folder.py``'s
    ``EncodedImages.__getitems__``)."""
    return image if out is None else out.copy_(image)


class InceptionTrainCrop:
    def __init__(self, size: int, fast: bool = False) -> None:
        self.size, self.fast = size, fast
        self.rest = InceptionTrain(size)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return self.rest.sample_box(height, width)

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size  # the crop is resized to size x size, aspect ignored

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.fast:
            return self.rest.after_crop_fast(crop, out=out)
        return into(self.rest.after_crop(crop), out)

    def planned_finish(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        """``finish`` with its draws made now (flip, colours): the work, which draws nothing, may run in another
        thread (``EncodedImages``' threaded batches)."""
        params = self.rest.draw_params()
        return lambda crop, out=None: self.rest.after_crop_drawn(crop, params, self.fast, out)


class InceptionEvalCrop:
    def __init__(self, size: int, fast: bool = False) -> None:
        self.size, self.fast = size, fast
        self.eval = InceptionEval(size)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return self.eval.crop_box(height, width)

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.fast:
            return self.eval.after_crop_fast(crop, out=out)
        return into(self.eval.after_crop(crop), out)

    def planned_finish(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        return self.finish  # draws nothing


def _normalised(image: torch.Tensor) -> torch.Tensor:
    return TF.normalize(TF.to_dtype(image, torch.float32, scale=True), IMAGENET_MEAN, IMAGENET_STD)


class StandardTrainCrop:
    def __init__(self, size: int, augment: StandardAugment | None = None, fast: bool = False) -> None:
        self.size, self.fast = size, fast
        self.augment = augment = augment or StandardAugment()
        self.crop = v2.RandomResizedCrop(size, scale=tuple(augment.scale), ratio=tuple(augment.ratio),
                                         antialias=True)
        jitter = augment.color_jitter
        self.jitter = v2.ColorJitter(jitter, jitter, jitter) if jitter > 0 else None

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """torchvision's ``RandomResizedCrop`` box (uniform area in scale x image, log-uniform ratio; 10 tries,
        then a centre crop), drawn from the image's size alone."""
        params = self.crop.make_params([torch.empty(1, height, width).expand(3, height, width)])
        return params["top"], params["left"], params["height"], params["width"]

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.planned_finish()(crop, out)

    def planned_finish(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        """``finish`` with its draws made now, in its order (the interpolation where it is ``random``, the flip, the
        colour jitter's order and factors): the work, which draws nothing, may run in another thread
        (``EncodedImages``' threaded batches)."""
        chosen = self.augment.interpolation
        mode = INTERPOLATIONS[int(torch.randint(2, ()))] if chosen == "random" else TF.InterpolationMode[chosen.upper()]
        flip = torch.rand(1).item() < self.augment.hflip
        jitter = None if self.jitter is None else self.jitter.make_params([])  # its draws take nothing of the image

        def finish(crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            image = TF.resize(crop, [self.size, self.size], interpolation=mode, antialias=True)
            if flip:
                image = TF.horizontal_flip(image)
            if jitter is not None:
                image = self.jitter.transform(image, jitter)
            return into(_normalised(image), out)
        return finish


class StandardEvalCrop:
    def __init__(self, size: int, crop_pct: float = 0.875, fast: bool = False) -> None:
        self.size, self.fast = size, fast
        self.resized = math.floor(size / crop_pct)  # timm's and torchvision's rule: 256 for 224 at 0.875

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return 0, 0, height, width  # the whole image: resized, then its centre kept

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        shorter = min(box_height, box_width)  # the shorter side becomes ``resized``
        return math.ceil(box_height * self.resized / shorter), math.ceil(box_width * self.resized / shorter)

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        image = TF.center_crop(TF.resize(crop, self.resized, antialias=True), [self.size, self.size])
        return into(_normalised(image), out)

    def planned_finish(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        return self.finish  # draws nothing
