"""Object detection: the summed detector losses, and COCO mAP on the validation set.

A batch is ``(list of images, list of targets)``: images differ in size, and the detector pads them into one
tensor itself. Each training sample is read with the key ``(index, size, sample_seed)``: ``size`` is the
step's multi-scale size, the same on every rank and after a resume (``data/multiscale.py``), and the
augmentation of a sample depends on ``sample_seed`` alone, drawn from (seed, step, index), so that it is the
same whatever the layout, the workers or a resume.

Evaluation: every rank runs its share of the validation images (indices ``rank, rank + world, ...``), maps
its boxes back to the original images (``boxes_to_original``), and rank 0 gathers all detections and scores
them with faster-coco-eval (``tasks/coco_eval.py``); the metrics go back to every rank.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from bigbatch.config import RunConfig
from bigbatch.data.coco import CATEGORY_ID_OFFSET, class_mapping, coco_ground_truth, load_coco
from bigbatch.data.det_transforms import boxes_to_original, eval_transform, train_transform
from bigbatch.data.detection import DataIssues, DetectionDataset, DetectionRecord
from bigbatch.data.loader import eval_batches
from bigbatch.data.multiscale import MultiScale, default_sizes
from bigbatch.errors import UserError
from bigbatch.tasks.coco_eval import (
    darknet_line,
    detections_to_coco,
    evaluate_detections,
    format_table,
    save_detections,
)

DEFAULT_SHAPES_PATH = "data/shapes"


@dataclass
class DetectionTask:
    train_set: DetectionDataset
    val_set: DetectionDataset
    class_names: list[str]
    ground_truth: dict[str, Any]
    """The validation set in COCO format, category id = label + 1."""
    seed: int = 0
    base_size: int = 800
    multiscale: MultiScale | None = None
    issues: DataIssues = field(default_factory=DataIssues)
    prediction_format = "COCO results"

    # --- data --------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: RunConfig, rank: int = 0) -> DetectionTask:
        data = cfg.data
        issues = DataIssues(strict=data.strict)
        train_records, val_records, names = load_records(cfg, issues, rank)
        if not train_records:
            raise UserError("data: the training set holds no usable image with a box")
        if not val_records:
            raise UserError("data: the validation set holds no usable image")
        if issues.problems and rank == 0:
            print(issues.summary(), flush=True)
        max_size = data.longest_side if data.resize == "shorter_side" else None
        ratio = data.longest_side / data.size if data.resize == "shorter_side" else None
        train = DetectionDataset(train_records, train_transform(data.resize, data.size, max_size_ratio=ratio,
                                                                flip=data.flip, crop=data.crop,
                                                                color_jitter=data.color_jitter), issues)
        val = DetectionDataset(val_records, eval_transform(data.resize, data.size, max_size), issues)
        sizes = data.multiscale.sizes
        multiscale = None
        if sizes is not None:
            multiscale = MultiScale(default_sizes(data.size) if sizes == "auto" else sizes, data.multiscale.every,
                                    cfg.seed)
        return cls(train, val, names, coco_ground_truth(val_records, names), cfg.seed, data.size, multiscale,
                   issues)

    def size_at(self, step: int) -> int:
        """The training input size of optimizer step ``step``."""
        return self.multiscale.size_at(step) if self.multiscale is not None else self.base_size

    def sample_keys(self, step: int, indices: list[int]) -> list[tuple[int, int, int]]:
        """The dataset keys of one micro-batch of step ``step``: (index, the step's size, the sample's seed)."""
        size = self.size_at(step)
        return [(i, size, sample_seed(self.seed, step, i)) for i in indices]

    # --- model and loss ---------------------------------------------------------------------
    def build_model(self, cfg: RunConfig) -> nn.Module:
        from bigbatch.models.detectors import build_detector

        largest = max(self.multiscale.sizes) if self.multiscale is not None else cfg.data.size
        return build_detector(cfg.model.name, len(self.class_names), min_size=cfg.data.size,
                              max_size=max(cfg.data.longest_side, largest), weights=cfg.model.weights,
                              norm=cfg.model.norm)

    def synthetic_batch(self, cfg: RunConfig, micro_batch: int, device: torch.device
                        ) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        """Random images of the largest training input (the largest multi-scale size; with ``shorter_side``, the
        longer side at its cap), each with 4 random boxes: the peak memory ``bigbatch plan`` measures."""
        short = max(self.multiscale.sizes) if self.multiscale is not None else cfg.data.size
        long = short if cfg.data.resize == "letterbox" else round(short * cfg.data.longest_side / cfg.data.size)
        gen = torch.Generator().manual_seed(0)
        images, targets = [], []
        for _ in range(micro_batch):
            images.append(torch.rand(3, short, long, generator=gen).to(device))
            corner = torch.rand(4, 2, generator=gen) * torch.tensor([long * 0.7, short * 0.7])
            extent = 8 + torch.rand(4, 2, generator=gen) * torch.tensor([long * 0.3, short * 0.3])
            targets.append({"boxes": torch.cat([corner, corner + extent], dim=1).to(device),
                            "labels": torch.randint(0, len(self.class_names), (4,), generator=gen).to(device)})
        return images, targets

    def observe(self, micro_batches: list[tuple[list[torch.Tensor], list[dict[str, Any]]]]) -> None:
        """Count the data problems DataLoader workers found while decoding this step's samples."""
        for _, targets in micro_batches:
            self.issues.absorb_targets(targets)

    @staticmethod
    def loss(model: nn.Module, batch: tuple[list[torch.Tensor], list[dict[str, Any]]]) -> torch.Tensor:
        """The sum of the detector's losses (classification, box regression, ...) over the micro-batch."""
        images, targets = batch
        return sum(model(images, targets).values())

    # --- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def detect(self, model: nn.Module, batch_size: int, rank: int = 0, world: int = 1) -> list[dict[str, Any]]:
        """This rank's share of the validation set as COCO results (boxes in original image pixels)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        category_ids = [label + CATEGORY_ID_OFFSET for label in range(len(self.class_names))]
        results: list[dict[str, Any]] = []
        for images, targets in eval_batches(self.val_set, batch_size, rank, world):
            self.issues.absorb_targets(targets)
            outputs = model([image.to(device, non_blocking=True) for image in images])
            kept = [(t, o) for t, o in zip(targets, outputs, strict=True) if "substitute_for" not in t]
            mapped = [{**o, "boxes": boxes_to_original(o["boxes"].float().cpu(), t)} for t, o in kept]
            results += detections_to_coco([t["image_id"] for t, _ in kept], mapped, category_ids)
        model.train(was_training)
        return results

    def evaluate(self, model: nn.Module, batch_size: int, rank: int = 0, world: int = 1) -> dict[str, float]:
        """COCO box metrics (``mAP``, ``mAP50``, ..., ``AP/<class>``) over the whole validation set, on every rank.

        Metrics pycocotools leaves undefined (e.g. ``mAP_small`` without small objects) are left out."""
        detections = self.detect(model, batch_size, rank, world)
        if world > 1:
            gathered: list[Any] | None = [None] * world if rank == 0 else None
            dist.gather_object(detections, gathered, dst=0)
            detections = [d for part in gathered for d in part] if rank == 0 else []
        metrics = [self.score(detections)] if rank == 0 else [None]
        if world > 1:
            dist.broadcast_object_list(metrics, src=0)
        return metrics[0]

    def predict(self, model: nn.Module, batch_size: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """(COCO metrics, detections as COCO results) over the validation set, in this process."""
        detections = self.detect(model, batch_size)
        return self.score(detections), detections

    @staticmethod
    def save_predictions(path: Path, predictions: list[dict[str, Any]]) -> None:
        """The detections as a COCO results JSON file (written atomically)."""
        save_detections(path, predictions)

    def score(self, detections: list[dict[str, Any]]) -> dict[str, float]:
        metrics = evaluate_detections(self.ground_truth, detections, self.class_names)
        metrics = {k: v for k, v in metrics.items() if not math.isnan(v)}
        metrics["images"] = len(self.ground_truth["images"])
        return metrics

    def report(self, metrics: dict[str, float]) -> str:
        """The printed summary: the COCO table, Darknet's mAP@0.50 line and, when the data had problems, their
        count (those found while loading and those found while decoding during training and evaluation)."""
        summary = f"\n{self.issues.summary()}" if self.issues.problems else ""
        return f"{format_table(metrics, self.class_names)}\n{darknet_line(metrics)}{summary}"


def sample_seed(seed: int, step: int, index: int) -> int:
    """A sample's augmentation seed, from (run seed, step, dataset index) alone (numpy's SeedSequence mixing)."""
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1, np.uint64)[0] >> 1)


def load_records(cfg: RunConfig, issues: DataIssues, rank: int = 0
                 ) -> tuple[list[DetectionRecord], list[DetectionRecord], list[str]]:
    """(train records, val records, class names) of ``cfg.data``; the same classes in both splits."""
    data = cfg.data
    if data.name == "shapes":
        root = ensure_shapes(Path(data.path or DEFAULT_SHAPES_PATH), data.shapes_images, cfg.seed, rank)
        splits = [(root / split, root / "annotations" / f"{split}.json") for split in ("train", "val")]
        return _coco_splits(splits, data.classes, issues)
    if data.name == "coco":
        splits = [(Path(s.images), Path(s.annotations)) for s in (data.train, data.val)]
        for key, (images, annotations) in zip(("data.train", "data.val"), splits, strict=True):
            if not images.is_dir():
                raise UserError(f"{key}.images: {images} is not a folder")
            if not annotations.is_file():
                raise UserError(f"{key}.annotations: {annotations} does not exist")
        return _coco_splits(splits, data.classes, issues)
    from bigbatch.data.yolo import load_yolo

    train_source, val_source, train_split, val_split = yolo_splits(Path(data.path))
    train, names = load_yolo(train_source, issues, keep_empty=False, split=train_split)
    val, val_names = load_yolo(val_source, issues, keep_empty=True, split=val_split)
    if val_names != names:
        raise UserError(f"data.path: the validation images of {data.path} have other class names than the training")
    if data.classes is not None:
        train, names = _subset(train, names, data.classes)
        val, _ = _subset(val, val_names, data.classes)
    return train, val, names


def yolo_splits(path: Path) -> tuple[Path, Path, str, str]:
    """(train source, val source, and the split of each) of a YOLO ``data.path``: a Darknet ``.data`` file (its
    ``train`` and ``valid`` lists), a folder with ``train/`` and ``val/`` (each with ``images/`` and ``labels/``),
    or Ultralytics' layout, ``images/train``, ``images/val`` beside ``labels/train``, ``labels/val``."""
    if path.is_file():
        return path, path, "train", "valid"
    for train, val in ((path / "train", path / "val"), (path / "images" / "train", path / "images" / "val")):
        if train.is_dir() and val.is_dir():
            return train, val, "train", "train"  # a folder is one split; "train" only names the folder's role
    raise UserError(f"data.path: {path} is neither a Darknet .data file nor a folder with train/ and val/ (or "
                    f"images/train and images/val) beside their labels")


