"""Tasks: the only place that knows what a batch and a model output look like.

A task holds ``train_set`` and ``val_set`` and gives ``build_model(cfg)``, ``loss(model, micro_batch)``,
``evaluate(model, batch_size, rank, world) -> metrics`` and ``report(metrics) -> str``; a task may also
give ``sample_keys(step, indices)``, the dataset keys of a micro-batch (detection: multi-scale sizes and
per-sample augmentation seeds).
"""

from __future__ import annotations

from typing import Any

from bigbatch.config import RunConfig


def build_task(cfg: RunConfig, rank: int = 0) -> Any:
    if cfg.task == "classification":
        from bigbatch.tasks.classification import ClassificationTask

        return ClassificationTask.from_config(cfg)
    if cfg.task == "detection":
        from bigbatch.tasks.detection import DetectionTask

        return DetectionTask.from_config(cfg, rank)
    raise AssertionError(f"unhandled task {cfg.task!r}")  # the config only admits known tasks


def train_set_size(cfg: RunConfig) -> int:
    """Images in the training set (for the batch plan), without building a model; for detection without
    loading the data (``show`` works before the data is downloaded)."""
    if cfg.task == "detection":
        from bigbatch.tasks.detection import count_train_images

        return count_train_images(cfg)
    return len(build_task(cfg).train_set)
