"""Darknet/YOLO detection data: images with one text label file each.

A label line is ``<class> <xc> <yc> <w> <h>``: a class index and the box centre and size normalised by
the image's width W and height H (Darknet's ``scripts/voc_label.py``). It becomes pixel XYXY here:
``x1 = (xc - w / 2) * W, x2 = (xc + w / 2) * W``, and the same for y with H; the image size comes from
the image header (PIL reads it without decoding the image).

The image is the one shown: its stored pixels turned by their EXIF Orientation tag (1-8, read with the header:
``images.inspect_oriented``), W and H its size as shown (swapped for 5-8). Darknet (AlexeyAB's, built with OpenCV:
``load_image_mat_cv``, ``src/image_opencv.cpp``) and Ultralytics (``cv2.imdecode``; ``exif_size`` in
``ultralytics/data/utils.py``) load images with OpenCV, which turns them so (``ApplyExifOrientation``), and label
tools show them so: a label line describes the turned image. The record carries the orientation
(``DetectionRecord.orientation``) and the dataset turns the decoded pixels by it.

Sources:
- a Darknet ``.data`` file (``classes=``, ``train=``, ``valid=``, ``names=``; other keys ignored): train and
  valid name a text file listing image paths, or a folder. Relative paths are tried from the current
  folder first, as Darknet opens them, then from the ``.data`` file's folder (and, for a list's entries,
  from the list file's folder);
- a folder holding ``images/`` and ``labels/`` (or holding the images), with the class names given, or in
  ``classes.txt`` or a single ``*.names`` file in the folder or one of its two parents.

The label file of an image (:func:`yolo_label_path`) is found by AlexeyAB Darknet's rule (``replace_image_to_label``:
beside the image, but for COCO's ``images/train2017``-style folders and VOC's ``JPEGImages``, which become
``labels``), else by Ultralytics' (``img2label_paths``: the last ``images`` folder of the path becomes ``labels``);
the extension ``.txt``. A missing label file is an image without boxes, as in both; how many are missing, and where
they were looked for, is one warning. ``image_id`` is the image's index in the list, stable whatever is skipped.

Every file a ``.data`` file names may be hostile, as a dataset's images are (``data/pipeline/files.py``): each is read
only as a regular file, opened without blocking (a FIFO or a link to ``/dev/zero`` is refused, never read), line by line
within bounds set before any memory is spent on it: the ``.data`` file within :data:`DATA_FILE_LIMIT` bytes, a names
file within :data:`NAMES_FILE_LIMIT` bytes and :data:`MAX_CLASS_NAMES` lines, an image list or folder within
:data:`MAX_LISTED_IMAGES` images, a label file's first :data:`MAX_LABEL_BOXES` lines (those after them are skipped and
reported), each line within ``files.LINE_LIMIT`` bytes. A mistake is one ``error:`` line naming the file and line (a
label file's: a reported skip), never the line's content. The paths keep Darknet's rule above, but class names are
printed (tables, metric keys): a names file outside the ``.data`` file's folder (links and ``..`` followed) is read only
when a ``classes =`` line gives its count, as every ``.data`` file of Darknet's own does.

The ``yolo`` detection format of ``registry.DATASETS``: ``data.path`` is a ``.data`` file or a dataset folder
(:func:`yolo_splits`), and ``data.classes`` keeps some classes by name. A YOLO set has no ids of its own: an image's
id is its position in its list, a category's its class index + 1 (``coco.CATEGORY_ID_OFFSET``; the names carry
``category_ids=None``). ``data.annotations`` names a COCO file of the same validation images; the validation
records then take its image ids (by file name), category ids (by name) and each object's box and area
(``data/formats/coco_ids.py``), so that a COCO results file (``eval --save-detections``) scores against that file as
bigbatch scores it. Its default, ``auto``, is the ``annotations/val.json`` that ``bigbatch data shapes`` wrote when
``data.path`` is (or is in) a set it generated (``shapes.own_annotation_file``), and no file otherwise; ``null``:
no file.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

import numpy as np

from bigbatch.config.data_keys import ANNOTATIONS_AUTO, DATASET_KEYS
from bigbatch.darknet.text import read_options
from bigbatch.data.formats.coco import ClassNames, class_mapping
from bigbatch.data.formats.coco_ids import take_coco_ids
from bigbatch.data.formats.counts import train_images_given
from bigbatch.data.formats.detection import EDGE_TOLERANCE, DetectionRecord, check_box
from bigbatch.data.formats.shapes import own_annotation_file
from bigbatch.data.pipeline.files import BadLine, read_lines, read_regular
from bigbatch.data.pipeline.images import inspect_oriented_images
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from bigbatch.floor.user_files import lies_inside
from bigbatch.registry import DATASETS

if TYPE_CHECKING:
    from bigbatch.config import DataConfig, RunConfig

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")  # unsupported ones get reported
IMAGE_FOLDERS = ("images", "JPEGImages")
LINE_FORMAT = "'<class> <xc> <yc> <w> <h>'"

DATA_FILE_LIMIT = 2**16
"""The largest ``.data`` file read, in bytes (64 KiB): a handful of ``key = path`` lines; Darknet's coco.data is 146
bytes."""
NAMES_FILE_LIMIT = 4 * 2**20
"""The largest names file read, in bytes (4 MiB): Darknet's largest, 9k.names (9,418 classes), is about 0.1 MB, and a
file of :data:`MAX_CLASS_NAMES` lines of 60 characters fits."""
MAX_CLASS_NAMES = 2**16
"""The most lines a names file may have (one class a line): 9k.names has 9,418, the full ImageNet 21,841; each class
is a network output and a row of the evaluation's table."""
MAX_LISTED_IMAGES = 2**21
"""The most images (lines) an image list, or a folder, may give one split: 2,097,152, above Open Images' 1.7 million
training images with boxes, the largest public detection set. A listed image costs about 2 KB of records before
training starts (1.5 KB kept, measured on 300,000), so a split at the bound takes about 4 GiB; a list's lines are
counted before any is resolved, so a longer one is refused having cost only its reading (10^7 lines: 2 s)."""
MAX_LABEL_BOXES = 4096
"""The most lines (boxes) read from one image's label file: the lines after them are skipped, with a warning.
Darknet's ``[yolo]`` layer reads at most ``max`` truths an image (200 by default in AlexeyAB's fork, 90 in
pjreddie's), the first of them here; this is 20 times the larger, and above the densest public sets (a few hundred
objects an image)."""