def _coco_splits(splits: list[tuple[Path, Path]], classes: list[str] | None, issues: DataIssues
                 ) -> tuple[list[DetectionRecord], list[DetectionRecord], list[str]]:
    (train_images, train_json), (val_images, val_json) = splits
    train, names = load_coco(train_images, train_json, classes, issues, keep_empty=False)
    val, val_names = load_coco(val_images, val_json, names, issues, keep_empty=True)
    if val_names != names:
        raise UserError(f"data.val: {val_json} has other categories than {train_json}")
    return train, val, names


def _subset(records: list[DetectionRecord], names: list[str], classes: list[str]
            ) -> tuple[list[DetectionRecord], list[str]]:
    """YOLO records restricted to ``classes`` (by name, in that order), labels renumbered (COCO's rule:
    ``class_mapping`` with the names file's lines as categories)."""
    classes, new_label = class_mapping(dict(enumerate(names)), classes, "the names file")
    kept = []
    for r in records:
        keep = np.array([int(label) in new_label for label in r.labels], dtype=bool)
        labels = np.array([new_label[int(label)] for label in r.labels[keep]], np.int64)
        kept.append(DetectionRecord(path=r.path, width=r.width, height=r.height, image_id=r.image_id,
                                    boxes=r.boxes[keep], labels=labels))
    return kept, classes


