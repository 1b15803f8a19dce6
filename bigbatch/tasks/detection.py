"""Object detection: the summed detector losses, and COCO mAP on the validation set.

A batch is ``(list of images, list of targets)``: images differ in size, and the detector pads them into one
tensor itself. Each training sample is read with the key ``(index, size, sample_seed)``: ``size`` is the
step's multi-scale size, the same on every rank and after a resume (``data/transforms/multiscale.py``), and the
augmentation of a sample depends on ``sample_seed`` alone, drawn from (seed, step, index), so that it is the
same whatever the layout, the workers or a resume.

Evaluation: every rank runs its share of the validation images (indices ``rank, rank + world, ...``), maps
its boxes back to the original images (``boxes_to_original``), and rank 0 gathers all detections and scores
them with faster-coco-eval (``tasks/coco_eval.py``); the metrics go back to every rank.

Category ids: detections and the evaluation's ground truth carry the dataset's own category ids, label ``l``
being ``category_ids[l]`` (the validation annotation file's id of that class, ``data.classes`` subsets
included), so that a saved COCO results file scores against the original annotation file, with pycocotools,
faster-coco-eval or the COCO server, as bigbatch scores it. A set without ids (YOLO) numbers them label + 1 and its
images by their place in the list, unless a COCO file of the same images gives both (``data.annotations``,
``data/formats/coco_ids.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig
from bigbatch.data.formats.coco import category_ids_of, coco_ground_truth
from bigbatch.data.formats.detection import DetectionDataset, records_name
from bigbatch.data.pipeline.images import boxes_to_stored
from bigbatch.data.pipeline.loader import eval_batches
from bigbatch.data.pipeline.order import sample_seed
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.data.transforms.det_transforms import EvalTransform, boxes_to_original, eval_transform, train_transform
from bigbatch.data.transforms.multiscale import MultiScale, draw_for
from bigbatch.errors import UserError
from bigbatch.registry import DATASETS, TASKS
from bigbatch.tasks.coco_eval import (
    darknet_line,
    detections_to_coco,
    evaluate_detections,
    format_table,
    save_detections,
)


@dataclass
class DetectionTask:
    train_set: DetectionDataset
    val_set: DetectionDataset
    class_names: list[str]
    ground_truth: dict[str, Any]
    """The validation set in COCO format, category id = ``category_ids[label]``."""
    seed: int = 0
    base_size: int = 800
    multiscale: MultiScale | None = None
    issues: DataIssues = field(default_factory=DataIssues)
    category_ids: list[int] | None = None
    """The dataset's category id of each label (a COCO annotation file's ids), or None for a set without ids
    (YOLO): then label + 1."""
    ids_from: str | None = None
    """For a set whose own files carry no ids (YOLO), the COCO file whose image and category ids it took."""
    prediction_format = "COCO results"

    # --- data --------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: RunConfig, rank: int = 0) -> DetectionTask:
        """The task on the records of the dataset format ``data.name`` (as registered in ``DATASETS``)."""
        data = cfg.data
        issues = DataIssues(strict=data.strict)
        with issues.held():  # a set with no usable image is one error, not first a warning for each image
            train_records, val_records, names = DATASETS.get(data.name).obj(cfg, issues, rank)
            if not train_records:
                raise UserError(f"data: the training set holds no usable image with a box{issues.first()}")
            if not val_records:
                raise UserError(f"data: the validation set holds no usable image{issues.first()}")
        category_ids = getattr(names, "category_ids", None)  # coco.ClassNames; a plain list: a set without ids
        ids_from = getattr(names, "ids_from", None)
        names = list(names)
        if issues.problems and rank == 0:
            print(issues.summary(), flush=True)
        ratio = data.longest_side / data.size if data.resize == "shorter_side" else None
        train = DetectionDataset(train_records, train_transform(data.resize, data.size, max_size_ratio=ratio,
                                                                flip=data.flip, crop=data.crop,
                                                                color_jitter=data.color_jitter,
                                                                crop_size=data.crop_size, jitter=data.jitter,
                                                                jitter_resize=data.jitter_resize, hue=data.hue,
                                                                saturation=data.saturation,
                                                                exposure=data.exposure, mosaic=data.mosaic,
                                                                mosaic_bound=data.mosaic_bound), issues,
                                 records_name("the training set", train_records))
        val = DetectionDataset(val_records, cls.image_input(cfg), issues,
                               records_name("the validation set", val_records))
        multiscale = None
        if data.multiscale.sizes is not None:  # the run's end rule (the last ``final`` steps) comes with its plan
            settings = data.multiscale
            draw = draw_for(settings.sizes, data.size, settings.range)
            multiscale = MultiScale(draw, settings.every, cfg.seed, final=settings.final)
        return cls(train, val, names, coco_ground_truth(val_records, names, category_ids), cfg.seed, data.size,
                   multiscale, issues, category_ids, ids_from)

    def set_plan(self, plan: BatchPlan) -> None:
        """The multi-scale sizes end with the plan's steps: the last ``data.multiscale.final`` at the largest."""
        if self.multiscale is not None:
            self.multiscale.stop = plan.steps

    def size_at(self, step: int) -> int:
        """The training input size of optimizer step ``step``."""
        return self.multiscale.size_at(step) if self.multiscale is not None else self.base_size

    def sample_keys(self, step: int, indices: list[int]) -> list[tuple[int, int, int]]:
        """The dataset keys of one micro-batch of step ``step``: (index, the step's size, the sample's seed)."""
        size = self.size_at(step)
        return [(i, size, sample_seed(self.seed, step, i)) for i in indices]

    # --- model and loss ---------------------------------------------------------------------
    def build_model(self, cfg: RunConfig) -> nn.Module:
        """The detector ``model.name`` (as registered in ``MODELS``) for these classes and input sizes."""
        return self.model_for(cfg, self.class_names)

    @staticmethod
    def model_for(cfg: RunConfig, class_names: list[str]) -> nn.Module:
        """The detector ``model.name`` for these classes and the config's input sizes, without the data (``bigbatch
        predict``)."""
        from bigbatch.models import build_model

        settings = cfg.data.multiscale
        largest = cfg.data.size
        if settings.sizes is not None:
            largest = max(draw_for(settings.sizes, cfg.data.size, settings.range).sizes)
        return build_model(cfg.model, len(class_names), min_size=cfg.data.size,
                           max_size=max(cfg.data.longest_side, largest))

    @staticmethod
    def image_input(cfg: RunConfig) -> EvalTransform:
        """The evaluation transform (``data.resize`` to ``data.size``, the longer side capped at
        ``data.longest_side`` for ``shorter_side``), which ``boxes_to_original`` undoes."""
        data = cfg.data
        max_size = data.longest_side if data.resize == "shorter_side" else None
        return eval_transform(data.resize, data.size, max_size)

    def synthetic_batch(self, cfg: RunConfig, micro_batch: int, device: torch.device
                        ) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        """Random images of the largest training input (the largest multi-scale size; with ``shorter_side``, the
        longer side at its cap; both sides at most ``data.crop_size``), each with 4 random boxes: the peak memory
        ``bigbatch plan`` measures."""
        short = max(self.multiscale.sizes) if self.multiscale is not None else cfg.data.size
        long = short if cfg.data.resize != "shorter_side" else round(short * cfg.data.longest_side / cfg.data.size)
        if cfg.data.crop_size is not None:  # the training crop bounds both sides
            short, long = min(short, cfg.data.crop_size), min(long, cfg.data.crop_size)
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
    def loss(model: nn.Module, batch: tuple[list[torch.Tensor], list[dict[str, Any]]]) -> dict[str, torch.Tensor]:
        """The detector's losses over the micro-batch (classification, box regression, ...), as its terms: the loss
        is their sum. Named as the training record shows them: ``loss_<name>`` (torchvision's FCOS and RetinaNet name
        theirs ``classification``, ``bbox_regression``, ...; Faster R-CNN's and Darknet's have the prefix)."""
        images, targets = batch
        return {name if name.startswith("loss_") else f"loss_{name}": value
                for name, value in model(images, targets).items()}

    # --- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def detect(self, model: nn.Module, batch_size: int, rank: int = 0, world: int = 1, progress: bool = False
               ) -> list[dict[str, Any]]:
        """This rank's share of the validation set as COCO results (boxes in original image pixels)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        category_ids = category_ids_of(self.class_names, self.category_ids)
        results: list[dict[str, Any]] = []
        for images, targets in eval_batches(self.val_set, batch_size, rank, world, progress=progress):
            self.issues.absorb_targets(targets)
            outputs = model([image.to(device, non_blocking=True) for image in images])
            kept = [(t, o) for t, o in zip(targets, outputs, strict=True) if "substitute_for" not in t]
            # to the original image, then (an EXIF-turned image of a YOLO set) to its stored pixels, a COCO file's
            mapped = [{**o, "boxes": boxes_to_stored(boxes_to_original(o["boxes"].float().cpu(), t),
                                                     t.get("orientation", 1), tuple(t["orig_size"])[::-1])}
                      for t, o in kept]
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

    def predict(self, model: nn.Module, batch_size: int, progress: bool = False
                ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """(COCO metrics, detections as COCO results) over the validation set, in this process."""
        detections = self.detect(model, batch_size, progress=progress)
        return self.score(detections), detections

    @staticmethod
    def save_predictions(path: Path, predictions: list[dict[str, Any]]) -> None:
        """The detections as a COCO results JSON file (written atomically), with the dataset's category ids."""
        save_detections(path, predictions)

    @property
    def predictions_note(self) -> str:
        """How the saved detections number the images and categories (printed by ``eval --save-detections``)."""
        if self.category_ids is None:
            return ("image id = place in the image list, category id = class index + 1: the data set has no ids "
                    "(data.annotations: a COCO file of the same images, for its ids)")
        if self.ids_from is not None:
            return f"image and category ids of {self.ids_from}"
        return "category ids of the annotation file"

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


TASKS.register("detection", DetectionTask, metrics=("mAP", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large"),
               metric_prefixes=("AP/", "AP50/"), model_kind="detector",
               metric_text=lambda name, value: f"{100 * value:.2f} %")  # COCO's fractions, as the report's table
