"""torchvision's ImageNet recipe (``references/classification/presets.py``) as v2 transforms: the
``data.preprocessing: standard`` pipelines of a whole decoded image (``data/transforms/crops.py`` has their crop-first
forms)."""

from __future__ import annotations

import torch
from torchvision.transforms import v2

# torchvision's ImageNet statistics (references/classification/presets.py).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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
