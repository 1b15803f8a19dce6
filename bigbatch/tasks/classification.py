"""Image classification: cross-entropy loss, top-1 / top-5 accuracy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from bigbatch.config import RunConfig
from bigbatch.data.loader import eval_batches
from bigbatch.registry import DATASETS, TASKS


@dataclass
class ClassificationTask:
    train_set: Dataset
    val_set: Dataset
    num_classes: int
    in_channels: int = 3
    prediction_format = None
    """Classification exports no predictions (``bigbatch eval`` reports the metrics)."""

    @classmethod
    def from_config(cls, cfg: RunConfig, rank: int = 0) -> ClassificationTask:
        """The task on the sets of the dataset format ``data.name`` (as registered in ``DATASETS``)."""
        train, val, num_classes = DATASETS.get(cfg.data.name).obj(cfg)
        return cls(train, val, num_classes)

    def build_model(self, cfg: RunConfig) -> nn.Module:
        from bigbatch.models import build_classifier

        return build_classifier(cfg.model, self.num_classes, self.in_channels)

    @staticmethod
    def sample_keys(step: int, indices: list[int]) -> list[int]:
        """A micro-batch is read by its indices alone."""
        return indices

    @staticmethod
    def observe(micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Nothing to count: the images are in memory and checked when loaded."""

    def synthetic_batch(self, cfg: RunConfig, micro_batch: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Random images and labels of the training shape (for measuring memory: ``bigbatch plan``)."""
        size = cfg.data.size
        images = torch.randn(micro_batch, self.in_channels, size, size, device=device)
        return images, torch.randint(0, self.num_classes, (micro_batch,), device=device)

    @staticmethod
    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy over the micro-batch."""
        images, labels = batch
        return F.cross_entropy(model(images), labels)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch_size: int, rank: int = 0, world: int = 1) -> dict[str, float]:
        """Top-1, top-5 and mean loss over the validation set, each image counted once."""
        was_training = model.training
        model.eval()
        k = min(5, self.num_classes)
        device = next(model.parameters()).device
        totals = torch.zeros(4, dtype=torch.float64)  # images, top1 hits, top5 hits, loss sum
        for images, labels in eval_batches(self.val_set, batch_size, rank, world):
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

    def predict(self, model: nn.Module, batch_size: int) -> tuple[dict[str, float], list[Any]]:
        """The metrics, and no predictions (``prediction_format`` is None)."""
        return self.evaluate(model, batch_size), []

    def save_predictions(self, path: Path, predictions: list[Any]) -> None:
        raise NotImplementedError("classification exports no predictions")

    @staticmethod
    def report(metrics: dict[str, float]) -> str:
        return "  ".join(f"{k} {v:.2f}" for k, v in metrics.items() if k != "images")


TASKS.register("classification", ClassificationTask, metrics=("top1", "top5", "loss"), model_kind="classifier")
