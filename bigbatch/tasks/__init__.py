"""Tasks: the only place that knows what a batch and a model output look like (the contract: ``tasks/base.py``).

Each task registers its class in ``registry.TASKS``; the data of a run comes from the dataset format
``data.name`` registered in ``registry.DATASETS``.
"""

from __future__ import annotations

from bigbatch.config import RunConfig
from bigbatch.registry import DATASETS, TASKS
from bigbatch.tasks.base import Task


def build_task(cfg: RunConfig, rank: int = 0) -> Task:
    """The task ``cfg.task`` (as registered in ``TASKS``), its data loaded."""
    return TASKS.get(cfg.task).obj.from_config(cfg, rank)


def train_set_size(cfg: RunConfig) -> int:
    """Images in the training set (for the batch plan), counted by the dataset format (its ``count``) without
    loading the data or building a model; a ``UserError`` (``DataNotAtHand``) when the data is not at hand and
    ``data.train_images`` is not set."""
    return DATASETS.get(cfg.data.name).info["count"](cfg)


def train_set_size_if_known(cfg: RunConfig) -> int | None:
    """:func:`train_set_size`, or None when the data is not at hand: ``show``, ``schedule`` and ``scale`` plan
    without it (the epochs are then unknown, and a length counted in epochs is one error naming its key)."""
    from bigbatch.data.formats.counts import DataNotAtHand

    try:
        return train_set_size(cfg)
    except DataNotAtHand:
        return None


def check_data_given(cfg: RunConfig) -> None:
    """For a command that reads the data (train, eval, plan, profile, data bench): the dataset format's ``given``
    check, if it registered one (``data.path`` named and there), as a ``UserError`` before any work. ``show``,
    ``schedule`` and ``scale`` plan without the data and skip it."""
    given = DATASETS.get(cfg.data.name).info.get("given")
    if given is not None:
        given(cfg.data)
