"""``bigbatch data convert SRC --to coco|yolo --out DIR``: a detection set between COCO JSON and YOLO text labels.

What it reads (``SRC``):

- COCO: a folder with ``annotations/train.json`` and ``annotations/val.json``, each split's images in ``train/`` and
  ``val/`` (``file_name`` relative to that folder), as ``bigbatch data shapes`` writes it; COCO 2017's own names
  (``annotations/instances_train2017.json`` with ``train2017/``) are read too;
- YOLO in Darknet's layout: a ``.data`` file (``train=``, ``valid=``, ``names=``: lists of images or folders; a label
  ``.txt`` beside each image, or in the ``labels`` folder beside its ``images`` folder), or a folder holding one;
- YOLO in Ultralytics' layout: a folder with ``images/train``, ``images/val`` and ``labels/train``, ``labels/val``; the
  class names from ``classes.txt`` or the one ``.names`` file there, else ``data.yaml``'s ``names``.

A folder holding both formats (``data shapes --format yolo`` writes both) is read as the one ``--to`` is not. A set is
never converted to its own format (``--to yolo`` from a YOLO set may change its layout).

What it writes (``--out``, new or empty): COCO as ``data shapes`` lays it out; YOLO in Darknet's layout
(``train/``, ``val/``: each image with its label file beside it, ``train.txt``, ``val.txt``) or Ultralytics'
(``images/{train,val}``, ``labels/{train,val}``, ``data.yaml``), with ``NAME.names`` and ``NAME.data`` in both, and
``NAME.coco-ids.json``: the COCO ids YOLO labels cannot hold, the categories (id, name, supercategory, in label
order) and each image's id by its path in the set, so that COCO -> YOLO -> COCO gives the file's ids back. ``NAME``
is the source folder's name (a YOLO source: its names file's). Reading a YOLO set, the ids file beside its names
file (``shapes.names``: ``shapes.coco-ids.json``) gives the ids; without one, images are numbered 0, 1, ... in list
order and categories class index + 1 (the ``yolo`` format's numbering, so that the detections a run on the YOLO set
saves score against the converted file).

- Boxes: COCO's ``[x, y, w, h]`` and YOLO's normalised ``<class> <xc> <yc> <w> <h>`` (six decimals, as Darknet's
  ``voc_label.py`` writes them) stand for the same pixel box within a millionth of the image's side; COCO boxes are
  written with ``BOX_DECIMALS`` decimals. Each box is checked and clipped as the loaders check it
  (``detection.check_box``: over the edge by at most 1 px, clipped silently).
- EXIF orientation: the image files are carried unchanged, but a COCO file describes an image's stored pixels (its
  width, height and boxes, as pycocotools reads them) and a YOLO label the image as shown, the stored pixels turned by
  their EXIF Orientation tag (``darknet/yolo_data.py``). Each image's orientation is read with its header and its
  boxes carried between the two (``images.boxes_to_displayed``, ``boxes_to_stored``; width and height swapped for
  5-8), so that COCO -> YOLO -> COCO gives the file's boxes back and the YOLO set trains on the same objects.
- Crowd regions (``iscrowd: 1``): YOLO labels have no crowd flag, and a crowd region written as a box would be trained
  on as one object, which bigbatch never does with COCO data: they are left out, and their count printed.
- Images without boxes: an empty label file in YOLO; an image entry without annotations in COCO. A YOLO image without
  a label file is an image without boxes, as in Darknet.
- Not carried to YOLO: segmentations, ``area`` (COCO's is the mask's; back in COCO it is the box's), annotation ids,
  ``info`` and ``licenses``.

Images are hard-linked where the file system allows it (else copied; ``--copy``: always copied), never moved: the
source is only read. Every file of the source is read as an untrusted one, inside ``SRC``'s folder only (links and
``..`` followed): a path that leads out of it is an error naming it; only regular files are read, each within the
bounds of its reader (``coco.read_annotation_file``, ``darknet/yolo_data.py``). Everything is read and checked before
anything is written; the first bad annotation stops the conversion in one ``error:`` line naming its file and line
(or annotation), but for a box that reaches over its image's edge, which is clipped, as training clips it, with a
warning naming it. A conversion that fails while writing removes the files it made; the ``.data`` file (COCO: the
``annotations/val.json``) is written last.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import yaml

from bigbatch.config.loading import override_word
from bigbatch.darknet.yolo_data import (
    MAX_LISTED_IMAGES,
    darknet_label_path,
    list_images,
    names_of_yaml,
    read_darknet_data,
    read_names,
    ultralytics_label_path,
    yolo_label_path,
    yolo_records,
)
from bigbatch.data.formats.coco import annotated_images, categories_of, class_mapping, read_annotation_file
from bigbatch.data.formats.shapes import yolo_line
from bigbatch.data.pipeline.files import open_regular, read_lines, read_regular
from bigbatch.data.pipeline.images import (
    boxes_to_displayed,
    boxes_to_stored,
    inspect_oriented_images,
    oriented_size,
)
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from bigbatch.floor.user_files import lies_inside

SPLITS = ("train", "val")
COCO_LAYOUTS = (("annotations/{split}.json", "{split}"), ("annotations/instances_{split}2017.json", "{split}2017"))
"""Where a COCO source's split is: (annotation file, images folder), relative to ``SRC``; the first found is read."""
LAYOUTS = {"darknet": "Darknet's layout", "ultralytics": "Ultralytics' layout"}
IDS_SUFFIX = ".coco-ids.json"
IDS_FILE_LIMIT = 2**28
"""The largest ids file read (256 MiB): an image's path and id are some 40-60 bytes of JSON, so the two splits at
:data:`MAX_LISTED_IMAGES` each need about 250 MB; parsed, a file costs about 5 times its size in memory."""
BOX_DECIMALS = 3
"""Decimals of a COCO box written from YOLO labels: a thousandth of a pixel, finer than the labels' six decimals of
the side of an image up to 1,000 px."""
WRITTEN_BY = "bigbatch data convert"
LINK_FAILURES = (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""Why a hard link may be refused where a copy is not: another file system, a file system without hard links, the
kernel's ``protected_hardlinks`` (a file of another owner), the most links an inode may have."""


@dataclass
class Item:
    """One image of a split: its file (absolute), its name in the split (a relative POSIX path), its size, its boxes
    (float [N, 4] XYXY pixels, checked and clipped) and labels, its COCO id (None: none known), its path in the
    source set (for the ids file) and its EXIF orientation; size and boxes are the stored pixels', as a COCO file gives
    them (a YOLO label's turned back)."""

    source: str
    name: str
    width: int
    height: int
    boxes: np.ndarray
    labels: np.ndarray
    image_id: int | None = None
    orientation: int = 1


@dataclass
class Source:
    """A detection set as read: its format (``coco``, ``yolo``) and layout, the categories in label order (each
    ``{"id", "name", ...}``), the images of each split, the crowd regions left out and what to tell the user."""

    format: str
    layout: str | None
    name: str
    categories: list[dict[str, Any]]
    splits: dict[str, list[Item]]
    crowd: int = 0
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- paths


def _check_inside(path: str | os.PathLike, root: Path, what: str) -> None:
    if not lies_inside(root, path):
        raise UserError(f"SRC: {what} {path} leads outside {root} (links and .. followed); convert reads only inside "
                        "the folder it is given")


def _posix(path: str, start: Path) -> str:
    return PurePath(os.path.relpath(path, start)).as_posix()


def _file_stem(name: str) -> str:
    """``name`` as the ``NAME`` of ``NAME.names`` (letters, digits, ``._+-``), or ``dataset``."""
    return name if re.fullmatch(r"[A-Za-z0-9][\w.+-]*", name) else "dataset"


def check_out(out: Path) -> Path:
    """``--out`` as an absolute path: absent or an empty folder (one ``error:`` line otherwise)."""
    from bigbatch.floor.outputs import check_new_or_empty_folder

    return check_new_or_empty_folder(out, "a converted set is")


# ----------------------------------------------------------------------------- which set SRC is


def _coco_files(root: Path) -> dict[str, tuple[Path, Path]] | None:
    """``{split: (annotation file, images folder)}`` of a COCO folder, or None when a split's file is missing."""
    found = {}
    for split in SPLITS:
        for annotation_file, images in COCO_LAYOUTS:
            path = root / annotation_file.format(split=split)
            if os.path.lexists(path):
                found[split] = (path, root / images.format(split=split))
                break
    return found if len(found) == len(SPLITS) else None


def _is_ultralytics(root: Path) -> bool:
    return all((root / "images" / split).is_dir() for split in SPLITS)


def _data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*.data") if p.is_file())


def find_source(src: Path, to: str, layout: str) -> tuple[str, str | None, Path]:
    """``(format, layout, path)`` of ``SRC``: a COCO folder, a Darknet ``.data`` file (or a folder holding one), an
    Ultralytics folder; a folder of two formats is read as the one ``to`` is not. A set of the format and layout asked
    for is refused."""
    src = Path(os.path.abspath(src))
    if not os.path.lexists(src):
        raise UserError(f"SRC: {src} not found")
    expected = ("a COCO folder (annotations/train.json, annotations/val.json, train/, val/), a Darknet .data file or "
                "a folder holding one, or an Ultralytics folder (images/train, images/val, labels/)")
    if src.is_file():
        if src.suffix != ".data":
            raise UserError(f"SRC: {src} is a file but not a Darknet .data file; expected {expected}")
        found = [("yolo", "darknet", src)]
    elif src.is_dir():
        found = []
        if _coco_files(src) is not None:
            found.append(("coco", None, src))
        if _is_ultralytics(src):
            found.append(("yolo", "ultralytics", src))
        else:
            data_files = _data_files(src)
            if len(data_files) > 1:
                raise UserError(f"SRC: {src} holds several .data files ({', '.join(p.name for p in data_files)}); "
                                "give the one to convert")
            if data_files:
                found.append(("yolo", "darknet", data_files[0]))
    else:
        raise UserError(f"SRC: {src} is neither a folder nor a regular file")
    if not found:
        raise UserError(f"SRC: {src} is not a detection set bigbatch converts; expected {expected}")
    other = [f for f in found if f[0] != to]
    fmt, src_layout, path = other[0] if other else found[0]
    if fmt == "coco" and to == "coco":
        raise UserError(f"SRC: {src} is a COCO set already; --to coco converts a YOLO set")
    if fmt == "yolo" and to == "yolo" and src_layout == layout:
        other_layout = next(name for name in LAYOUTS if name != layout)
        raise UserError(f"SRC: {src} is a YOLO set in {LAYOUTS[layout]} already; --to coco converts it to COCO, "
                        f"--layout {other_layout} to {LAYOUTS[other_layout]}")
    return fmt, src_layout, path


# ----------------------------------------------------------------------------- reading COCO


def _coco_categories(data: dict[str, Any], categories: dict[int, str]) -> list[dict[str, Any]]:
    """The categories in label order (by id), each ``{"id", "name"}`` and its ``supercategory`` when it is text."""
    extra = {}
    for category in data["categories"]:
        if isinstance(category.get("supercategory"), str):
            extra.setdefault(int(category["id"]), category["supercategory"])
    return [{"id": cid, "name": categories[cid], **({"supercategory": extra[cid]} if cid in extra else {})}
            for cid in sorted(categories)]


def read_coco(root: Path, issues: DataIssues) -> Source:
    files = _coco_files(root)
    assert files is not None
    splits: dict[str, list[Item]] = {}
    first: tuple[Path, dict[int, str]] | None = None
    crowd = 0
    categories_out: list[dict[str, Any]] = []
    for split, (annotation_file, images_dir) in files.items():
        _check_inside(annotation_file, root, "the annotation file")
        _check_inside(images_dir, root, "the images folder")
        data = read_annotation_file(annotation_file, "SRC")
        categories = categories_of(data, annotation_file, "SRC")
        if first is None:
            first = (annotation_file, categories)
            categories_out = _coco_categories(data, categories)
        elif categories != first[1]:
            raise UserError(f"SRC: {annotation_file} has other categories than {first[0]} (ids and names); a YOLO set "
                            "has one names file")
        _, label_of = class_mapping(categories, None, annotation_file)
        images = annotated_images(data, images_dir, annotation_file, categories, label_of, issues)
        items, seen = [], {}
        for image_id, image in images.items():
            where = f"SRC: {annotation_file}: image id {image_id}"
            name = _posix(image.path, images_dir)
            if name.startswith("../") or name in (".", ".."):
                raise UserError(f"{where}: file_name {image.file_name!r} is not in the images folder {images_dir}")
            _check_inside(image.path, root, f"image id {image_id} of {annotation_file},")
            if name in seen:
                raise UserError(f"{where}: file_name {image.file_name!r} is image id {seen[name]}'s too")
            seen[name] = image_id
            crowd += len(image.crowd_boxes)
            items.append(Item(image.path, name, image.width, image.height,
                              np.array(image.boxes, np.float64).reshape(-1, 4), np.array(image.labels, np.int64),
                              image_id))
        for item, (size, orientation, problem) in zip(items, inspect_oriented_images([i.source for i in items]),
                                                      strict=True):
            if problem is None:
                size, item.orientation = oriented_size(size, orientation), orientation  # the stored size
                if size != (item.width, item.height):
                    problem = f"image is {size[0]}x{size[1]} but {annotation_file} says {item.width}x{item.height}"
            if problem is not None:
                issues.report(item.source, None, problem)
        splits[split] = items
    return Source("coco", None, _file_stem(root.name), categories_out, splits, crowd)


# ----------------------------------------------------------------------------- reading YOLO


def _resolve(text: str, root: Path, bases: tuple[Path, ...], what: str = "the path") -> Path | None:
    """A path a Darknet file names, found as Darknet finds it (as given, from the current folder, then from each base
    in turn), the first one inside ``root``; a path found only outside it is an error naming ``what``; None when none
    exists."""
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() else [path, *(base / path for base in bases)]
    existing = [c.absolute() for c in candidates if os.path.lexists(c)]
    inside = [c for c in existing if lies_inside(root, c)]
    if inside:
        return inside[0]
    if existing:
        _check_inside(existing[0], root, what)
    return None


def _read_error(error: OSError, path: Path, what: str) -> UserError:
    if isinstance(error, FileNotFoundError):
        return UserError(f"SRC: {what} {path} not found")
    return UserError(f"SRC: cannot read {what} {path}: {error.strerror or error}")


def _image_list(listing: Path, root: Path) -> list[str]:
    """The images a Darknet list names (one a line, blank lines skipped), each inside ``root``, none twice."""
    paths: list[str] = []
    first: dict[str, int] = {}
    try:
        for number, line in read_lines(listing, MAX_LISTED_IMAGES, "an image list"):
            if not line.strip():
                continue
            found = _resolve(line.strip(), root, (root, listing.parent), f"{listing}:{number}: the image")
            if found is None:
                raise UserError(f"SRC: {listing}:{number}: no such image (tried from the current folder, from {root} "
                                f"and from {listing.parent})")
            key = os.path.normpath(found)
            if key in first:
                raise UserError(f"SRC: {listing}:{number}: the image of line {first[key]} again; a COCO file lists an "
                                "image once")
            first[key] = number
            paths.append(key)
    except OSError as error:
        raise _read_error(error, listing, "the image list") from None
    return paths


def _folder_images(folder: Path, root: Path) -> list[str]:
    paths = list_images(folder)
    for path in paths:
        _check_inside(path, root, "the image")
    return paths


def _read_ids(path: Path, root: Path) -> dict[str, Any] | None:
    """The ids file ``path`` (``NAME.coco-ids.json``), checked: ``{"categories": [{"id", "name", ...}], "images":
    {path in the set: id}}``; None when there is none."""
    if not os.path.lexists(path):
        return None
    _check_inside(path, root, "the ids file")
    try:
        data = json.loads(read_regular(path, IDS_FILE_LIMIT, "an ids file").decode("utf-8"))
    except OSError as error:
        raise _read_error(error, path, "the ids file") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UserError(f"SRC: {path}: not valid JSON") from None
    expected = ("expected {\"categories\": [{\"id\": <int>, \"name\": <str>}, ...], \"images\": {\"<path>\": <int>, "
                "...}}, as bigbatch data convert writes it")
    if not isinstance(data, dict) or not isinstance(data.get("categories"), list) or not isinstance(
            data.get("images"), dict):
        raise UserError(f"SRC: {path}: {expected}")
    ids = set()
    for category in data["categories"]:
        if not (isinstance(category, dict) and type(category.get("id")) is int and isinstance(category.get("name"),
                                                                                               str)):
            raise UserError(f"SRC: {path}: category {category!r}: {expected}")
        if category["id"] in ids:
            raise UserError(f"SRC: {path}: category id {category['id']} appears twice")
        ids.add(category["id"])
    for name, image_id in data["images"].items():
        if type(image_id) is not int:
            raise UserError(f"SRC: {path}: image {name!r}: the id {image_id!r} is not a whole number; {expected}")
    return data


def _yolo_source(layout: str, root: Path, names_file: Path, names: list[str], lists: dict[str, list[str]],
                 issues: DataIssues) -> Source:
    """The records of each split's images (their label files inside ``root``), with the ids of the ids file beside
    ``names_file``."""
    ids = _read_ids(names_file.with_name(names_file.stem + IDS_SUFFIX), root)
    notes = []
    categories = [{"id": label + 1, "name": name} for label, name in enumerate(names)]
    if ids is not None:
        if [c["name"] for c in ids["categories"]] == names:
            categories = [dict(c) for c in ids["categories"]]
        else:
            notes.append(f"{names_file.with_name(names_file.stem + IDS_SUFFIX)} does not list the classes of "
                         f"{names_file}: categories numbered class index + 1")
    image_ids = {} if ids is None else ids["images"]
    splits = {}
    for split, paths in lists.items():
        for path in paths:
            label = yolo_label_path(path)
            if os.path.lexists(label):
                _check_inside(label, root, "the label file")
        records = yolo_records(paths, len(names), issues, keep_empty=True, decode=False)
        start = Path(os.path.commonpath([os.path.dirname(p) for p in paths])) if paths else root
        items, owner = [], {}
        for record in records:
            # without an ids file, the ``yolo`` format's own id: the image's position in its list (0, 1, ...)
            image_id = record.image_id if ids is None else image_ids.get(_posix(record.path, root))
            if image_id is not None and image_id in owner:
                raise UserError(f"SRC: {names_file.with_name(names_file.stem + IDS_SUFFIX)}: image id {image_id} is "
                                f"both {owner[image_id]}'s and {record.path}'s")
            owner[image_id] = record.path
            stored = boxes_to_stored(record.boxes.astype(np.float64), record.orientation, (record.width, record.height))
            items.append(Item(record.path, _posix(record.path, start), *record.stored_size, stored, record.labels,
                              image_id, record.orientation))
        splits[split] = items
    return Source("yolo", layout, _file_stem(root.name if names_file.suffix in (".yaml", ".yml") else names_file.stem),
                  categories, splits, notes=notes)


def read_darknet(data_file: Path, issues: DataIssues) -> Source:
    root = data_file.parent
    _check_inside(data_file, root, "the .data file")
    options = read_darknet_data(data_file)
    for key in ("names", "train", "valid"):
        if key not in options:
            raise UserError(f"SRC: {data_file}: no '{key} =' line")
    names_file = _resolve(options["names"], root, (root,), f"{data_file}: names =")
    if names_file is None:
        raise UserError(f"SRC: {data_file}: names = {options['names']}: no such file")
    names = read_names(names_file)
    if "classes" in options and (not options["classes"].isdigit() or int(options["classes"]) != len(names)):
        raise UserError(f"SRC: {data_file}: classes = {options['classes']}, but the names file lists {len(names)} "
                        "names")
    lists = {}
    for split, key in zip(SPLITS, ("train", "valid"), strict=True):
        listing = _resolve(options[key], root, (root,), f"{data_file}: {key} =")
        if listing is None:
            raise UserError(f"SRC: {data_file}: {key} = {options[key]}: no such file or folder")
        lists[split] = _folder_images(listing, root) if listing.is_dir() else _image_list(listing, root)
    return _yolo_source("darknet", root, names_file, names, lists, issues)


def read_ultralytics(root: Path, issues: DataIssues) -> Source:
    found = sorted(p for p in root.glob("*.names") if p.is_file())
    if (root / "classes.txt").is_file():
        names_file = root / "classes.txt"
    elif len(found) > 1:
        raise UserError(f"SRC: {root} holds several names files ({', '.join(p.name for p in found)}); keep one")
    elif found:
        names_file = found[0]
    else:
        names_file = next((root / n for n in ("data.yaml", "data.yml") if (root / n).is_file()), None)
        if names_file is None:
            raise UserError(f"SRC: no class names in {root}: expected classes.txt, a .names file or data.yaml")
    _check_inside(names_file, root, "the names file")
    names = names_of_yaml(names_file, "SRC") if names_file.suffix in (".yaml", ".yml") else read_names(names_file)
    lists = {split: _folder_images(root / "images" / split, root) for split in SPLITS}
    return _yolo_source("ultralytics", root, names_file, names, lists, issues)


# ----------------------------------------------------------------------------- writing


class Writer:
    """Makes new files (never one that exists: ``O_EXCL``) and folders under ``out``, remembering each, so that a
    conversion that fails removes what it made, and only that."""

    def __init__(self, out: Path, copy: bool):
        self.out, self.copy = out, copy
        self.made: list[Path] = []
        self.linked = self.copied = 0

    def folder(self, path: Path) -> None:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            self.made.append(p)

    def text(self, relative: str, text: str) -> None:
        path = self.out / relative
        self.folder(path.parent)
        with open(path, "x", encoding="utf-8", newline="\n") as file:
            self.made.append(path)
            file.write(text)

    def image(self, relative: str, source: str) -> None:
        """``source`` (a regular file) at ``out/relative``: a hard link, else (or with ``copy``) a copy."""
        path = self.out / relative
        self.folder(path.parent)
        if not self.copy:
            if not stat.S_ISREG(os.stat(source).st_mode):
                raise UserError(f"SRC: {source} is not a regular file")
            try:
                os.link(source, path)
            except OSError as error:
                if error.errno not in LINK_FAILURES:
                    raise
            else:
                self.made.append(path)
                self.linked += 1
                return
        with open_regular(source) as src, open(path, "xb") as dst:
            self.made.append(path)
            shutil.copyfileobj(src, dst, 2**20)
        self.copied += 1

    def undo(self) -> None:
        for path in reversed(self.made):
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError:
                pass


def _names_text(categories: list[dict[str, Any]]) -> str:
    """The names file: one class a line; a name that would not read back as itself is refused."""
    for category in categories:
        name = category["name"]
        if not name.strip() or name != name.strip() or "\n" in name or "\r" in name:
            raise UserError(f"SRC: category id {category['id']}'s name {name!r} cannot be a line of a names file "
                            "(empty, a line break, or spaces around it)")
    return "".join(f"{c['name']}\n" for c in categories)


def _plan_yolo(source: Source, out: Path, layout: str) -> dict[str, list[tuple[Item, str, str]]]:
    """Each split's ``(item, image path, label path)``, both relative to ``out``, checked to lie in it, each once."""
    planned: dict[str, list[tuple[Item, str, str]]] = {}
    taken: dict[str, str] = {}
    for split, items in source.splits.items():
        folder = f"{split}" if layout == "darknet" else f"images/{split}"
        planned[split] = []
        for item in items:
            image = f"{folder}/{item.name}"
            rule = darknet_label_path if layout == "darknet" else ultralytics_label_path  # where each reader looks
            label_path = Path(rule(out / image))
            if not label_path.is_relative_to(out):
                raise UserError(f"--out: {out} lies in a folder named images or JPEGImages: the layout's rule would "
                                f"put the label file of {image} outside it, at {label_path}")
            label = label_path.relative_to(out).as_posix()
            for path in (image, label):
                if path in taken:
                    raise UserError(f"SRC: {item.source} and {taken[path]} would both be written as {out / path} "
                                    "(the same name, or the same label file)")
                taken[path] = item.source
            planned[split].append((item, image, label))
    return planned


def write_yolo(source: Source, writer: Writer, layout: str) -> str:
    """The YOLO set; returns the file to train with (``NAME.data``)."""
    out, name = writer.out, source.name
    names = _names_text(source.categories)
    planned = _plan_yolo(source, out, layout)
    ids: dict[str, int] = {}
    for split, entries in planned.items():
        for item, image, label in entries:
            writer.image(image, item.source)
            width, height = oriented_size((item.width, item.height), item.orientation)  # the image as shown
            shown = boxes_to_displayed(item.boxes, item.orientation, (item.width, item.height))
            lines = [yolo_line(int(c), [x1, y1, x2 - x1, y2 - y1], width, height) + "\n"
                     for (x1, y1, x2, y2), c in zip(shown.tolist(), item.labels.tolist(), strict=True)]
            writer.text(label, "".join(lines))
            if item.image_id is not None:
                ids[image] = item.image_id
        writer.text(f"{split}.txt", "".join(f"{image}\n" for _, image, _ in entries))
    writer.text(f"{name}.names", names)
    writer.text(f"{name}{IDS_SUFFIX}", json.dumps({"written_by": WRITTEN_BY, "categories": source.categories,
                                                   "images": ids}, indent=1) + "\n")
    if layout == "ultralytics":
        header = (f"# written by {WRITTEN_BY}; also as {name}.data and {name}.names, which bigbatch reads (Darknet "
                  "itself looks for a label file beside its image: --layout darknet)\n")
        body = {"train": "images/train", "val": "images/val", "nc": len(source.categories),
                "names": {label: c["name"] for label, c in enumerate(source.categories)}}
        writer.text("data.yaml", header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
    writer.text(f"{name}.data", f"classes={len(source.categories)}\ntrain=train.txt\nvalid=val.txt\n"
                                f"names={name}.names\n")
    return f"{name}.data"


def _image_ids(items: list[Item]) -> list[int]:
    """Each image's COCO id: the one it came with, else the next after the largest (1, 2, ... for none: a YOLO set's
    images come with their position in its list, a COCO set's with their ids; only those an ids file leaves out have
    none)."""
    ids, following = [], max((i.image_id for i in items if i.image_id is not None), default=0) + 1
    for item in items:
        if item.image_id is None:
            ids.append(following)
            following += 1
        else:
            ids.append(item.image_id)
    return ids


def write_coco(source: Source, writer: Writer) -> None:
    category_ids = [c["id"] for c in source.categories]
    files = []
    for split, items in source.splits.items():
        images, annotations = [], []
        for item, image_id in zip(items, _image_ids(items), strict=True):
            writer.image(f"{split}/{item.name}", item.source)
            images.append({"id": image_id, "file_name": item.name, "width": item.width, "height": item.height})
            for (x1, y1, x2, y2), label in zip(item.boxes.tolist(), item.labels.tolist(), strict=True):
                x, y = round(x1, BOX_DECIMALS), round(y1, BOX_DECIMALS)
                w, h = round(x2 - x1, BOX_DECIMALS), round(y2 - y1, BOX_DECIMALS)
                annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                    "category_id": category_ids[int(label)], "bbox": [x, y, w, h],
                                    "area": round(w * h, BOX_DECIMALS), "iscrowd": 0})
        files.append((split, {"info": {"description": f"converted from a YOLO set by {WRITTEN_BY}"},
                              "images": images, "annotations": annotations, "categories": source.categories}))
    for split, data in files:  # val.json last: a folder without it is no COCO set
        writer.text(f"annotations/{split}.json", json.dumps(data) + "\n")