_DARKNET_LABEL_FOLDERS = (  # AlexeyAB's replace_image_to_label (src/utils.c), in its order; each the first match
    ("/images/train2017/", "/labels/train2017/"), ("/images/val2017/", "/labels/val2017/"),
    ("/JPEGImages/", "/labels/"),
    ("\\images\\train2017\\", "\\labels\\train2017\\"), ("\\images\\val2017\\", "\\labels\\val2017\\"),
    ("\\images\\train2014\\", "\\labels\\train2014\\"), ("\\images\\val2014\\", "\\labels\\val2014\\"),
    ("/images/train2014/", "/labels/train2014/"), ("/images/val2014/", "/labels/val2014/"),
    ("\\JPEGImages\\", "\\labels\\"),
)
_DARKNET_IMAGE_SUFFIXES = (".jpg", ".JPG", ".jpeg", ".JPEG", ".png", ".PNG", ".bmp", ".BMP", ".ppm", ".PPM",
                           ".tiff", ".TIFF")


def darknet_label_path(image_path: str | os.PathLike) -> str:
    """AlexeyAB Darknet's rule (``replace_image_to_label``, src/utils.c): only COCO's ``/images/train2017/``,
    ``/images/val2017/`` (and 2014) folders become ``/labels/...``, and VOC's ``/JPEGImages/`` becomes ``/labels/``
    (each its first occurrence); anywhere else the label file sits beside the image. The extension becomes ``.txt``
    (Darknet knows twelve; another is replaced too, where Darknet warns)."""
    path = str(image_path)
    for old, new in _DARKNET_LABEL_FOLDERS:
        path = path.replace(old, new, 1)
    path = path.strip()
    suffix = next((s for s in _DARKNET_IMAGE_SUFFIXES if path.endswith(s)), None)
    return path[: -len(suffix)] + ".txt" if suffix else str(PurePath(path).with_suffix(".txt"))