def count_train_images(cfg: RunConfig) -> int:
    """The training set's image count from its annotation file (before any image is checked), from
    ``data.train_images`` when the data is not at hand, or for a shapes set not generated yet from its size."""
    data = cfg.data
    if data.name == "shapes":
        path = Path(data.path or DEFAULT_SHAPES_PATH) / "annotations" / "train.json"
        if not path.is_file():
            from bigbatch.data.shapes import split_sizes

            return split_sizes(data.shapes_images)[0]
    elif data.name == "coco":
        path = Path(data.train.annotations)
    else:
        from bigbatch.data.yolo import load_yolo

        path = Path(data.path)
        if path.exists():
            source, _, split, _ = yolo_splits(path)
            return len(load_yolo(source, DataIssues(strict=data.strict), keep_empty=False, split=split)[0])
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            return len(json.load(f).get("images", []))
    if data.train_images is not None:
        return data.train_images
    raise UserError(f"data.train_images: {path} is not at hand; set data.train_images (the training set's size) to "
                    f"plan without the data")


def ensure_shapes(root: Path, images: int, seed: int, rank: int = 0) -> Path:
    """The generated shapes set at ``root``, written first (by rank 0; the other ranks wait) when it is not there.
    A folder that is neither empty nor a set bigbatch generated is never touched: it is an error naming it."""
    complete = (root / "annotations" / "val.json").is_file()
    if not complete and rank == 0:
        from bigbatch.data.shapes import generate_shapes, shapes_target

        target = shapes_target(root, "data.path")
        print(f"generating the shapes set ({images} images) in {target}", flush=True)
        generate_shapes(target, images, seed, key="data.path")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return root
