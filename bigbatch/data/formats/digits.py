"""scikit-learn's handwritten digits as a small RGB image classification set.

1,797 real 8x8 grey images of the digits 0-9 ship with scikit-learn (UCI optical recognition
of handwritten digits, test part). They are upscaled (bilinear) to ``size`` px, copied into
three channels and standardised. The held-out split is fixed (20 %, stratified, split seed 0),
independent of the run's seed, so every run is judged on the same 360 images.

The ``digits`` classification format of ``registry.DATASETS``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from bigbatch.config.data_keys import detection_keys_unset
from bigbatch.data.pipeline.loader import TensorImages
from bigbatch.registry import DATASETS

if TYPE_CHECKING:
    from bigbatch.config import RunConfig

NUM_CLASSES = 10
TOTAL_IMAGES = 1797
"""Images in scikit-learn's digits set (train and val together)."""
VAL_FRACTION = 0.2
SPLIT_SEED = 0


def _upscale(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 64) values 0..16 -> (N, 1, size, size) grey images in [0, 1]."""
    grey = (pixels.view(-1, 1, 8, 8) / 16.0).float()
    return F.interpolate(grey, size=(size, size), mode="bilinear", align_corners=False)


def load_digits_split(size: int) -> tuple[TensorImages, TensorImages]:
    """(train, val) datasets of the fixed split, standardised with the training images' mean and std.

    Each set is held once, as grey images; the three RGB channels are a view of them (``expand``), so a
    micro-batch is the only RGB copy ever made (``TensorImages`` indexes the view).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_idx, val_idx = train_test_split(
        range(len(digits.target)), test_size=VAL_FRACTION, random_state=SPLIT_SEED, stratify=digits.target
    )
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    pixels = torch.as_tensor(digits.data, dtype=torch.float32)
    train, val = _upscale(pixels[train_idx], size), _upscale(pixels[val_idx], size)
    mean, std = train.mean(), train.std()
    _STANDARDISATION[size] = (mean.item(), std.item())
    sets = []
    for grey, index in ((train, train_idx), (val, val_idx)):
        grey.sub_(mean).div_(std)
        sets.append(TensorImages(grey.expand(-1, 3, -1, -1), labels[index]))
    return sets[0], sets[1]


_STANDARDISATION: dict[int, tuple[float, float]] = {}
"""The training images' (mean, std) at each size a split was made at."""


def load(cfg: RunConfig) -> tuple[TensorImages, TensorImages, list[str]]:
    """(train, val, class names: the digits ``"0"`` to ``"9"``) at ``data.size`` px."""
    train, val = load_digits_split(cfg.data.size)
    return train, val, [str(digit) for digit in range(NUM_CLASSES)]


class DigitsInput:
    """Any image as a digit of this set (``bigbatch predict``): its grey level (the mean of the channels, in
    [0, 1]) shrunk to 8 x 8 (antialiased, as the set's 8 x 8 images are block sums of a 32 x 32 bitmap), then as the
    set's images: upscaled (bilinear) to ``size`` and standardised with the training images' mean and std. The
    set's digits are light ink on a dark ground."""

    def __init__(self, size: int) -> None:
        if size not in _STANDARDISATION:
            load_digits_split(size)
        self.size = size
        self.mean, self.std = _STANDARDISATION[size]

    def from_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        grey = pixels.float().mean(dim=0, keepdim=True)[None] / 255.0
        small = F.interpolate(grey, size=(8, 8), mode="bilinear", antialias=True, align_corners=False)
        image = F.interpolate(small, size=(self.size, self.size), mode="bilinear", align_corners=False)[0]
        return ((image - self.mean) / self.std).expand(3, -1, -1)


def image_input(cfg: RunConfig) -> DigitsInput:
    """``DATASETS``' ``image_input`` for ``digits``: :class:`DigitsInput` at ``data.size``."""
    return DigitsInput(cfg.data.size)


def train_images(cfg: RunConfig) -> int:
    """The training images without loading them: scikit-learn's ``train_test_split`` holds out
    ceil(test_size * n) images (1797 - 360 = 1437)."""
    return TOTAL_IMAGES - math.ceil(VAL_FRACTION * TOTAL_IMAGES)


def held_in_memory(cfg: RunConfig) -> tuple[int, str]:
    """Both splits held as float32 grey images: images x size² x 4 bytes."""
    size = cfg.data.size
    return TOTAL_IMAGES * size**2 * 4, f"{TOTAL_IMAGES} images of {size}x{size} float32"


DATASETS.register("digits", load, task="classification", count=train_images, held_in_memory=held_in_memory,
                  image_input=image_input, check=detection_keys_unset)
