"""The task contract: what the trainer, ``bigbatch eval`` and ``bigbatch plan`` need from a task, written down.

A task is the only place that knows what a batch and a model output look like. It registers its class in
``bigbatch.registry.TASKS`` under the ``task`` name, with ``metrics`` (the names ``eval.metric`` may take, the
default first), optionally ``metric_prefixes`` (per-class metrics such as detection's ``AP/<class>``), and
``model_kind`` (what its models are called in an error: "classifier", "detector"). Its data comes from a dataset
format and its model from a model family registered for the same task (``DATASETS``, ``MODELS``). The engine
never asks which task it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from bigbatch.batching import BatchPlan
from bigbatch.config import RunConfig


class Task(Protocol):
    train_set: Dataset
    val_set: Dataset
    class_names: list[str]
    """The classes' names in label order (a checkpoint keeps them: ``bigbatch predict`` names what it finds)."""
    prediction_format: str | None
    """What ``save_predictions`` writes (``"COCO results"``), or None when the task exports none."""

    @classmethod
    def from_config(cls, cfg: RunConfig, rank: int = 0) -> Task:
        """The task with its datasets loaded (``rank``: the process; rank 0 prints and prepares shared files)."""

    def set_plan(self, plan: BatchPlan) -> None:
        """The run's batch plan, made from this task's training set once it is loaded: what the task draws per step
        (detection's multi-scale sizes) ends with the plan's steps. Not called for an evaluation."""

    def build_model(self, cfg: RunConfig) -> nn.Module:
        """A fresh model for this task's data (random weights unless the config names a weights file)."""

    @staticmethod
    def model_for(cfg: RunConfig, class_names: list[str]) -> nn.Module:
        """The same model as ``build_model`` for these classes, without loading the data (``bigbatch predict``)."""

    @staticmethod
    def image_input(cfg: RunConfig) -> Any:
        """What turns one decoded image into the model's input as the validation set's images are
        (``bigbatch predict``)."""

    def sample_keys(self, step: int, indices: list[int]) -> list[Any]:
        """The dataset keys of one micro-batch of optimizer step ``step`` (``indices``: positions in the training
        set): the indices themselves, or keys that carry per-step facts (multi-scale size, augmentation seed)."""

    def observe(self, micro_batches: list[Any]) -> None:
        """See one step's micro-batches as loaded (before they go to the device), e.g. to count data problems."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor | dict[str, torch.Tensor]:
        """The mean loss of one micro-batch (a scalar the step scales and back-propagates), or its terms by name
        (``loss_<name>``): the loss is their sum, and the training record shows each term's mean over the batch."""

    def evaluate(self, model: nn.Module, batch_size: int, rank: int = 0, world: int = 1) -> dict[str, float]:
        """Metrics over the whole validation set, each image counted once, the same on every rank."""

    def predict(self, model: nn.Module, batch_size: int, progress: bool = False) -> tuple[dict[str, float], list[Any]]:
        """(metrics, predictions) over the validation set in one process (``bigbatch eval``); ``progress``: a
        progress bar on a terminal."""

    def save_predictions(self, path: Path, predictions: list[Any]) -> None:
        """Write ``predict``'s predictions in ``prediction_format``."""

    def report(self, metrics: dict[str, float]) -> str:
        """The printed summary of final metrics."""

    def synthetic_batch(self, cfg: RunConfig, micro_batch: int, device: torch.device) -> Any:
        """Random data of the largest training input, shaped as ``loss`` takes it (``bigbatch plan`` measures the
        peak memory of a training step on it)."""
