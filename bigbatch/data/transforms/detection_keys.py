"""The ``data.*`` keys of detection training augmentation, which every detection format declares when it registers
(``DATASETS.register(..., fields=AUGMENTATION_FIELDS)``): the detection task reads them for any detection format
(``tasks/detection.py``, ``data/transforms/det_transforms.py``), a classification format has no use for them.

Each is ``key: (type, default)``, the type with its bounds, as ``config.PartSection`` takes a part's fields."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

AUGMENTATION_FIELDS: dict[str, tuple[Any, Any]] = {
    "flip": (Annotated[float, Field(ge=0, le=1)], 0.5),
    # probability of a horizontal flip
    "crop": (bool, False),
    # a random crop (boxes leaving it dropped, the rest clipped) before resizing
    "jitter": (Annotated[float, Field(ge=0, lt=0.5)], 0.0),
    # Darknet's jitter crop: each side moved in or out by up to jitter x the side (outside: black), the window then
    # stretched to size x size (Darknet's letter_box=0) in place of data.resize; 0: off
    "hue": (Annotated[float, Field(ge=0, le=0.5)], 0.0),
    # Darknet's hue shift, U(-hue, hue) turns of the colour circle
    "saturation": (Annotated[float, Field(ge=1)], 1.0),
    # Darknet's saturation scale, u or 1/u with u ~ U[1, saturation]
    "exposure": (Annotated[float, Field(ge=1)], 1.0),
    # Darknet's exposure (HSV value) scale, u or 1/u with u ~ U[1, exposure]
    "crop_size": (Annotated[int, Field(gt=0)] | None, None),
    # after the resize, a random crop_size x crop_size window of the training image (a shorter side is kept whole)
    # that keeps at least one box: MegDet's 800 x 800 after the shorter side is resized to 800
    "color_jitter": (Annotated[float, Field(ge=0, le=1)], 0.0),
    # brightness, contrast and saturation jitter of +-this (MegDet: 0.4)
    "mosaic": (Annotated[float, Field(ge=0, le=1)], 0.0),
    # probability that a training sample is AlexeyAB Darknet's mosaic of 4 images around a random cut point, each
    # jitter-cropped, flipped and coloured, stretched to size x size (data/transforms/mosaic.py); a .cfg's mosaic=1:
    # 0.5; 0: off
    "mosaic_bound": (bool, False),
    # Darknet's mosaic_bound: a mosaic's boxes clipped to their own quadrant (default: to the whole image only)
}