def ultralytics_label_path(image_path: str | os.PathLike) -> str:
    """Ultralytics' rule (``img2label_paths``): the last ``images`` (or VOC's ``JPEGImages``) folder of the path
    becomes ``labels``, the extension ``.txt``; without such a folder the label file sits beside the image."""
    parts = list(PurePath(image_path).parts)
    for i in range(len(parts) - 2, -1, -1):  # folders only, the last one first
        if parts[i] in IMAGE_FOLDERS:
            parts[i] = "labels"
            break
    return str(PurePath(*parts).with_suffix(".txt"))


def yolo_label_path(image_path: str | os.PathLike) -> str:
    """The label file of an image: Darknet's (:func:`darknet_label_path`) where it exists, else Ultralytics'
    (:func:`ultralytics_label_path`) where that exists; neither: Darknet's, missing (an image without boxes). A
    Darknet set keeps its ``.txt`` files beside the images, in a folder of any name, ``images`` too; an Ultralytics
    set keeps them in ``labels/`` beside ``images/``; COCO's and VOC's layouts give one file by both rules."""
    darknet = darknet_label_path(image_path)
    if os.path.lexists(darknet):
        return darknet
    ultralytics = ultralytics_label_path(image_path)
    return ultralytics if os.path.lexists(ultralytics) else darknet


def _read_error(error: OSError, path: str | os.PathLike, what: str) -> UserError:
    """The one line for a file a dataset names that cannot be read: its line's problem (``BadLine``), or why the file
    is not read (missing, not a regular file, too large)."""
    if isinstance(error, BadLine):
        return UserError(f"data: {error}")
    if isinstance(error, FileNotFoundError):
        return UserError(f"data: {what} {path} not found")
    return UserError(f"data: cannot read {what} {path}: {error.strerror or error}")


def read_darknet_data(path: str | os.PathLike) -> dict[str, str]:
    """The ``key = value`` options of a Darknet ``.data`` file (lines starting with ``#`` or ``;`` skipped)."""
    try:
        lines = [line for _, line in read_lines(path, DATA_FILE_LIMIT, "a .data file", limit=DATA_FILE_LIMIT)]
    except OSError as error:
        raise _read_error(error, path, "the .data file") from None
    expected = "'key = value' (a Darknet .data file)"
    return read_options(lines, f"data: {path}", expected)[0][1]


def read_names(path: str | os.PathLike) -> list[str]:
    """Class names, one a line (blank lines skipped); at most :data:`MAX_CLASS_NAMES` lines and
    :data:`NAMES_FILE_LIMIT` bytes."""
    names = []
    try:
        for _, line in read_lines(path, MAX_CLASS_NAMES, "a names file", limit=NAMES_FILE_LIMIT):
            if line.strip():
                names.append(line.strip())
    except OSError as error:
        raise _read_error(error, path, "names file") from None
    if not names:
        raise UserError(f"data: names file {path} holds no class names (expected one a line)")
    return names


def _resolve(text: str, *bases: Path) -> Path:
    """A path from a Darknet file: as given (relative to the current folder), else under each base in turn (a name
    no system can open, too long or holding a NUL, is simply not found)."""
    path = Path(text).expanduser()
    if not path.is_absolute():
        for candidate in (path, *(base / path for base in bases)):
            if os.path.exists(candidate):
                return candidate.absolute()
    return path.absolute()


def list_images(folder: Path) -> list[str]:
    """The image files under ``folder/images`` (or ``folder``), recursively, sorted by path; at most
    :data:`MAX_LISTED_IMAGES`."""
    root = folder / "images" if (folder / "images").is_dir() else folder
    found = []
    for p in root.rglob("*"):
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file():
            if len(found) == MAX_LISTED_IMAGES:
                raise UserError(f"data: {root} holds more than {MAX_LISTED_IMAGES:,} images, the most one split may "
                                "have")
            found.append(str(p.absolute()))
    return sorted(found)


