"""Image classification from a folder of class folders (``data.name: folder``): ImageNet's layout.

    DIR/train/CLASS/*.jpg|*.jpeg|*.png      the training images (sub-folders of a class folder too)
    DIR/val/CLASS/*                          the validation images, the same class names

Classes and files are listed as torchvision's ``ImageFolder`` lists them: class folders sorted by name
(label = position), then each class's files in sorted ``os.walk`` order; a file counts by its suffix
(``.jpg``, ``.jpeg``, ``.png``, any case). Nothing is read when the set is listed.

Each sample is decoded crop first and augmented from its own seed, as a shard's is (``data/formats/encoded_images.py``
holds what the two formats share).

A file that cannot be decoded (corrupt, truncated, not an image) is reported once, with its path and the reason,
and the next readable image of the set stands in for it (a batch keeps its size, the data order its shape); a set
none of whose images can be decoded is one error naming the set, with no warning for each image before it.
``data.strict: true`` instead decodes every image before training and stops at the first bad one, naming it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bigbatch.config.data_keys import DATASET_KEYS, detection_keys_unset
from bigbatch.data.formats.counts import train_images_given
from bigbatch.data.formats.encoded_images import (
    CropFirst,
    EncodedImages,
    image_input,
    preprocessing,
)
from bigbatch.data.pipeline.files import read_regular
from bigbatch.data.pipeline.images import inspect_images
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from bigbatch.floor.user_files import lies_inside
from bigbatch.registry import DATASETS

if TYPE_CHECKING:
    from bigbatch.config import DataConfig, RunConfig

SUFFIXES = (".jpg", ".jpeg", ".png")
SPLITS = ("train", "val")


# ----------------------------------------------------------------------------- listing


def find_classes(split_dir: Path) -> list[str]:
    """The class folders of a split, sorted by name as torchvision's ``ImageFolder.find_classes``."""
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


def _identity(path: str) -> tuple[int, int]:
    """The folder ``path`` leads to (links followed), as (device, inode)."""
    info = os.stat(path)
    return info.st_dev, info.st_ino


