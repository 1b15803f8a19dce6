"""``bigbatch.load(...)``'s result: a model ready to predict, and the records its predictions are.

    model = bigbatch.load("runs/shapes")             # a run directory, a checkpoint, or NET.cfg with weights=
    records = model.predict(["a.jpg", pil_image, array, tensor])
    model.module, model.classes, model.transform     # the torch.nn.Module, the class names, the preprocessing

A record, one per image (or video frame), is what ``bigbatch predict`` writes as a line of ``predictions.jsonl``:

    {"file": "a.jpg" | null, "frame": null | 12, "width": 640, "height": 480,
     "detections": [{"box": [x1, y1, x2, y2], "score": 0.91, "class_id": 2, "class_name": "triangle"}, ...]}

with the box in the original image's pixels (a detector), or ``"top": [{"class_id", "class_name", "probability"},
...]``, the ``top_k`` most probable classes (a classifier). Images given as arrays or tensors are RGB, ``[H, W, 3]``
(numpy's, PIL's layout) or ``[3, H, W]`` (torch's), of dtype uint8 (0-255) or floating point in ``[0, 1]`` (as
torchvision's ``to_tensor`` gives, or ``a / 255``): a float image, array or tensor alike, is clamped to ``[0, 1]``,
times 255, rounded to uint8, so one image as a numpy array or as a tensor predicts the same. Any other dtype (uint16,
int, bool) is a :class:`~bigbatch.errors.UserError` naming it: a cast would wrap or darken it without a word.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from bigbatch.data.formats.encoded_images import DECODE_ERRORS
from bigbatch.errors import UserError
from bigbatch.inference.pipelines import Settings


@dataclass(frozen=True)
class Item:
    """One image to predict on: a file (read when its batch is made), or pixels already decoded (uint8 [3, H, W]),
    with the file and frame they came from, if any."""

    file: str | None = None
    frame: int | None = None
    pixels: torch.Tensor | None = None


class Unreadable(Exception):
    """An item that could not be read or decoded: ``item`` and the reason (the caller reports it and goes on)."""

    def __init__(self, item: Item, reason: str) -> None:
        super().__init__(f"{item.file}: {reason}")
        self.item, self.reason = item, reason


class Predictor:
    """A model, its class names and its preprocessing (a pipeline of ``inference/pipelines.py``), on a device."""

    def __init__(self, module: nn.Module, classes: list[str], pipeline: Any, settings: Settings,
                 source: str, origin: dict[str, Any] | None = None) -> None:
        self.module = module.eval()
        self.classes = list(classes)
        self.pipeline = pipeline
        self.settings = settings
        """The defaults of ``predict`` (``--conf``, ``--iou``, ``--max-det``, ``--batch``)."""
        self.source = source
        """Where the weights came from, for a message ("EMA weights of runs/x/checkpoints/last.pt")."""
        self.origin = origin or {}
        """What rebuilds this predictor around an exported graph (``inference/export.py``): a run's config and the
        files it kept, or a model file's own (a Darknet cfg's text and how ``detector test`` runs it)."""

    @property
    def task(self) -> str:
        """``"detection"`` or ``"classification"``."""
        return self.pipeline.task

    @property
    def transform(self) -> Any:
        """The preprocessing: ``transform(pixels)`` -> (the model's input, what maps its output back)."""
        return self.pipeline.prepare

    def settings_with(self, **overrides: Any) -> Settings:
        """The default settings with the ``overrides`` that are not None."""
        return replace(self.settings, **{k: v for k, v in overrides.items() if v is not None})

    def predict(self, images: Iterable[Any] | Any, conf: float | None = None, iou: float | None = None,
                max_det: int | None = None, top_k: int | None = None, batch: int | None = None) -> list[dict]:
        """One record per image (see the module docstring). ``images``: paths, PIL images, numpy arrays or tensors
        (or one of them). An image that cannot be read is a ``UserError`` naming it."""
        if isinstance(images, (str, torch.Tensor, np.ndarray)) or hasattr(images, "convert"):
            images = [images]
        items = [as_item(image) for image in images]
        settings = self.settings_with(conf=conf, iou=iou, max_det=max_det, top_k=top_k, batch=batch)
        records = []
        for _, record in self.records(items, settings):
            if isinstance(record, Unreadable):
                raise UserError(f"predict: {record}")
            records.append(record)
        return records

    def records(self, items: Iterable[Item], settings: Settings) -> Iterator[tuple[Item, dict | Unreadable]]:
        """``(item, its record)`` for each item in order, ``settings.batch`` images per forward; an item that cannot
        be read gives an :class:`Unreadable` in place of its record."""
        pending: list[tuple[Item, Any, Any]] = []
        for item in items:
            try:
                prepared = self._prepare(item)
            except DECODE_ERRORS as error:
                yield item, Unreadable(item, _reason(error))
                continue
            pending.append((item, *prepared))
            if len(pending) == settings.batch:
                yield from self._run(pending, settings)
                pending = []
        if pending:
            yield from self._run(pending, settings)

    def _prepare(self, item: Item) -> tuple[Any, Any]:
        if item.pixels is not None:
            return self.pipeline.prepare(item.pixels)
        return self.pipeline.prepare_file(item.file)

    def _run(self, pending: Sequence[tuple[Item, Any, Any]], settings: Settings) -> Iterator[tuple[Item, dict]]:
        results = self.pipeline.run(self.module, [p[1] for p in pending], [p[2] for p in pending], settings)
        for (item, _, geometry), result in zip(pending, results, strict=True):
            yield item, self.record(item, self.pipeline.size_of(geometry), result, settings)

    def record(self, item: Item, size: tuple[int, int], result: dict[str, torch.Tensor], settings: Settings) -> dict:
        """A pipeline's result for one image as a record (the module docstring)."""
        height, width = size
        record: dict[str, Any] = {"file": item.file, "frame": item.frame, "width": width, "height": height}
        if self.task == "classification":
            record["top"] = [{"class_id": int(label), "class_name": self.classes[int(label)],
                              "probability": float(p)}
                             for p, label in zip(result["probabilities"].tolist(), result["labels"].tolist(),
                                                 strict=True)]
            return record
        keep = result["scores"] >= settings.conf  # the model's own thresholds may be lower (torchvision's)
        boxes, scores, labels = (result[key][keep][:settings.max_det] for key in ("boxes", "scores", "labels"))
        record["detections"] = [
            {"box": box, "score": score, "class_id": label, "class_name": self.classes[label]}
            for box, score, label in zip(boxes.tolist(), scores.tolist(), labels.tolist(), strict=True)]
        return record


def as_item(image: Any) -> Item:
    """A path, a PIL image, a numpy array or a tensor as an :class:`Item` (see the module docstring): arrays and
    tensors of uint8, or of floats in ``[0, 1]`` (clamped, times 255, rounded); other dtypes are refused."""
    if isinstance(image, Item):
        return image
    if isinstance(image, (str, bytes)) or hasattr(image, "__fspath__"):
        import os

        return Item(file=os.fsdecode(image))
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
        image = np.asarray(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        if image.ndim == 2:
            image = np.repeat(image[:, :, None], 3, axis=2)
        if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
            raise UserError(f"predict: an array image must be [H, W, 3] (RGB), got shape {list(image.shape)}")
        if image.dtype == np.uint8:
            dtype = np.uint8
        elif np.issubdtype(image.dtype, np.floating):
            dtype = np.float32  # scaled below as a float tensor is: clamp to [0, 1], * 255, rounded
        else:  # a cast would wrap (uint16, int) or make 0/1 pixels (bool): not guessed
            raise UserError(f"predict: an array image must be uint8 (0-255) or float in [0, 1], got {image.dtype} "
                            f"(scale it to one of these first, e.g. (a / 65535).astype('float32') for 16-bit)")
        rgb = image[:, :, :3] if image.shape[2] != 1 else np.repeat(image, 3, axis=2)
        image = torch.from_numpy(np.array(rgb, dtype=dtype)).permute(2, 0, 1)  # a copy: PIL's arrays are read-only
    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] not in (1, 3):
            raise UserError(f"predict: a tensor image must be [3, H, W], got shape {list(image.shape)}")
        if image.is_floating_point():
            image = (image.clamp(0, 1) * 255).round().to(torch.uint8)
        if image.dtype != torch.uint8:
            raise UserError(f"predict: a tensor image must be uint8 or float in [0, 1], got {image.dtype}")
        return Item(pixels=image.expand(3, -1, -1).contiguous().cpu())
    raise UserError(f"predict: cannot predict on a {type(image).__name__} (give paths, PIL images, numpy arrays "
                    "or tensors)")


def _reason(error: Exception) -> str:
    from bigbatch.data.pipeline.images import error_reason

    return error_reason(error) or type(error).__name__
