"""Detection samples: the record of an image and its boxes, the check of a box against its image, and the
dataset that decodes a record into ``(image, target)``.

Shared conventions: ``image`` is a ``tv_tensors.Image`` uint8 [3, H, W]; ``target`` holds ``boxes``
(``tv_tensors.BoundingBoxes`` float32 [N, 4], XYXY pixels, ``canvas_size=(H, W)``), ``labels`` (int64 [N],
contiguous 0..C-1), ``image_id`` (int, the COCO id for COCO data), ``orig_size`` ((H, W) as decoded and turned) and
``orientation`` (the record's EXIF orientation, applied to the pixels: 1 for none).

EXIF orientation (``DetectionRecord.orientation``): the ``yolo`` format's records describe an image as shown, its
stored pixels turned by their EXIF Orientation tag, as Darknet and Ultralytics decode it (OpenCV's ``imread``) and
label it; the dataset decodes the stored pixels and turns them (``images.orient``), so that boxes and pixels agree. The
evaluation's ground truth stays in stored pixels (``truth``), those a COCO file describes; a detection on the turned
image goes back to them by ``images.boxes_to_stored(boxes, target["orientation"], target["orig_size"][::-1])``.

Bad data never crashes a run. Each problem is reported once with its file (and line) and the image or box
is skipped (``problems.DataIssues``); with ``strict`` the first problem raises a ``UserError`` instead, which the
CLI prints as ``error: data: <file>:<line>: <message>`` before any training. Loading reads only image
headers (size and format); a corrupt body is found when the sample is decoded, reported once per process,
and the sample replaced by the next readable one so that batch sizes stay fixed. In strict mode the
loaders decode every image up front instead.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from bigbatch.data.pipeline.images import boxes_to_stored, decode_rgb, error_reason, orient, oriented_size
from bigbatch.data.pipeline.order import sample_rng
from bigbatch.data.pipeline.problems import DataIssues, none_readable

EDGE_TOLERANCE = 1.0  # px a box may overshoot the image by (annotation rounding): clipped without a report
MOSTLY_INSIDE = 0.5  # a box overshooting more is clipped (and reported) if this share of its area is inside

Transform = Callable[[tv_tensors.Image, dict[str, Any], Any], tuple[Any, dict[str, Any]]]


def _empty_boxes() -> np.ndarray:
    return np.zeros((0, 4), np.float32)


def _empty_labels() -> np.ndarray:
    return np.zeros((0,), np.int64)


def box_areas(boxes: np.ndarray) -> np.ndarray:
    """(x2 - x1) * (y2 - y1) of XYXY boxes."""
    return ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).astype(np.float32)


@dataclass
class DetectionRecord:
    """One image as loaded: its file, size and training boxes (float32 [N, 4] XYXY pixels, int64 labels), all of the
    image as the dataset decodes it: its stored pixels turned by ``orientation``.

    ``areas`` are the COCO ``area`` values of the boxes (segment areas; box areas when absent), used only
    by the evaluation ground truth for its small/medium/large ranges. ``crowd_*`` hold COCO ``iscrowd=1``
    regions: never training boxes, they are "ignore" regions of the evaluation ground truth, as in COCO's
    own evaluation; like ``truth``, they lie on the stored pixels.
    """

    path: str
    width: int
    height: int
    boxes: np.ndarray = field(default_factory=_empty_boxes)
    labels: np.ndarray = field(default_factory=_empty_labels)
    image_id: int = 0
    areas: np.ndarray | None = None
    crowd_boxes: np.ndarray = field(default_factory=_empty_boxes)
    crowd_labels: np.ndarray = field(default_factory=_empty_labels)
    crowd_areas: np.ndarray | None = None
    truth: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    """The evaluation's ground truth when it is not the training boxes: ``(boxes, labels, areas)``, float64 XYXY on
    the stored pixels, as an annotation file gives them (COCO: unclipped, and boxes training skips, as outside the
    image or of no size, kept), so that pycocotools on the file scores a results file as bigbatch does. None: the
    training boxes, taken back to the stored pixels when ``orientation`` turns them (set so here)."""
    orientation: int = 1
    """The EXIF Orientation (1-8) the stored pixels are turned by to give this image (``images.orient``); ``width``
    and ``height`` are then the turned image's (swapped for 5-8). 1: the stored pixels as they are (every ``coco``
    record: a COCO file describes the stored pixels, as pycocotools reads it)."""

    def __post_init__(self) -> None:
        if self.orientation not in range(1, 9):
            raise ValueError(f"orientation must be an EXIF orientation 1-8, not {self.orientation!r}")
        self.boxes = np.asarray(self.boxes, np.float32).reshape(-1, 4)
        self.labels = np.asarray(self.labels, np.int64).reshape(-1)
        self.crowd_boxes = np.asarray(self.crowd_boxes, np.float32).reshape(-1, 4)
        self.crowd_labels = np.asarray(self.crowd_labels, np.int64).reshape(-1)
        self.areas = box_areas(self.boxes) if self.areas is None else np.asarray(self.areas, np.float32)
        if self.crowd_areas is None:
            self.crowd_areas = box_areas(self.crowd_boxes)
        else:
            self.crowd_areas = np.asarray(self.crowd_areas, np.float32)
        if not len(self.boxes) == len(self.labels) == len(self.areas):
            raise ValueError("boxes, labels and areas differ in length")
        if self.truth is None and self.orientation != 1:  # a turn moves a box, never changes its area
            self.truth = (boxes_to_stored(self.boxes.astype(np.float64), self.orientation, (self.width, self.height)),
                          self.labels.copy(), self.areas.astype(np.float64))

    @property
    def stored_size(self) -> tuple[int, int]:
        """``(width, height)`` of the stored pixels (a COCO file's image entry gives these)."""
        return oriented_size((self.width, self.height), self.orientation)


def check_box(box: Sequence[float], width: int, height: int) -> tuple[tuple[float, ...] | None, str | None]:
    """An XYXY box checked against a ``width`` x ``height`` image: ``(kept box or None, problem or None)``.

    Zero or negative size, non-finite, entirely outside, or less than ``MOSTLY_INSIDE`` of its area inside:
    skipped. Overshooting by at most ``EDGE_TOLERANCE`` px: clipped silently; by more: clipped and reported.
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        return None, "box has a non-finite coordinate"
    if x2 <= x1 or y2 <= y1:
        return None, f"box has zero or negative size ({x2 - x1:g} x {y2 - y1:g} px)"
    kept = (max(x1, 0.0), max(y1, 0.0), min(x2, float(width)), min(y2, float(height)))
    image = f"the {width}x{height} image"
    if kept[2] <= kept[0] or kept[3] <= kept[1]:
        return None, f"box [{x1:g}, {y1:g}, {x2:g}, {y2:g}] (xyxy) lies outside {image}"
    overshoot = max(-x1, -y1, x2 - width, y2 - height)
    if overshoot <= EDGE_TOLERANCE:
        return kept, None
    inside = (kept[2] - kept[0]) * (kept[3] - kept[1]) / ((x2 - x1) * (y2 - y1))
    if inside < MOSTLY_INSIDE:
        return None, f"box [{x1:g}, {y1:g}, {x2:g}, {y2:g}] (xyxy) lies mostly outside {image} ({inside:.0%} inside)"
    return kept, f"box [{x1:g}, {y1:g}, {x2:g}, {y2:g}] (xyxy) extends {overshoot:g} px beyond {image}; clipped"


def records_name(what: str, records: Sequence[DetectionRecord]) -> str:
    """A set of records in a message: ``what`` and the folder holding their images (``the training set under
    /data/coco/train2017``)."""
    try:
        folder = os.path.commonpath([os.path.dirname(record.path) for record in records]) if records else ""
    except ValueError:  # absolute and relative paths: no common folder
        folder = ""
    return f"{what} under {folder}" if folder else what


class DetectionDataset(Dataset):
    """Records decoded into ``(image, target)``, optionally through ``transform(image, target, size)``.

    A key is an index, or ``(index, size, sample_seed)``: ``size`` is passed to the transform (multi-scale
    training), and with a ``sample_seed`` the transform runs with torch's CPU RNG seeded with it in a
    forked RNG, so a sample's augmentation depends only on its seed (whatever the worker, layout or resume)
    and the global RNG is left untouched. A transform with a ``mosaic`` (``data.mosaic``, ``data/transforms/mosaic.py``)
    makes the samples it picks of this record and three others, drawn under that same seed.

    A record's stored pixels are decoded and turned by its ``orientation`` (``images.orient``), and must then have
    its size. An image that cannot be decoded is reported once (per process) and replaced by the next readable one
    (wrapping around); the substitute's target carries ``substitute_for``, the requested record's image_id,
    so that an evaluation can leave it out, and ``data_problems``, the ``(path, message)`` of each image it
    stands for, so that the training process counts problems a DataLoader worker found
    (``DataIssues.absorb_targets``).
    """

    def __init__(self, records: Sequence[DetectionRecord], transform: Transform | None = None,
                 issues: DataIssues | None = None, name: str = "the set"):
        self.records = list(records)
        self.transform = transform
        self.issues = issues if issues is not None else DataIssues()
        self.name = name  # the set in a message: "the training set of /data/coco"
        self._unreadable: set[int] = set()
        self._first_unreadable: tuple[str, str] | None = None  # (path, problem) of the first image found unreadable

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: int | tuple[int, Any, int | None]) -> tuple[Any, dict[str, Any]]:
        index, size, sample_seed = key if isinstance(key, tuple) else (key, None, None)
        index = int(index)
        if not 0 <= index < len(self.records):
            raise IndexError(f"index {index} is out of range for {len(self.records)} samples")
        image, target = self._sample(index)
        if self.transform is None:
            return image, target
        if sample_seed is None:
            return self._transformed(image, target, size)
        with sample_rng(sample_seed):
            return self._transformed(image, target, size)

    def _transformed(self, image: tv_tensors.Image, target: dict[str, Any], size: Any) -> tuple[Any, dict[str, Any]]:
        """The transform's output, or, when the transform carries a mosaic that picks this sample, the mosaic of this
        image and three drawn from the records (``data/transforms/mosaic.py``), every draw from the current RNG."""
        mosaic = getattr(self.transform, "mosaic", None)
        if mosaic is not None and mosaic.chosen():
            partners = [self._sample(i) for i in mosaic.partners(len(self.records))]
            return mosaic([(image, target), *partners], size)
        return self.transform(image, target, size)

    def _sample(self, index: int) -> tuple[tv_tensors.Image, dict[str, Any]]:
        """The record at ``index`` decoded, or the next decodable one; the unreadable ones passed over are reported
        once it is found. None decodable: one error naming the set (``problems.none_readable``)."""
        count = len(self.records)
        found: list[tuple[str, str]] = []
        for i in itertools.chain(range(index, count), range(index)):
            if i in self._unreadable:
                continue
            record = self.records[i]
            try:
                pixels = orient(decode_rgb(record.path), record.orientation)
            except RuntimeError as error:
                problem = f"corrupt image: {error_reason(error)}"
            else:
                if pixels.shape[1:] == (record.height, record.width):
                    self.issues.replaced(found)
                    image, target = self._pack(record, pixels, None if i == index else self.records[index].image_id)
                    if found:
                        target["data_problems"] = found
                    return image, target
                turned = "" if record.orientation == 1 else f" as shown (EXIF orientation {record.orientation})"
                problem = (f"decodes to {pixels.shape[2]}x{pixels.shape[1]}{turned}, expected "
                           f"{record.width}x{record.height}")
            self._unreadable.add(i)
            self._first_unreadable = self._first_unreadable or (record.path, problem)
            found.append((record.path, f"{problem}; the next readable sample is used instead"))
        raise none_readable(self.name, count, *(self._first_unreadable or ("-", "no image")))

    @staticmethod
    def _pack(record: DetectionRecord, pixels: torch.Tensor, substitute_for: int | None
              ) -> tuple[tv_tensors.Image, dict[str, Any]]:
        height, width = pixels.shape[1:]
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(torch.tensor(record.boxes), format=tv_tensors.BoundingBoxFormat.XYXY,
                                              canvas_size=(height, width)),
            "labels": torch.tensor(record.labels),
            "image_id": record.image_id,
            "orig_size": (height, width),
            "orientation": record.orientation,
        }
        if substitute_for is not None:
            target["substitute_for"] = substitute_for
        return tv_tensors.Image(pixels), target

    @staticmethod
    def collate(batch: Sequence[tuple[Any, dict[str, Any]]]) -> tuple[list[Any], list[dict[str, Any]]]:
        """Samples of different sizes stay separate: ``(list of images, list of targets)``."""
        return [image for image, _ in batch], [target for _, target in batch]