# ----------------------------------------------------------------------------- the command


def convert(src: Path, to: str, out: Path, layout: str | None = None, copy: bool = False) -> list[str]:
    """Convert the set ``src`` to ``to`` (``coco``, ``yolo``) in the new or empty folder ``out``; returns the lines to
    print (what was written, what was left out, how to train on it)."""
    if to not in ("coco", "yolo"):
        raise UserError(f"--to: expected coco or yolo, got {to!r}")
    if layout is not None and to != "yolo":
        raise UserError("--layout: goes with --to yolo (the layout of the YOLO set written)")
    layout = layout or "darknet"
    if layout not in LAYOUTS:
        raise UserError(f"--layout: expected darknet or ultralytics, got {layout!r}")
    out = check_out(out)
    fmt, src_layout, path = find_source(Path(src), to, layout)
    issues = DataIssues(strict=True, tolerated=frozenset({"clipped"}))  # a box over the edge: clipped, as training
    if fmt == "coco":
        source = read_coco(path, issues)
    elif src_layout == "darknet":
        source = read_darknet(path, issues)
    else:
        source = read_ultralytics(path, issues)
    if to == "yolo":
        _names_text(source.categories)  # before anything is written
        _plan_yolo(source, out, layout)
    writer = Writer(out, copy)
    try:
        writer.folder(out)
        if to == "yolo":
            written = write_yolo(source, writer, layout)
        else:
            write_coco(source, writer)
    except BaseException as error:
        writer.undo()
        if isinstance(error, OSError):
            raise UserError(f"--out: cannot write {out}: {error.strerror or error} (what it wrote is removed)"
                            ) from None
        raise
    what = "COCO" if fmt == "coco" else f"YOLO ({LAYOUTS[src_layout]})"
    into = "COCO" if to == "coco" else f"YOLO ({LAYOUTS[layout]})"
    counts = ", ".join(f"{len(items)} {split} images ({sum(len(i.boxes) for i in items)} boxes)"
                       for split, items in source.splits.items())
    files = (f"linked {writer.linked} images" if not writer.copied else
             f"copied {writer.copied} images" if not writer.linked else
             f"linked {writer.linked} images, copied {writer.copied} (no hard link possible)")
    lines = [f"{what} {path} converted to {into} in {out}: {counts}; {len(source.categories)} classes; {files}"]
    if source.crowd:
        regions = "region" if source.crowd == 1 else "regions"
        lines.append(f"left out {source.crowd} crowd {regions} (iscrowd: 1): YOLO labels have no crowd flag")
    lines += source.notes
    if issues.problems:  # boxes over an image's edge, clipped (each named in a warning above)
        lines.append(issues.summary())
    if to == "yolo":
        words = f"data.name=yolo {override_word('data.path', str(out / written))}"
        coco = _coco_files(path) if fmt == "coco" else None
        if coco is not None:  # the source's own image and category ids for saved detections, and the same mAP
            words += f" {override_word('data.annotations', str(coco['val'][0].resolve()))}"
        lines.append(f"train with --set {words}")
    else:
        keys = " ".join(f"{override_word(f'data.{s}.images', str(out / s))} "
                        f"{override_word(f'data.{s}.annotations', str(out / 'annotations' / f'{s}.json'))}"
                        for s in SPLITS)
        lines.append(f"train with --set data.name=coco {keys}")
    return lines
