"""scikit-learn's handwritten digits as a small RGB image classification set.

1,797 real 8x8 grey images of the digits 0-9 ship with scikit-learn (UCI optical recognition
of handwritten digits, test part). They are upscaled (bilinear) to ``size`` px, copied into
three channels and standardised. The held-out split is fixed (20 %, stratified, split seed 0),
independent of the run's seed, so every run is judged on the same 360 images.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bigbatch.data.loader import TensorImages

NUM_CLASSES = 10
VAL_FRACTION = 0.2
SPLIT_SEED = 0


def _to_images(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 64) values 0..16 -> (N, 3, size, size) in [0, 1] (standardised by the caller)."""
    grey = (pixels.view(-1, 1, 8, 8) / 16.0).float()
    grey = F.interpolate(grey, size=(size, size), mode="bilinear", align_corners=False)
    return grey.expand(-1, 3, -1, -1).contiguous()


def load_digits_split(size: int) -> tuple[TensorImages, TensorImages]:
    """(train, val) datasets of the fixed split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_idx, val_idx = train_test_split(
        range(len(digits.target)), test_size=VAL_FRACTION, random_state=SPLIT_SEED, stratify=digits.target
    )
    pixels = torch.as_tensor(digits.data, dtype=torch.float32)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    images = _to_images(pixels, size)
    mean, std = images[train_idx].mean(), images[train_idx].std()
    images = (images - mean) / std
    return (
        TensorImages(images[train_idx], labels[train_idx]),
        TensorImages(images[val_idx], labels[val_idx]),
    )
