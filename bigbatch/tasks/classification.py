"""Image classification: cross-entropy loss (label smoothing, an auxiliary head), top-1 / top-5 accuracy.

A batch is ``(images, labels)``, or ``(images, labels, problems)`` from image files (``data/formats/folder.py``: the
unreadable files a DataLoader worker replaced, counted here).

The loss, as the Inception v3 TPU code has it (``loss.*``):

    L = CE_s(logits, y) + aux_weight * CE_s(aux_logits, y)     (the second term with an auxiliary head only)

where CE_s is cross-entropy against labels smoothed by s = ``loss.label_smoothing``: the target puts 1 - s on the
true class and s / K on every class (``torch.nn.functional.cross_entropy(label_smoothing=s)``, TF's
``softmax_cross_entropy(label_smoothing=s)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig
from bigbatch.data.formats.encoded_images import STAND_IN
from bigbatch.data.pipeline.loader import eval_batches
from bigbatch.data.pipeline.order import sample_seed
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.registry import DATASETS, TASKS


@dataclass
class ClassificationTask:
    train_set: Dataset
    val_set: Dataset
    num_classes: int
    in_channels: int = 3
    label_smoothing: float = 0.0
    aux_weight: float = 0.0
    """The auxiliary head's share of the loss (used when the model returns auxiliary logits in training)."""
    seed: int = 0
    """The run's seed, from which each sample's augmentation seed is drawn."""
    issues: DataIssues | None = None
    """Problems with the data (unreadable files), when the set is read from files."""
    class_names: list[str] | None = None
    """The classes' names (the dataset format's: folder names, the shard index's, the digits); None: their
    indices."""
    prediction_format = None
    """Classification exports no predictions (``bigbatch eval`` reports the metrics)."""

    def __post_init__(self) -> None:
        if self.class_names is None:
            self.class_names = [str(label) for label in range(self.num_classes)]

    @classmethod
    def from_config(cls, cfg: RunConfig, rank: int = 0) -> ClassificationTask:
        """The task on the sets of the dataset format ``data.name`` (as registered in ``DATASETS``)."""
        train, val, classes = DATASETS.get(cfg.data.name).obj(cfg)  # the class names, or their number
        names = [str(label) for label in range(classes)] if isinstance(classes, int) else list(map(str, classes))
        return cls(train, val, len(names), label_smoothing=cfg.loss.label_smoothing, aux_weight=cfg.loss.aux_weight,
                   seed=cfg.seed, issues=getattr(train, "issues", None), class_names=names)

    def set_plan(self, plan: BatchPlan) -> None:
        pass  # nothing is drawn per step

    def build_model(self, cfg: RunConfig) -> nn.Module:
        return self.model_for(cfg, self.class_names)

    @staticmethod
    def model_for(cfg: RunConfig, class_names: list[str]) -> nn.Module:
        """The classifier ``model.name`` for these classes, without the data (``bigbatch predict``)."""
        from bigbatch.models import build_classifier

        return build_classifier(cfg.model, len(class_names), 3, cfg.data.size)

    @staticmethod
    def image_input(cfg: RunConfig) -> Any:
        """What turns one image into the model's input as the validation set's images are (the dataset format's
        ``image_input``: ``from_pixels``, and ``from_file`` where a file is read another way)."""
        from bigbatch.errors import UserError

        make = DATASETS.get(cfg.data.name).info.get("image_input")
        if make is None:
            raise UserError(f"data.name: the {cfg.data.name} format does not say how an image becomes its models' "
                            "input; bigbatch predict cannot run its classifiers on images")
        return make(cfg)

    def sample_keys(self, step: int, indices: list[int]) -> list[Any]:
        """A micro-batch's keys: the indices, each with its augmentation seed when the set augments (its crop
        and colours then depend on (seed, step, index) alone)."""
        if not getattr(self.train_set, "augments", False):
            return indices
        return [(i, sample_seed(self.seed, step, i)) for i in indices]

    def observe(self, micro_batches: list[tuple[Any, ...]]) -> None:
        """Count the unreadable files DataLoader workers replaced in this step's samples."""
        if self.issues is not None:
            for batch in micro_batches:
                if len(batch) > 2:
                    self.issues.absorb(batch[2])

    def synthetic_batch(self, cfg: RunConfig, micro_batch: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Random images and labels of the training shape (for measuring memory: ``bigbatch plan``)."""
        size = cfg.data.size
        images = torch.randn(micro_batch, self.in_channels, size, size, device=device)
        return images, torch.randint(0, self.num_classes, (micro_batch,), device=device)

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Mean (label-smoothed) cross-entropy over the micro-batch, plus the auxiliary head's, weighted."""
        images, labels = batch[0], batch[1]
        output = model(images)
        if not hasattr(output, "logits"):
            return F.cross_entropy(output, labels, label_smoothing=self.label_smoothing)
        # torchvision's InceptionOutputs (logits, aux_logits) or GoogLeNetOutputs (logits, aux_logits2, aux_logits1)
        loss = F.cross_entropy(output.logits, labels, label_smoothing=self.label_smoothing)
        for aux in output[1:]:
            if aux is not None:
                loss = loss + self.aux_weight * F.cross_entropy(aux, labels, label_smoothing=self.label_smoothing)
        return loss

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch_size: int, rank: int = 0, world: int = 1, progress: bool = False
                 ) -> dict[str, float]:
        """Top-1, top-5 and mean loss over the validation set, each readable image counted once (an unreadable one,
        reported, is not scored: the image standing in for it carries ``STAND_IN``)."""
        was_training = model.training
        model.eval()
        k = min(5, self.num_classes)
        device = next(model.parameters()).device
        totals = torch.zeros(4, dtype=torch.float64)  # images, top1 hits, top5 hits, loss sum
        for batch in eval_batches(self.val_set, batch_size, rank, world, progress=progress):
            images, labels = batch[0], batch[1]
            scored = labels != STAND_IN  # an image standing in for an unreadable one is not scored twice
            if not scored.all():
                if not scored.any():
                    continue
                images, labels = images[scored], labels[scored]
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            logits = model(images)
            topk = logits.topk(k, dim=1).indices
            hits = topk == labels[:, None]
            totals += torch.tensor(
                [
                    len(labels),
                    hits[:, 0].sum().item(),
                    hits.any(dim=1).sum().item(),
                    F.cross_entropy(logits.float(), labels, reduction="sum").item(),
                ],
                dtype=torch.float64,
            )
        model.train(was_training)
        if world > 1:  # NCCL reduces device tensors only
            totals = totals.to(device)
            torch.distributed.all_reduce(totals)
            totals = totals.cpu()
        images, top1, top5, loss = totals.tolist()
        return {"top1": 100.0 * top1 / images, "top5": 100.0 * top5 / images, "loss": loss / images,
                "images": int(images)}

    def predict(self, model: nn.Module, batch_size: int, progress: bool = False) -> tuple[dict[str, float], list[Any]]:
        """The metrics, and no predictions (``prediction_format`` is None)."""
        return self.evaluate(model, batch_size, progress=progress), []

    def save_predictions(self, path: Path, predictions: list[Any]) -> None:
        raise TypeError("classification exports no predictions (prediction_format is None); callers check it first")

    def report(self, metrics: dict[str, float]) -> str:
        """The final metrics and, when files could not be read, their count."""
        line = "  ".join(f"{k} {v:.2f}" for k, v in metrics.items() if k != "images")
        return f"{line}\n{self.issues.summary()}" if self.issues is not None and self.issues.problems else line


def metric_text(name: str, value: float) -> str:
    """top1 and top5 are percentages already; the loss is a loss."""
    return f"{value:.4f}" if name == "loss" else f"{value:.2f} %"


TASKS.register("classification", ClassificationTask, metrics=("top1", "top5", "loss"), model_kind="classifier",
               metric_text=metric_text)
