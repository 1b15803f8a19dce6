"""Tasks: the only place that knows what a batch and a model output look like."""

from __future__ import annotations

from bigbatch.config import RunConfig
from bigbatch.tasks.classification import ClassificationTask


def build_task(cfg: RunConfig) -> ClassificationTask:
    if cfg.task == "classification":
        return ClassificationTask.from_config(cfg)
    raise AssertionError(f"unhandled task {cfg.task!r}")  # the config only admits known tasks


def train_set_size(cfg: RunConfig) -> int:
    """Images in the training set (for the batch plan), without building a model."""
    return len(build_task(cfg).train_set)
