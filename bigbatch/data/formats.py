"""What dataset formats share: the training set's size read from a COCO annotation file, or from
``data.train_images`` when the data is not at hand (``show``, ``schedule`` and ``scale`` plan before it is
downloaded).

A dataset format is one module that registers itself in ``registry.DATASETS`` (see its docstring for the
contract); these helpers serve the formats' ``count``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from bigbatch.errors import UserError

if TYPE_CHECKING:
    from bigbatch.config import DataConfig


def images_in_annotations(path: Path, data: DataConfig) -> int:
    """The image count of a COCO annotation file (before any image is checked), or :func:`train_images_given`."""
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            return len(json.load(f).get("images", []))
    return train_images_given(path, data)


def train_images_given(path: Path, data: DataConfig) -> int:
    """``data.train_images``, for a training set whose ``path`` is not at hand; unset, a ``UserError``."""
    if data.train_images is not None:
        return data.train_images
    raise UserError(f"data.train_images: {path} is not at hand; set data.train_images (the training set's size) to "
                    f"plan without the data")
