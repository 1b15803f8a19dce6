"""The ``data`` section: which dataset format, and the keys the formats share."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from bigbatch.config.data_keys import DATASET_KEYS
from bigbatch.config.section import PartSection, Section, registered
from bigbatch.registry import DATASETS

MAX_WORKERS = 256
"""``data.workers`` at most: each worker is a process holding its own copy of the dataset object; a count past a
few per core only thrashes (``data bench`` measures the best one)."""

SizeList = Annotated[list[Annotated[int, Field(gt=0, multiple_of=32)]], Field(min_length=1)]
"""One or more input sizes, multiples of 32."""


class MultiScaleConfig(Section):
    """Multi-scale training (Darknet's ``random=1``): a new input size every ``every`` steps, the same on every
    rank and after a resume (drawn from the seed and the step); the first steps run at the largest size."""

    sizes: SizeList | Literal["auto"] | None = None
    """Training sizes (``data.size`` for each step): a list, drawn uniformly; ``auto``: Darknet's rule around
    ``data.size`` with ``range`` (``round(r * size / 32 + 1) * 32``, r in [1/range, range]: 416 takes 320..608;
    ``data/transforms/multiscale.py``); unset: multi-scale training is off."""
    every: int = Field(10, gt=0)
    """Steps between two size changes."""
    range: float = Field(1.4, ge=1, le=10)
    """``auto``: the range of the drawn scale (Darknet's ``random`` in the last ``[yolo]`` layer: 1 means 1.4)."""
    final: int = Field(100, ge=0)
    """The periods that start within the run's last ``final`` steps are at the largest size, as Darknet's
    ``iteration > max_batches - 100`` at a period's start (BatchNorm statistics settle at it)."""


class DataConfig(PartSection):
    """The dataset: the keys every format shares. A built-in format's own keys are declared in
    ``config/data_keys.py`` (it registers with them): ``coco`` its splits (``train``, ``val``), ``yolo``
    ``annotations`` (a COCO file of its validation images, for their ids), ``shapes`` ``shapes_images``, every
    detection format the augmentation keys, ``folder`` and ``shards`` ``preprocessing``; another format declares
    its own when it registers (``fields=``)."""

    parts = DATASETS
    builtin_keys = DATASET_KEYS
    layout = ("name", "size", "max_size", "resize", "path", "train", "val", "annotations", "classes", "strict",
              "train_images", "shapes_images", "flip", "crop", "jitter", "jitter_resize", "hue", "saturation",
              "exposure", "crop_size", "color_jitter", "mosaic", "mosaic_bound", "multiscale", "workers")
    """The order config.yaml has always written these keys in, the formats' own among the shared ones."""

    name: Annotated[str, registered(DATASETS)] = "digits"
    """The dataset. Classification: ``digits`` (scikit-learn's 8x8 handwritten digits, upscaled to ``size`` px RGB),
    ``folder`` (image files in ``path``/train/CLASS/ and ``path``/val/CLASS/, ImageNet's layout) or ``shards``
    (the same packed by ``bigbatch pack``: tar shards and an index in ``path``). Detection:
    ``shapes`` (bigbatch's generated set, written to ``path`` when absent), ``coco`` (COCO JSON, ``train`` and
    ``val``) or ``yolo`` (Darknet/YOLO text labels: a ``.data`` file or a folder, ``path``)."""
    size: int = Field(32, gt=0)
    """Classification: side of the square input images. Detection: the shorter side after resizing
    (``shorter_side``) or the square side (``letterbox``, ``stretch``), for evaluation and, without multi-scale, for
    training."""
    max_size: int | None = Field(None, gt=0)
    """Detection, ``shorter_side``: the longer side's cap (detectron's 1333 for 800); unset: size x 1333 / 800."""
    resize: Literal["shorter_side", "letterbox", "stretch"] = "shorter_side"
    """Detection: scale the shorter side to ``size`` (longer side at most ``max_size``; Faster R-CNN, RetinaNet,
    FCOS), letterbox into a ``size`` x ``size`` square (YOLOv5/v8, Darknet's ``letter_box=1``), or stretch to the
    square, the aspect ratio not kept (SSD, Darknet's default ``letter_box=0``)."""
    path: str | None = None
    """``folder``: the folder holding ``train/`` and ``val/``; ``shapes``: the folder of the generated set (default
    ``data/shapes``); ``yolo``: the ``.data`` file or the dataset folder."""
    classes: list[str] | None = None
    """Detection: train and evaluate on these classes only, by name, in this order (e.g. ``[cat, dog]``)."""
    strict: bool = False
    """Image files (``folder``, detection): stop before training (exit code 2) at the first bad image, box or label
    line, naming the file (every image is decoded once first); by default each is reported once and skipped (an
    unreadable image is replaced by the next readable one), and a summary printed."""
    train_images: int | None = Field(None, gt=0)
    """The training set's size (``folder``, detection), used by ``show``, ``schedule`` and ``scale`` only when the
    data is not at hand (e.g. ``118287`` for COCO train2017); training always counts the images it loads."""
    multiscale: MultiScaleConfig = MultiScaleConfig()
    workers: int = Field(0, ge=0, le=MAX_WORKERS)
    """DataLoader worker processes (0: load in the training process); at most 256 (``MAX_WORKERS``), far more than
    the cores of any one machine a run is given."""

    @property
    def is_detection(self) -> bool:
        return self.part().info["task"] == "detection"

    @property
    def longest_side(self) -> int:
        """Detection: the longer side's cap at ``size`` (shorter-side resizing)."""
        return self.max_size if self.max_size is not None else round(self.size * 1333 / 800)

    @model_validator(mode="after")
    def _sizes_agree(self) -> DataConfig:
        if self.max_size is not None and self.max_size < self.size:
            raise ValueError(f"data.max_size: {self.max_size} is below data.size {self.size}")
        return self
