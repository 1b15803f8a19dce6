"""The preprocessings of ``data.preprocessing`` in crop-first form (``data/folder.py``'s ``CropFirst``): the crop
box is chosen from the image's size, the file decoded only as finely as the output needs, then finished.

``inception``: the Inception v3 TPU code's preprocessing (``data/inception.py``): a distorted bounding-box crop,
resized to size x size, flipped, colour-distorted, scaled to [-1, 1]; for evaluation TF's central crop of
87.5 %. ``standard``: torchvision's ImageNet recipe: ``RandomResizedCrop(size)`` (scale 0.08-1, ratio 3/4-4/3)
and a flip, normalised with ImageNet's mean and std; for evaluation the shorter side resized to size / 0.875
and the centre size x size crop.

Randomness comes from torch's global RNG, which the dataset seeds per sample.
"""

from __future__ import annotations

import math

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from bigbatch.data.inception import IMAGENET_MEAN, IMAGENET_STD, InceptionEval, InceptionTrain

EVAL_FRACTION = 0.875
"""torchvision's reference: resize to size / 0.875 (256 for 224), keep the centre size x size."""


class InceptionTrainCrop:
    def __init__(self, size: int) -> None:
        self.size = size
        self.rest = InceptionTrain(size)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return self.rest.sample_box(height, width)

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size  # the crop is resized to size x size, aspect ignored

    def finish(self, crop: torch.Tensor) -> torch.Tensor:
        return self.rest.after_crop(crop)


class InceptionEvalCrop:
    def __init__(self, size: int) -> None:
        self.size = size
        self.eval = InceptionEval(size)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return self.eval.crop_box(height, width)

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size

    def finish(self, crop: torch.Tensor) -> torch.Tensor:
        return self.eval.after_crop(crop)


def _normalised(image: torch.Tensor) -> torch.Tensor:
    return TF.normalize(TF.to_dtype(image, torch.float32, scale=True), IMAGENET_MEAN, IMAGENET_STD)


class StandardTrainCrop:
    def __init__(self, size: int) -> None:
        self.size = size
        self.crop = v2.RandomResizedCrop(size, antialias=True)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """torchvision's ``RandomResizedCrop`` box (uniform area in scale x image, log-uniform ratio; 10 tries,
        then a centre crop), drawn from the image's size alone."""
        params = self.crop.make_params([torch.empty(1, height, width).expand(3, height, width)])
        return params["top"], params["left"], params["height"], params["width"]

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.size, self.size

    def finish(self, crop: torch.Tensor) -> torch.Tensor:
        image = TF.resize(crop, [self.size, self.size], antialias=True)
        if torch.rand(1).item() < 0.5:
            image = TF.horizontal_flip(image)
        return _normalised(image)


class StandardEvalCrop:
    def __init__(self, size: int) -> None:
        self.size = size
        self.resized = int(size / EVAL_FRACTION)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return 0, 0, height, width  # the whole image: resized, then its centre kept

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        shorter = min(box_height, box_width)  # the shorter side becomes ``resized``
        return math.ceil(box_height * self.resized / shorter), math.ceil(box_width * self.resized / shorter)

    def finish(self, crop: torch.Tensor) -> torch.Tensor:
        image = TF.center_crop(TF.resize(crop, self.resized, antialias=True), [self.size, self.size])
        return _normalised(image)
