"""How one image becomes a prediction: the input a model takes, and its output as a record in the image's pixels.

Each pipeline has ``prepare(pixels)`` (a decoded uint8 [3, H, W] image -> the model's input and what maps the
output back), ``prepare_file(path)`` (the same from a file: a detector's image as it is shown, its EXIF orientation
applied, as Ultralytics and Darknet's OpenCV build read a photo, boxes in the shown image's pixels; a classifier's as
its evaluation reads it, the stored pixels, as torchvision's and timm's) and ``run(module,
inputs, geometries, settings)`` (a batch of inputs -> one result per image):

- :class:`EvalDetection`: a run's detector, with its evaluation transform (``tasks/detection.py``'s ``image_input``),
  the detector's own decoding and NMS, and ``boxes_to_original``: per image, what ``bigbatch eval`` computes.
- :class:`EvalClassification`: a run's classifier, with its dataset format's evaluation preprocessing; the softmax's
  top ``k`` classes.
- ``darknet/predict.py``'s ``DarknetTestDetection``: a network from a Darknet ``.cfg``, run as Darknet's ``detector
  test`` runs it (``darknet/test_image.py``: its resize or letterbox, its NMS kind, its box correction).

A detection result is ``{"boxes": [N, 4] XYXY in the original image's pixels (clipped to it), "scores", "labels"}``,
best first; a classification result is ``{"probabilities": [k], "labels": [k]}``, most probable first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torchvision import tv_tensors

from bigbatch.data.pipeline.images import decode_rgb, decode_shown

CONF = 0.25
"""The lowest score kept by default (Darknet's ``detector test -thresh``, Ultralytics' ``conf``)."""


@dataclass
class Settings:
    """What a prediction keeps: ``conf`` the lowest score, ``iou`` the NMS threshold, ``max_det`` the most
    detections per image, ``top_k`` the classes a classifier's record lists, ``batch`` the images per forward."""

    conf: float
    iou: float
    max_det: int
    top_k: int = 5
    batch: int = 1


def detector_thresholds(module: nn.Module) -> tuple[Any, dict[str, str]]:
    """The object holding a detector's thresholds and their attribute names ``{"conf", "iou", "max_det"}``:
    DarknetDetector's, torchvision's one-stage detectors' (FCOS, RetinaNet, SSD) or Faster R-CNN's ROI heads'."""
    if hasattr(module, "detections_per_image"):  # darknet/detector.py's DarknetDetector
        return module, {"conf": "score_thresh", "iou": "nms_thresh", "max_det": "detections_per_image"}
    inner = getattr(module, "detector", module)  # models/detectors.py's Detector wraps the torchvision model
    owner = getattr(inner, "roi_heads", inner)
    return owner, {"conf": "score_thresh", "iou": "nms_thresh", "max_det": "detections_per_img"}


def own_thresholds(module: nn.Module) -> dict[str, float]:
    """The thresholds a detector was built with (those ``bigbatch eval`` uses)."""
    owner, names = detector_thresholds(module)
    return {key: getattr(owner, name) for key, name in names.items()}


class EvalDetection:
    """A run's detector on images transformed as its validation images are (see the module docstring)."""

    task = "detection"

    def __init__(self, transform: Any) -> None:
        self.transform = transform
        """``tasks/detection.py``'s ``image_input``: the evaluation transform."""

    def prepare(self, pixels: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        height, width = pixels.shape[1:]
        no_boxes = tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(height, width))
        image, target = self.transform(tv_tensors.Image(pixels), {"boxes": no_boxes})
        return image.as_subclass(torch.Tensor), target

    def prepare_file(self, path: str) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.prepare(decode_shown(path))

    @staticmethod
    def size_of(geometry: dict[str, Any]) -> tuple[int, int]:
        return tuple(int(v) for v in geometry["orig_size"])

    @torch.no_grad()
    def run(self, module: nn.Module, inputs: list[torch.Tensor], geometries: list[dict[str, Any]],
            settings: Settings) -> list[dict[str, torch.Tensor]]:
        from bigbatch.data.transforms.det_transforms import boxes_to_original

        owner, names = detector_thresholds(module)
        kept = {} if getattr(module, "fixed_thresholds", False) else names  # an exported graph's were fixed with it
        before = {name: getattr(owner, name) for name in kept.values()}
        try:  # the predict thresholds for this forward only: the module's own (its evaluation's) are put back
            for key, name in kept.items():
                setattr(owner, name, getattr(settings, key))
            device = next(module.parameters()).device
            outputs = module([image.to(device, non_blocking=True) for image in inputs])
        finally:
            for name, value in before.items():
                setattr(owner, name, value)
        return [{"boxes": boxes_to_original(out["boxes"].float().cpu(), geometry), "scores": out["scores"].cpu(),
                 "labels": out["labels"].cpu()} for out, geometry in zip(outputs, geometries, strict=True)]


class EvalClassification:
    """A run's classifier on images preprocessed as its validation images are (see the module docstring)."""

    task = "classification"

    def __init__(self, image_input: Any) -> None:
        self.image_input = image_input
        """The dataset format's ``image_input``: ``from_pixels``, and ``from_file`` where it reads files itself."""

    def prepare(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        return self.image_input.from_pixels(pixels), tuple(pixels.shape[1:])

    def prepare_file(self, path: str) -> tuple[torch.Tensor, tuple[int, int]]:
        if hasattr(self.image_input, "from_file"):
            return self.image_input.from_file(path)
        return self.prepare(decode_rgb(path))

    @staticmethod
    def size_of(geometry: tuple[int, int]) -> tuple[int, int]:
        return geometry

    @torch.no_grad()
    def run(self, module: nn.Module, inputs: list[torch.Tensor], geometries: list[tuple[int, int]],
            settings: Settings) -> list[dict[str, torch.Tensor]]:
        device = next(module.parameters()).device
        logits = module(torch.stack(inputs).to(device, non_blocking=True))
        logits = getattr(logits, "logits", logits)  # Inception's and GoogLeNet's named outputs
        probabilities = torch.softmax(logits.float(), dim=1).cpu()
        top = probabilities.topk(min(settings.top_k, probabilities.shape[1]), dim=1)
        return [{"probabilities": p, "labels": i} for p, i in zip(top.values, top.indices, strict=True)]
