"""Tasks: the only place that knows what a batch and a model output look like (the contract: ``tasks/base.py``).

Each task registers its class in ``registry.TASKS``; the data of a run comes from the dataset format
``data.name`` registered in ``registry.DATASETS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bigbatch.config import RunConfig
from bigbatch.errors import UserError
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


@contextmanager
def counted_if_at_hand(cfg: RunConfig) -> Iterator[int | None]:
    """For ``show`` and ``schedule``, which plan before the data is at hand: the training set's size
    (:func:`train_set_size`), or None when it cannot be counted (the epochs are then unknown). A length counted in
    epochs, met inside the block without the size, is one error naming its key and why the set could not be counted
    (``data.path: /data does not exist``)."""
    from bigbatch.batching import EpochsUnknown
    from bigbatch.data.formats.counts import DataNotAtHand

    try:
        size, missing = train_set_size(cfg), None
    except DataNotAtHand as e:
        size, missing = None, e
    try:
        yield size
    except EpochsUnknown as e:
        key = str(e).partition(": ")[0]
        raise UserError(f"{key}: counted in epochs, but the training set cannot be counted: {missing}; or give "
                        f"{key} in steps") from None


def check_data_given(cfg: RunConfig) -> None:
    """For a command that reads the data (train, eval, plan, profile, data bench): the dataset format's ``given``
    check, if it registered one (``data.path`` named and there), as a ``UserError`` before any work. ``show``,
    ``schedule`` and ``scale`` plan without the data and skip it."""
    given = DATASETS.get(cfg.data.name).info.get("given")
    if given is not None:
        given(cfg.data)
