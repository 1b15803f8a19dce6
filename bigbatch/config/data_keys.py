"""The ``data.*`` keys the built-in dataset formats add (:data:`DATASET_KEYS`, by format), declared here, free of
torch, so that a config's keys are checked before the formats' modules load (``config/unknown_keys.py``); each
format registers with its entry (``DATASETS.register(..., fields=DATASET_KEYS["coco"])``).

Each key is ``key: (type, default)``, the type with its bounds, as ``config.PartSection`` takes a part's fields:

- ``folder`` and ``shards`` (classification): ``preprocessing``, ``darknet`` (:class:`DarknetAugment`),
  ``standard`` (:class:`StandardAugment`) and ``decode``;
- every detection format: the augmentation keys (:data:`AUGMENTATION`), which the detection task reads for any
  detection format (``tasks/detection.py``, ``data/transforms/det_transforms.py``);
- ``shapes``: ``shapes_images``; ``coco``: its splits, ``train`` and ``val`` (:class:`SplitPaths`); ``yolo``:
  ``annotations``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from bigbatch.config.section import Section

Fields = dict[str, tuple[Any, Any]]

MAX_SHAPES_IMAGES = 10_000_000
"""``data.shapes_images`` and ``data shapes --images`` at most: about 80 GB of JPEGs at some 8 KB an image, far past
what a synthetic set needs (the default is 2,000)."""

PREPROCESSING = Literal["inception", "standard", "darknet"]
"""``data.preprocessing`` (``folder``): ``inception``, the Inception v3 TPU code's (``data/transforms/inception.py``),
``standard``, torchvision's and timm's ImageNet recipe with the keys of ``data.standard``
(``data/transforms/crops.py``), or ``darknet``, Darknet's classifier augmentation with the keys of ``data.darknet``
(``data/transforms/darknet_augment.py``)."""

DECODE = Literal["exact", "fast"]
"""``data.decode`` (``folder``, ``shards``): ``exact``, every image decoded whole and the preprocessing's own
arithmetic (for ``inception``, TF1's bilinear resize, bit for bit); ``fast``, a JPEG decoded at the smallest DCT
scale the crop allows and, for ``inception``, the resize done on the uint8 pixels by torch (``docs/data.md``
states how far the outputs differ)."""

Range = Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=2, max_length=2)]
"""``[low, high]``, both positive."""


class StandardAugment(Section):
    """``data.standard``: the keys of ``data.preprocessing: standard`` (``data/transforms/crops.py``), named as timm's
    ``train.py`` flags (``--scale``, ``--ratio``, ``--hflip``, ``--color-jitter``, ``--train-interpolation``,
    ``--crop-pct``)."""

    scale: Range = [0.08, 1.0]
    """The crop's area as a fraction of the image's, drawn uniformly in this range."""
    ratio: Range = [3 / 4, 4 / 3]
    """The crop's aspect (width / height), drawn log-uniformly in this range."""
    hflip: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Probability of a horizontal flip."""
    color_jitter: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Brightness, contrast and saturation each scaled by a factor in [1 - this, 1 + this], in a random order
    (torchvision's ``ColorJitter``; timm's default is 0.4); 0: off."""
    interpolation: Literal["bilinear", "bicubic", "random"] = "bilinear"
    """The crop's resize (antialiased); ``random``: bilinear or bicubic, drawn per image (timm's default)."""
    crop_pct: Annotated[float, Field(gt=0, le=1)] = 0.875
    """Evaluation: the shorter side resized to size / crop_pct, the centre size x size kept."""

    @model_validator(mode="after")
    def _ranges_ordered(self) -> StandardAugment:
        if self.scale[0] > self.scale[1] or self.scale[1] > 1:
            raise ValueError(f"data.standard.scale: expected [low, high] with low <= high <= 1, got {self.scale}")
        if self.ratio[0] > self.ratio[1]:
            raise ValueError(f"data.standard.ratio: expected [low, high] with low <= high, got {self.ratio}")
        return self


class DarknetAugment(Section):
    """``data.darknet``: the ``[net]`` augmentation keys of a Darknet classifier cfg (``parse_net_options``'
    defaults; crops as fractions of ``data.size``: Darknet's ``min_crop = w``, ``max_crop = 2 w``), for
    ``data.preprocessing: darknet`` (``data/transforms/darknet_augment.py``)."""

    min_crop: Annotated[float, Field(gt=0)] = 1.0
    max_crop: Annotated[float, Field(gt=0)] = 2.0
    aspect: Annotated[float, Field(ge=1)] = 1.0
    angle: Annotated[float, Field(ge=0, le=180)] = 0.0
    hue: Annotated[float, Field(ge=0, le=0.5)] = 0.0
    saturation: Annotated[float, Field(ge=1)] = 1.0
    exposure: Annotated[float, Field(ge=1)] = 1.0
    flip: bool = True

    @model_validator(mode="after")
    def _crops_ordered(self) -> DarknetAugment:
        if self.min_crop > self.max_crop:
            raise ValueError(f"data.darknet.min_crop: {self.min_crop} is above max_crop {self.max_crop}")
        return self


CLASSIFICATION: Fields = {"preprocessing": (PREPROCESSING, "inception"), "darknet": (DarknetAugment, DarknetAugment()),
                          "standard": (StandardAugment, StandardAugment()), "decode": (DECODE, "exact")}
"""The keys ``folder`` and ``shards`` add."""

AUGMENTATION: Fields = {
    "flip": (Annotated[float, Field(ge=0, le=1)], 0.5),
    # probability of a horizontal flip
    "crop": (bool, False),
    # a random crop (boxes leaving it dropped, the rest clipped) before resizing
    "jitter": (Annotated[float, Field(ge=0, lt=0.5)], 0.0),
    # Darknet's jitter crop: each side moved in or out by up to jitter x the side (outside: black), the window then
    # stretched to size x size (Darknet's letter_box=0) in place of data.resize; 0: off
    "jitter_resize": (Annotated[float, Field(gt=0, le=10)], 1.0),
    # AlexeyAB's [yolo] resize: each side of the jitter window moved by a further random zoom of up to this, in or
    # out (below 1: out only), with or without mosaic (data/transforms/zoom.py); 1: off
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
"""The detection training augmentation, a key of every detection format (a classification format has no use for
them)."""


class SplitPaths(Section):
    """Where one split (``data.train``, ``data.val``) of a COCO dataset is. Relative paths are taken from the
    current directory."""

    images: str
    """The folder of the split's images."""
    annotations: str
    """The split's COCO JSON annotation file."""


ANNOTATIONS_AUTO = "auto"
"""``data.annotations``' default (``yolo``): the COCO file ``bigbatch data shapes`` wrote beside a set it generated, if
any."""

def detection_keys_unset(data: Any) -> None:
    """A classification format's check: the keys every config has that only detection reads are left unset, since
    given they would be left unread: ``data.classes`` (a subset of a detection set's classes; the run would train
    every class) and ``data.multiscale.sizes`` (multi-scale training; the run would train at ``data.size``)."""
    if data.classes is not None:
        raise ValueError(f"data.classes: used by the detection formats only, not by {data.name!r} (data.name): a "
                         "classification set trains every class of its data; leave it out")
    if data.multiscale.sizes is not None:
        raise ValueError(f"data.multiscale.sizes: used by the detection formats only, not by {data.name!r} "
                         "(data.name): a classifier trains at data.size; leave it out")


DATASET_KEYS: dict[str, Fields] = {
    "folder": {**CLASSIFICATION, "follow_links": (bool, False)},
    # follow_links: read the files that links in data.path lead to outside it (a set of links to a shared store,
    # as torchvision's ImageFolder reads them); false: such a link is one error naming it
    "shards": CLASSIFICATION,
    "shapes": {"shapes_images": (Annotated[int, Field(gt=0, le=MAX_SHAPES_IMAGES)], 2000), **AUGMENTATION},
    # shapes_images: images to generate (train and val together) when data.path holds no set yet; at most
    # MAX_SHAPES_IMAGES (10^7)
    "coco": {"train": (SplitPaths | None, None), "val": (SplitPaths | None, None), **AUGMENTATION},
    "yolo": {"annotations": (str | None, ANNOTATIONS_AUTO), **AUGMENTATION},
    # annotations: a COCO annotation file of the same validation images, whose image ids (by file name), category
    # ids (by name), boxes and areas the evaluation and a results file take; auto: the annotations/val.json of a set
    # `bigbatch data shapes` generated, when data.path is (or is in) one; null: none (image id = place in the list,
    # category id = class index + 1)
}
"""The keys each built-in format adds to ``data``, by format (``digits`` adds none)."""