def _read_list(listing: Path, *bases: Path) -> list[str]:
    """The image paths an image list names, one a line (blank lines skipped), each resolved by :func:`_resolve`;
    at most :data:`MAX_LISTED_IMAGES` lines."""
    paths = []
    try:
        for _ in read_lines(listing, MAX_LISTED_IMAGES, "an image list"):  # counted before any line is resolved
            pass
        for _, line in read_lines(listing, MAX_LISTED_IMAGES, "an image list"):
            if line.strip():
                paths.append(str(_resolve(line.strip(), *bases)))
    except OSError as error:
        raise _read_error(error, listing, "the image list") from None
    return paths


def names_of_yaml(path: Path, key: str = "data") -> list[str]:
    """The ``names`` of an Ultralytics ``data.yaml``: a list, or a mapping of the indices 0..C-1 (read as a regular
    file of at most :data:`NAMES_FILE_LIMIT` bytes); a problem is one ``UserError`` starting with ``key``."""
    import yaml

    from bigbatch.config.loading import load_yaml

    try:
        data = load_yaml(read_regular(path, NAMES_FILE_LIMIT, "a data.yaml file").decode("utf-8"))
    except OSError as error:
        reason = "not found" if isinstance(error, FileNotFoundError) else (error.strerror or str(error))
        raise UserError(f"{key}: cannot read {path}: {reason}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise UserError(f"{key}: {path}: not a YAML file bigbatch reads ({type(error).__name__})") from None
    except yaml.YAMLError as error:
        line = getattr(getattr(error, "problem_mark", None), "line", None)
        raise UserError(f"{key}: {path}{'' if line is None else f':{line + 1}'}: invalid YAML") from None
    names = data.get("names") if isinstance(data, dict) else None
    if (isinstance(names, dict) and all(type(k) is int for k in names)
            and sorted(names) == list(range(len(names)))):
        names = [names[i] for i in range(len(names))]
    if not (isinstance(names, list) and 0 < len(names) <= MAX_CLASS_NAMES
            and all(isinstance(n, (str, int, float)) and not isinstance(n, bool) for n in names)):
        raise UserError(f"{key}: {path}: expected 'names': a list of class names, or a mapping of the class indices "
                        f"0, 1, ... to names (at most {MAX_CLASS_NAMES:,})")
    return [str(n).strip() for n in names]


def _names_in(path: Path) -> list[str]:
    """The class names of a names file (one a line) or of an Ultralytics ``data.yaml``."""
    return names_of_yaml(path) if path.suffix in (".yaml", ".yml") else read_names(path)


def _find_names(folder: Path) -> Path:
    folder = folder.absolute()
    for place in (folder, *list(folder.parents)[:2]):
        if (place / "classes.txt").is_file():
            return place / "classes.txt"
        found = sorted(place.glob("*.names"))
        if len(found) > 1:
            raise UserError(f"data: {place} holds several names files ({', '.join(p.name for p in found)}); "
                            "give the one to use")
        if found:
            return found[0]
        if (place / "data.yaml").is_file():  # Ultralytics' layout: the names in its data.yaml
            return place / "data.yaml"
    raise UserError(f"data: no class names for {folder}: put a classes.txt or a .names file there (one name a "
                    "line), or a data.yaml with names, or give the names")


def names_of_data_file(path: Path, options: dict[str, str] | None = None, key: str = "data") -> list[str]:
    """The class names of the ``names =`` file a Darknet ``.data`` file names (from the current folder, else beside
    the ``.data`` file); one outside the ``.data`` file's folder is read only with a ``classes =`` line."""
    options = read_darknet_data(path) if options is None else options
    base = path.absolute().parent
    if "names" not in options:
        raise UserError(f"{key}: {path}: no 'names =' line (the class names file)")
    names_file = _resolve(options["names"], base)
    if not os.path.exists(names_file):
        raise UserError(f"{key}: {path}: names = {options['names']}: no such file (tried from the current folder "
                        f"and from {base})")
    if "classes" not in options and not lies_inside(base, names_file):
        raise UserError(f"{key}: {path}: names = {options['names']} is outside the .data file's folder ({base}); "
                        "such a names file is read only with a 'classes =' line giving its number of classes")
    return read_names(names_file)


def _from_data_file(path: Path, split: str, names: list[str] | None) -> tuple[list[str], list[str]]:
    """``(image paths, class names)`` of the ``train`` or ``valid`` list of a Darknet ``.data`` file."""
    options = read_darknet_data(path)
    base = path.absolute().parent
    if names is None:
        names = names_of_data_file(path, options)
    if "classes" in options:
        if not options["classes"].isdigit() or int(options["classes"]) != len(names):
            raise UserError(f"data: {path}: classes = {options['classes']}, but the names file lists {len(names)} "
                            "names")
    if split not in options:
        raise UserError(f"data: {path}: no '{split} =' line (the list of {split} images)")
    listing = _resolve(options[split], base)
    if os.path.isdir(listing):
        return list_images(listing), names
    if not os.path.exists(listing):
        raise UserError(f"data: {path}: {split} = {options[split]}: no such file or folder (tried from the current "
                        f"folder and from {base})")
    return _read_list(listing, base, listing.parent), names


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_line(fields: list[str], width: int, height: int, num_classes: int
                ) -> tuple[int, tuple[float, ...]] | str:
    """``(label, pixel XYXY box)`` of a label line, or why it is malformed. A line of a class and three or more
    points ``x1 y1 x2 y2 ...`` (an Ultralytics segmentation label) is the polygon's bounding box, as Ultralytics'
    detection loader takes it (``segments2boxes``)."""
    polygon = len(fields) >= 7 and len(fields) % 2 == 1
    if len(fields) != 5 and not polygon:
        return f"malformed label line: expected {LINE_FORMAT} or a polygon, got {len(fields)} fields"
    try:
        values = [float(f) for f in fields]
    except ValueError:
        field = next(n for n, f in enumerate(fields, 1) if not _is_number(f))
        expected = "numbers" if polygon else f"numbers {LINE_FORMAT}"
        return f"malformed label line: expected {expected}, field {field} is not a number"
    if not values[0].is_integer() or not 0 <= values[0] < num_classes:
        return f"class {fields[0]} is not a class index 0..{num_classes - 1} ({num_classes} names)"
    tx, ty = EDGE_TOLERANCE / width, EDGE_TOLERANCE / height  # one pixel of rounding
    if polygon:
        xs, ys = values[1::2], values[2::2]
        if not all(-tx <= x <= 1 + tx for x in xs) or not all(-ty <= y <= 1 + ty for y in ys):
            return "polygon points must be normalised to [0, 1]"
        return int(values[0]), (min(xs) * width, min(ys) * height, max(xs) * width, max(ys) * height)
    xc, yc, w, h = values[1:]
    if not (-tx <= xc <= 1 + tx and -ty <= yc <= 1 + ty and -tx <= w <= 1 + tx and -ty <= h <= 1 + ty):
        return f"values must be normalised to [0, 1], got {' '.join(fields[1:])}"
    return int(values[0]), ((xc - w / 2) * width, (yc - h / 2) * height, (xc + w / 2) * width, (yc + h / 2) * height)


def _read_labels(path: str, width: int, height: int, num_classes: int, issues: DataIssues
                 ) -> tuple[list[tuple[float, ...]], list[int]] | None:
    """The valid boxes of a label file (none if it is missing; those of its first :data:`MAX_LABEL_BOXES` lines), or
    None if it cannot be read (not a regular file, a line too long or not UTF-8)."""
    boxes, labels = [], []
    try:
        for number, line in read_lines(path, MAX_LABEL_BOXES, "a label file"):
            fields = line.split()
            if not fields:
                continue
            parsed = _parse_line(fields, width, height, num_classes)
            if isinstance(parsed, str):
                issues.report(path, number, parsed, unit="box")
                continue
            box, problem = check_box(parsed[1], width, height)
            if problem is not None:
                issues.report(path, number, problem, unit="box", action="skipped" if box is None else "clipped")
            if box is not None:
                boxes.append(box)
                labels.append(parsed[0])
    except FileNotFoundError:
        return [], []
    except BadLine as error:
        if error.line <= MAX_LABEL_BOXES:
            issues.report(path, error.line, f"unreadable label file: {error.reason}")
            return None
        issues.report(path, error.line, f"more than {MAX_LABEL_BOXES:,} lines: the boxes from this line on are "
                                        f"skipped (a label file gives at most {MAX_LABEL_BOXES:,})", unit="box")
    except OSError as error:
        issues.report(path, None, f"unreadable label file: {error.strerror or error}")
        return None
    return boxes, labels


def load_yolo(source: str | os.PathLike, issues: DataIssues, keep_empty: bool, split: str = "train",
              names: list[str] | str | os.PathLike | None = None) -> tuple[list[DetectionRecord], list[str]]:
    """``(records, class names)`` of a Darknet ``.data`` file's ``split`` (``train`` or ``valid``) or of a folder.

    ``names``: the class names, or a names file; by default the ``.data`` file's ``names=``, or the folder's.
    ``keep_empty``: keep images without (remaining) boxes (validation: yes, training: no).
    """
    if split not in ("train", "valid"):
        raise ValueError(f"split must be 'train' or 'valid', not {split!r}")
    given = read_names(names) if isinstance(names, (str, os.PathLike)) else names
    source = Path(source)
    if source.is_file():
        paths, class_names = _from_data_file(source, split, given)
    elif source.is_dir():
        paths, class_names = list_images(source), given or _names_in(_find_names(source))
    else:
        raise UserError(f"data: {source} not found; expected a Darknet .data file or a folder with images/ and "
                        "labels/")
    return yolo_records(paths, len(class_names), issues, keep_empty), list(class_names)


def yolo_records(paths: list[str], num_classes: int, issues: DataIssues, keep_empty: bool,
                 decode: bool | None = None) -> list[DetectionRecord]:
    """The records of the images at ``paths`` with the boxes of their label files (Darknet's rule,
    :func:`yolo_label_path`), each of the image as shown (its EXIF orientation read with its header, the size and
    boxes of the turned image); ``image_id`` is the image's index in ``paths``. ``decode``: decode every image
    (default: in strict mode), else read their headers only."""
    decode = issues.strict if decode is None else decode
    records = []
    missing: list[str] = []
    inspected = inspect_oriented_images(paths, decode=decode)
    for image_id, (path, (size, orientation, problem)) in enumerate(zip(paths, inspected, strict=True)):
        if problem is not None:
            issues.report(path, None, problem)
            continue
        width, height = size
        label = yolo_label_path(path)
        if not os.path.lexists(label):
            missing.append(path)
        found = _read_labels(label, width, height, num_classes, issues)
        if found is None or not (found[0] or keep_empty):
            continue
        records.append(DetectionRecord(path=path, width=width, height=height, image_id=image_id,
                                       boxes=np.array(found[0], np.float32).reshape(-1, 4),
                                       labels=np.array(found[1], np.int64), orientation=orientation))
    if missing:
        say_missing_labels(missing, len(paths))
    return records


def say_missing_labels(missing: list[str], images: int) -> None:
    """One warning for the images without a label file (read as images without boxes, as Darknet and Ultralytics
    read them; Darknet prints a line for each, Ultralytics counts them): how many, and where the first one's was
    looked for by both rules."""
    import sys

    first = missing[0]
    places = dict.fromkeys([darknet_label_path(first), ultralytics_label_path(first)])
    print(f"warning: data: {len(missing):,} of {images:,} images have no label file, read as images without boxes "
          f"(the first: {first}; looked for {' and '.join(places)})", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the ``yolo`` dataset format


def yolo_splits(path: Path) -> tuple[Path, Path, str, str]:
    """(train source, val source, and the split of each) of a YOLO ``data.path``: a Darknet ``.data`` file (its
    ``train`` and ``valid`` lists), a folder with ``train/`` and ``val/`` (each with ``images/`` and ``labels/``),
    or Ultralytics' layout, ``images/train``, ``images/val`` beside ``labels/train``, ``labels/val``."""
    if path.is_file():
        return path, path, "train", "valid"
    for train, val in ((path / "train", path / "val"), (path / "images" / "train", path / "images" / "val")):
        if train.is_dir() and val.is_dir():
            return train, val, "train", "train"  # a folder is one split; "train" only names the folder's role
    raise UserError(f"data.path: {path} is neither a Darknet .data file nor a folder with train/ and val/ (or "
                    f"images/train and images/val) beside their labels")


def _subset(records: list[DetectionRecord], names: list[str], classes: list[str]
            ) -> tuple[list[DetectionRecord], list[str]]:
    """Records restricted to ``classes`` (by name, in that order), labels renumbered (COCO's rule:
    ``class_mapping`` with the names file's lines as categories)."""
    classes, new_label = class_mapping(dict(enumerate(names)), classes, "the names file")
    kept = []
    for r in records:
        keep = np.array([int(label) in new_label for label in r.labels], dtype=bool)
        labels = np.array([new_label[int(label)] for label in r.labels[keep]], np.int64)
        kept.append(DetectionRecord(path=r.path, width=r.width, height=r.height, image_id=r.image_id,
                                    boxes=r.boxes[keep], labels=labels, orientation=r.orientation))
    return kept, classes


NO_IDS = "the images are then numbered by their place in the list, the categories class index + 1"


def validation_annotations(data: DataConfig) -> tuple[Path, str] | None:
    """The COCO file of the validation images (``data.annotations``; with ``auto``, the shapes set's own
    ``annotations/val.json`` when ``data.path`` is, or is in, a set bigbatch generated) and the advice a mismatch
    message ends with; None for none."""
    if data.annotations is None:
        return None
    if data.annotations != ANNOTATIONS_AUTO:
        return Path(data.annotations), f"or set data.annotations=null: {NO_IDS}"
    path = Path(data.path)
    found = own_annotation_file(path.parent if path.is_file() else path, "val")
    if found is None:
        return None
    return found, (f"this is the file `bigbatch data shapes` wrote beside the set, taken by default (data.annotations: "
                   f"{ANNOTATIONS_AUTO}); set data.annotations=null to use none: {NO_IDS}")


def load(cfg: RunConfig, issues: DataIssues, rank: int = 0
         ) -> tuple[list[DetectionRecord], list[DetectionRecord], ClassNames]:
    """The two splits of ``data.path``; the names without category ids (label + 1), or with those of the COCO file
    of the validation images (:func:`validation_annotations`), whose image ids and objects the validation records
    then take."""
    data = cfg.data
    train_source, val_source, train_split, val_split = yolo_splits(Path(data.path))
    train, names = load_yolo(train_source, issues, keep_empty=False, split=train_split)
    val, val_names = load_yolo(val_source, issues, keep_empty=True, split=val_split)
    if val_names != names:
        raise UserError(f"data.path: the validation images of {data.path} have other class names than the training")
    if data.classes is not None:
        train, names = _subset(train, names, data.classes)
        train = [r for r in train if len(r.labels)]  # training drops images without boxes, as before the subset
        val, _ = _subset(val, val_names, data.classes)
    found = validation_annotations(data)
    if found is None:
        return train, val, ClassNames(names, None)
    path, advice = found
    val, category_ids = take_coco_ids(val, names, path, "data.annotations", issues, advice)
    return train, val, ClassNames(names, category_ids, ids_from=str(path))


def train_images(cfg: RunConfig) -> int:
    """The training images' count (their labels read; no image decoded), or ``data.train_images``; neither:
    ``DataNotAtHand``."""
    path = None if cfg.data.path is None else Path(cfg.data.path)
    if path is not None and path.exists():
        source, _, split, _ = yolo_splits(path)
        return len(load_yolo(source, DataIssues(strict=cfg.data.strict), keep_empty=False, split=split)[0])
    return train_images_given(path, cfg.data)


def _path_given(data: DataConfig) -> None:
    """Training and evaluation read the set (planning needs only the count)."""
    if data.path is None:
        raise UserError("data.path: missing; yolo needs a Darknet .data file or a dataset folder")
    if not Path(data.path).exists():
        raise UserError(f"data.path: {data.path} does not exist; yolo needs a Darknet .data file or a dataset folder")
    if data.annotations not in (None, ANNOTATIONS_AUTO) and not Path(data.annotations).exists():
        raise UserError(f"data.annotations: {data.annotations} does not exist; expected a COCO annotation file of the "
                        f"validation images, {ANNOTATIONS_AUTO} (the one `bigbatch data shapes` wrote, if any) or null "
                        f"(none)")


DATASETS.register("yolo", load, task="detection", count=train_images, given=_path_given,
                  fields=DATASET_KEYS["yolo"])
