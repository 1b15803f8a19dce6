"""What dataset formats share: the training set's size from ``data.train_images`` when the data is not at hand
(``show``, ``schedule`` and ``scale`` plan before it is downloaded; a COCO file's count is
``coco.images_in_annotations``), and :class:`DataNotAtHand`, what a format's ``count`` raises when it can do
neither: those commands then plan without the size (the epochs are unknown), and a run says it needs the data.

A dataset format is one module that registers itself in ``registry.DATASETS`` (see its docstring for the
contract); these helpers serve the formats' ``count``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bigbatch.errors import UserError

if TYPE_CHECKING:
    from bigbatch.config import DataConfig


class DataNotAtHand(UserError):
    """The training set cannot be counted: its data is not at hand and ``data.train_images`` is not set. The message
    names the key that would give the data."""


def train_images_given(path: Path | None, data: DataConfig, key: str = "data.path") -> int:
    """``data.train_images``, for a training set whose ``path`` (given by ``key``) is not at hand; unset,
    :class:`DataNotAtHand`."""
    if data.train_images is not None:
        return data.train_images
    where = "not set" if path is None else f"{path} does not exist" if not path.exists() else f"{path} is not at hand"
    raise DataNotAtHand(f"{key}: {where}; give the data, or set data.train_images (the training set's size) to plan "
                        "without it")