def _kind(path: str) -> str:
    """What a path that is not a regular file is, for a warning."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a link to nothing" if os.path.islink(path) else "unreadable"
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def walk_folder(top: str, ancestors: frozenset[tuple[int, int]],
                enter: Callable[[str], bool] | None = None) -> list[tuple[str, list[os.DirEntry]]]:
    """``(folder, its non-folder entries)`` of ``top`` and every folder below it, links to folders followed, in
    ``sorted(os.walk(top, followlinks=True))`` order: what torchvision's ``make_dataset`` walks.

    ``ancestors`` holds the folders above ``top`` (device, inode). A folder that leads back to one of the folders
    it is in (a link such as ``class0/loop -> .``) would make the walk endless: it is a ``UserError`` naming it.
    A folder that cannot be listed is passed over, as ``os.walk`` passes it over. ``enter(path)``, where given, says
    whether to walk a folder below ``top`` at all (a glob's walk leaves out what its pattern cannot reach)."""
    found: list[tuple[str, list[os.DirEntry]]] = []
    pending = [(top, ancestors | {_identity(top)})]
    while pending:
        folder, above = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        files = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows links, as os.walk(followlinks=True) does
            except OSError:
                is_dir = False
            if not is_dir:
                files.append(entry)
                continue
            if enter is not None and not enter(entry.path):
                continue
            try:
                identity = _identity(entry.path)
            except OSError:
                continue
            if identity in above:
                target = os.path.realpath(entry.path)
                raise UserError(f"{entry.path} leads back to {target}, a folder it is in: a cycle of links, which "
                                f"no listing ends; remove the link")
            pending.append((entry.path, above | {identity}))
        found.append((folder, files))
    return sorted(found, key=lambda item: item[0])


def list_samples(split_dir: Path, classes: Sequence[str], issues: DataIssues | None = None
                 ) -> list[tuple[str, int]]:
    """``(path, label)`` of every image file of each class, in torchvision's ``make_dataset`` order, except that a
    cycle of folder links is refused (``walk_folder``) and an image name on something other than a regular file
    (a FIFO, a device, a link to one, a link to nothing) is skipped with a warning (``issues``)."""
    issues = issues if issues is not None else DataIssues()  # an empty one is falsy (__len__)
    samples = []
    split_identity = frozenset({_identity(str(split_dir))})
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        if not os.path.isdir(class_dir):
            continue
        if _identity(class_dir) in split_identity:
            raise UserError(f"{class_dir} leads back to {os.path.realpath(class_dir)}, the folder it is in: a cycle "
                            f"of links, which no listing ends; remove the link")
        for _, files in walk_folder(class_dir, split_identity):
            for entry in sorted(files, key=lambda e: e.name):
                if not entry.name.lower().endswith(SUFFIXES):
                    continue
                try:
                    regular = entry.is_file()  # follows links; True only for a regular file
                except OSError:
                    regular = False
                if regular:
                    samples.append((entry.path, label))
                else:
                    issues.report(entry.path, None, f"{_kind(entry.path)}, not an image file: skipped")
    return samples


def first_outside(root: str | os.PathLike, samples: Sequence[tuple[str, int]]) -> str | None:
    """The first listed file whose real path (links and ``..`` followed) lies outside ``root``, None if none: a link
    to a file elsewhere (``/etc/passwd``), or a file under a link to a folder elsewhere. Each folder's real path is
    found once; a file in a folder inside ``root`` is resolved only when it is itself a link."""
    root_real = os.path.realpath(root)
    folders: dict[str, bool] = {}
    for path, _ in samples:
        folder = os.path.dirname(path)
        if folder not in folders:
            folders[folder] = lies_inside(root_real, folder)
        if folders[folder] and not os.path.islink(path):
            continue
        if not lies_inside(root_real, path):
            return path
    return None


def check_links_inside(data: DataConfig, samples: Sequence[tuple[str, int]]) -> None:
    """Unless ``data.follow_links``, refuse a listed file whose real path lies outside ``data.path``
    (:func:`first_outside`): bigbatch reads a data set only inside the folder it is given. A link farm (a set made
    of links to a shared store, which torchvision's ``ImageFolder`` follows) is read with ``data.follow_links:
    true``."""
    if data.follow_links:
        return
    outside = first_outside(data.path, samples)
    if outside is not None:
        raise UserError(f"data.path: {outside} leads outside {data.path} (links and .. followed); a folder set is "
                        f"read only inside data.path. If the links are yours (a set of links to a shared store), "
                        f"set data.follow_links=true to read what they lead to")


def split_dir(data: DataConfig, split: str) -> Path:
    _path_given(data)
    root = Path(data.path)
    path = root / split
    if not path.is_dir():
        raise UserError(f"data.path: {root} has no {split}/ folder (expected {root}/train/CLASS/*.jpg and "
                        f"{root}/val/CLASS/*.jpg, ImageNet's layout)")
    return path


def list_split(data: DataConfig, split: str, classes: Sequence[str], issues: DataIssues | None = None
               ) -> list[tuple[str, int]]:
    """The split's ``(path, label)`` samples (:func:`list_samples`); a split of no image file is one error, not
    first a warning for each file skipped."""
    issues = issues if issues is not None else DataIssues()
    with issues.held():
        try:
            samples = list_samples(split_dir(data, split), classes, issues)
        except UserError as error:
            raise UserError(f"data.path: {error}") from None
        if not samples:
            raise UserError(f"data.path: {split_dir(data, split)} holds no .jpg, .jpeg or .png file in a class "
                            f"folder{issues.first()}")
    return samples


class FolderImages(EncodedImages):
    """``(path, label)`` samples: image files."""

    def __init__(self, samples: Sequence[tuple[str, int]], preprocess: CropFirst, issues: DataIssues,
                 name: str = "the set", scored: bool = False) -> None:
        super().__init__(preprocess, issues, name, scored)
        self.samples = list(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def source(self, index: int) -> bytearray:
        return read_regular(self.samples[index][0])

    def label(self, index: int) -> int:
        return self.samples[index][1]

    def where(self, index: int) -> str:
        return self.samples[index][0]


# ----------------------------------------------------------------------------- the format


def load(cfg: RunConfig) -> tuple[FolderImages, FolderImages, list[str]]:
    """(train, val, class names: the class folders, sorted); with ``data.strict`` every image is decoded once first."""
    data = cfg.data
    classes = find_classes(split_dir(data, "train"))
    if not classes:
        raise UserError(f"data.path: {split_dir(data, 'train')} holds no class folder")
    extra = sorted(set(find_classes(split_dir(data, "val"))) - set(classes))
    if extra:
        raise UserError(f"data.path: {split_dir(data, 'val')} has class folders the training set lacks: "
                        f"{', '.join(extra[:5])}")
    issues = DataIssues(strict=data.strict)
    train, val = list_split(data, "train", classes, issues), list_split(data, "val", classes, issues)
    check_links_inside(data, train + val)
    if data.strict:
        paths = [path for path, _ in train + val]
        for path, (_, problem) in zip(paths, inspect_images(paths, decode=True), strict=True):
            if problem is not None:
                issues.report(path, None, problem)
    chosen = preprocessing(data)
    return (FolderImages(train, chosen.train, issues, f"the training set {split_dir(data, 'train')}"),
            FolderImages(val, chosen.eval, issues, f"the validation set {split_dir(data, 'val')}", scored=True),
            classes)


def train_images(cfg: RunConfig) -> int:
    """The training images, listed (not read); ``data.train_images`` when the folder is not at hand (``show``,
    ``schedule`` and ``scale`` work before the data is copied); neither: ``DataNotAtHand``."""
    data = cfg.data
    if data.path is None or not (Path(data.path) / "train").is_dir():
        return train_images_given(None if data.path is None else Path(data.path), data)
    return len(list_split(data, "train", find_classes(split_dir(data, "train"))))


def _path_given(data: DataConfig) -> None:
    """Training and evaluation read the images: ``data.path`` must be given, and be there (planning needs only the
    count)."""
    if data.path is None:
        raise UserError("data.path: missing; training and evaluation read the folder holding train/CLASS/* and "
                        "val/CLASS/*")
    if not Path(data.path).exists():
        raise UserError(f"data.path: {data.path} does not exist; expected the folder holding train/CLASS/* and "
                        "val/CLASS/*")


DATASETS.register("folder", load, task="classification", count=train_images, given=_path_given,
                  fields=DATASET_KEYS["folder"], image_input=image_input, check=detection_keys_unset)
