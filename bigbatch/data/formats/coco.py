"""COCO detection data: an images folder and an annotation file (format: cocodataset.org/#format-data).

- Boxes: COCO's ``[x, y, w, h]`` becomes float32 XYXY ``[x, y, x + w, y + h]`` once, here, at load.
- Labels: contiguous 0..C-1, the chosen classes in the given order (``data.classes``, by name), or all
  categories sorted by id; annotations of other categories are dropped. ``image_id`` stays the COCO id.
- Crowd: ``iscrowd=1`` annotations are never training boxes. They stay on the record (``crowd_*``) and go
  into the evaluation ground truth with ``iscrowd=1``: detections on them are ignored rather than counted
  as false positives, as in COCO's own evaluation (cocodataset.org/#detection-eval).
- Category ids: the loader returns the class names as ``ClassNames``, whose ``category_ids[label]`` is the
  annotation file's id of each class (of the validation file, against which results are scored), so that the
  evaluation's ground truth (``coco_ground_truth``) and the detections (a COCO results file, ``eval
  --save-detections``) carry the file's own ids: pycocotools, faster-coco-eval or the COCO server score such a
  file against the original annotation file as bigbatch does. A set without ids (YOLO) numbers categories
  ``label + 1`` (``CATEGORY_ID_OFFSET``; COCO ids start at 1).

Bad data (see ``bigbatch.data.pipeline.problems``): images are checked by their headers (existence, format, the
size against the file's width and height), or fully decoded in strict mode; annotations are checked one
by one and reported as ``<annotation file>:annotation #k (id N): ...`` (``image_id`` and ``category_id`` must be
whole numbers, not ``true``; ``iscrowd``, 0 when absent, must be 0 or 1: a string ``"0"`` is no flag). Images are
read only inside the images folder: an entry whose ``file_name`` is absolute, or leads out of the folder by ``..``,
is a bad entry (``<annotation file>:image #k (id N): ...``), skipped with its annotations.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np

from bigbatch.config.data_keys import DATASET_KEYS
from bigbatch.data.formats.counts import train_images_given
from bigbatch.data.formats.detection import DetectionRecord, check_box
from bigbatch.data.pipeline.files import read_regular
from bigbatch.data.pipeline.images import inspect_images
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from bigbatch.floor.user_files import lies_inside
from bigbatch.registry import DATASETS

if TYPE_CHECKING:
    from bigbatch.config import DataConfig, RunConfig

CATEGORY_ID_OFFSET = 1
"""A set without category ids (YOLO): category id = contiguous label + 1 (COCO's ids start at 1)."""

ANNOTATION_FILE_LIMIT = 2**32
"""The largest annotation file read (4 GiB; COCO's instances_train2017.json is 448 MB, LVIS v1's train file 1.1 GB):
a file is read whole and parsed in memory."""


class ClassNames(list[str]):
    """Class names in label order, with ``category_ids``: the annotation file's category id of each label
    (``category_ids[label]``), or None for a set without ids (YOLO: ``label + CATEGORY_ID_OFFSET`` stands in), and
    ``ids_from``: for a set whose own files carry no ids, the COCO file whose image and category ids it took
    (``data/formats/coco_ids.py``). A plain list of names otherwise (equality, indexing and JSON compare and write the
    names only)."""

    def __init__(self, names: list[str], category_ids: list[int] | None = None, ids_from: str | None = None):
        super().__init__(names)
        if category_ids is not None and len(category_ids) != len(names):
            raise ValueError(f"{len(category_ids)} category ids for {len(names)} class names")
        self.category_ids = None if category_ids is None else [int(c) for c in category_ids]
        self.ids_from = ids_from


def category_ids_of(class_names: list[str], category_ids: list[int] | None = None) -> list[int]:
    """The category id of each label: ``category_ids`` (the annotation file's), else ``label + 1``."""
    if category_ids is None:
        return [label + CATEGORY_ID_OFFSET for label in range(len(class_names))]
    if len(category_ids) != len(class_names):
        raise ValueError(f"{len(category_ids)} category ids for {len(class_names)} class names")
    return [int(c) for c in category_ids]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_size(value: Any) -> bool:
    return _is_number(value) and value > 0 and float(value).is_integer()


def _is_id(value: Any) -> bool:
    """An id as a COCO file gives one: a whole number (``true`` is no id, though Python's bool is an int)."""
    return _is_number(value) and float(value).is_integer()


def read_annotation_file(path: Path, key: str = "data") -> dict[str, Any]:
    """A COCO annotation file's JSON, checked to hold the ``images``, ``annotations`` and ``categories`` lists. The
    file is read as an untrusted one (``files.read_regular``: a regular file of at most ``ANNOTATION_FILE_LIMIT``
    bytes); each problem is a ``UserError`` naming ``key`` and the file."""
    try:
        data = json.loads(read_regular(path, ANNOTATION_FILE_LIMIT, "an annotation file").decode("utf-8-sig"))
    except FileNotFoundError:
        raise UserError(f"{key}: annotation file {path} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{key}: cannot read annotation file {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{key}: {path}:{error.lineno}: not valid JSON ({error.msg}, column {error.colno})") from None
    except ValueError as error:  # a number of more than 4,300 digits
        raise UserError(f"{key}: {path}: not a COCO annotation file ({error})") from None
    except RecursionError:
        raise UserError(f"{key}: {path}: not a COCO annotation file (its JSON is nested too deeply)") from None
    expected = "a COCO annotation file: an object with 'images', 'annotations' and 'categories' lists"
    if not isinstance(data, dict):
        raise UserError(f"{key}: {path}: expected {expected}")
    for name in ("images", "annotations", "categories"):
        if name not in data:  # e.g. an image-info file (COCO test-dev) has no 'annotations': no boxes to learn or score
            raise UserError(f"{key}: {path}: the '{name}' key is missing; expected {expected}")
        if not isinstance(data[name], list):
            kind = type(data[name]).__name__
            raise UserError(f"{key}: {path}: '{name}' is a {kind}, not a list; expected {expected}")
    return data


def images_in_annotations(path: Path, data: DataConfig, key: str) -> int:
    """The image count of a COCO annotation file (before any image is checked), or :func:`train_images_given`. The
    file is read as every annotation file is (``coco.read_annotation_file``: a regular file, its size bounded, its
    JSON checked), so that a broken one is the same one-line error here, before any work, as when training reads it."""
    if path.is_file():
        return len(read_annotation_file(path, key)["images"])
    return train_images_given(path, data, key)


def categories_of(data: dict[str, Any], path: Path, key: str = "data") -> dict[int, str]:
    """``{category id: name}`` of a file :func:`read_annotation_file` read (ids integers, each once)."""
    categories: dict[int, str] = {}
    for k, category in enumerate(data["categories"]):
        ok = isinstance(category, dict) and _is_number(category.get("id")) and isinstance(category.get("name"), str)
        if not ok or not float(category["id"]).is_integer():
            raise UserError(f"{key}: {path}: category #{k}: expected {{'id': <int>, 'name': <str>}}, got {category!r}")
        if int(category["id"]) in categories:
            raise UserError(f"{key}: {path}: category #{k}: id {category['id']} appears twice")
        categories[int(category["id"])] = category["name"]
    if not categories:
        raise UserError(f"{key}: {path}: 'categories' is empty")
    return categories


def class_mapping(categories: dict[int, str], classes: list[str] | None, path: Path | str = "the annotation file"
                  ) -> tuple[list[str], dict[int, int]]:
    """``(class names, {category id: contiguous label})``: ``classes`` by name in their order, else all by id."""
    if classes is None:
        ids = sorted(categories)
        return [categories[i] for i in ids], {cid: label for label, cid in enumerate(ids)}
    if not classes:
        raise UserError("data.classes: the list is empty; give class names, or leave it out for all classes")
    by_name: dict[str, int] = {}
    for cid in sorted(categories):
        by_name.setdefault(categories[cid], cid)
    mapping: dict[int, int] = {}
    for label, name in enumerate(classes):
        if name not in by_name:
            known = ", ".join(categories[i] for i in sorted(categories))
            raise UserError(f"data.classes: unknown class {name!r}; the categories in {path} are: {known}")
        if by_name[name] in mapping:
            raise UserError(f"data.classes: {name!r} is listed twice")
        mapping[by_name[name]] = label
    return list(classes), mapping


class AnnotatedImage:
    """An image entry of an annotation file with its annotations: ``file_name`` as the file gives it, ``path`` that
    name in the images folder; boxes XYXY (checked and clipped), labels, areas, crowd regions (as given), and
    ``truth``: every other annotation as given (``(xyxy, label, area)``), the evaluation's ground truth."""

    def __init__(self, file_name: str, path: str, width: int, height: int):
        self.file_name, self.path, self.width, self.height = file_name, path, width, height
        self.boxes: list[tuple[float, ...]] = []
        self.labels: list[int] = []
        self.areas: list[float] = []
        self.crowd_boxes: list[tuple[float, ...]] = []
        self.crowd_labels: list[int] = []
        self.crowd_areas: list[float] = []
        self.truth: list[tuple[tuple[float, ...], int, float]] = []


def _leaves(images_dir: Path, name: str) -> str | None:
    """Why the image ``name`` (an entry's ``file_name``) is not read from ``images_dir``, or None: an absolute name, or
    a name with ``..`` whose folder, ``..`` and links followed as the system follows them, is not ``images_dir`` or a
    folder below it. A name without ``..`` is read as it stands: a link in the folder is followed, as the ``folder``
    format follows one; the folder may itself be a link."""
    if os.path.isabs(name):
        return f"file_name {name!r} is an absolute path; file names are relative to the images folder {images_dir}"
    parts = PurePosixPath(name).parts
    if ".." not in parts:
        return None
    holder = images_dir / name if parts[-1] == ".." else images_dir.joinpath(*parts[:-1])
    try:
        inside = lies_inside(images_dir, holder)
    except (OSError, ValueError):  # a NUL in the name, a loop of links
        inside = False
    if inside:
        return None
    return f"file_name {name!r} leads outside the images folder {images_dir} (.. and links followed)"


def _images(data: dict[str, Any], images_dir: Path, path: Path, issues: DataIssues, contained: bool = False
            ) -> tuple[dict[int, AnnotatedImage], set[int]]:
    """``({image id: entry}, ids of image entries skipped as malformed)``, in file order. ``contained``: an entry whose
    ``file_name`` leaves ``images_dir`` (:func:`_leaves`) is one of them."""
    images: dict[int, AnnotatedImage] = {}
    skipped: set[int] = set()
    for k, entry in enumerate(data["images"]):
        image_id = entry.get("id") if isinstance(entry, dict) else None
        where = f"image #{k} (id {image_id})"
        if not (_is_number(image_id) and float(image_id).is_integer()):
            issues.report(path, where, f"image entry without an integer 'id': {entry!r}")
            continue
        image_id = int(image_id)
        name, width, height = entry.get("file_name"), entry.get("width"), entry.get("height")
        if not (isinstance(name, str) and name and _is_size(width) and _is_size(height)):
            issues.report(path, where, "image entry needs 'file_name' and positive integer 'width' and 'height', "
                          f"got {entry!r}")
            skipped.add(image_id)
        elif image_id in images or image_id in skipped:
            issues.report(path, where, f"image id {image_id} appears twice; the first entry is kept")
        elif contained and (problem := _leaves(images_dir, name)) is not None:
            issues.report(path, where, problem)
            skipped.add(image_id)
        else:
            images[image_id] = AnnotatedImage(name, os.path.abspath(images_dir / name), int(width), int(height))
    return images, skipped


def _gather(data: dict[str, Any], images: dict[int, AnnotatedImage], skipped_images: set[int],
            categories: dict[int, str], label_of: dict[int, int], path: Path, issues: DataIssues) -> None:
    """Each annotation checked and added to its image as a training box or a crowd region."""
    for k, ann in enumerate(data["annotations"]):
        where = f"annotation #{k} (id {ann.get('id') if isinstance(ann, dict) else None})"
        if not isinstance(ann, dict):
            issues.report(path, where, f"annotation is not an object: {ann!r}", unit="box")
            continue
        image_id, category_id, bbox = ann.get("image_id"), ann.get("category_id"), ann.get("bbox")
        malformed = [f"{key} must be an integer, got {value!r}" for key, value in
                     (("image_id", image_id), ("category_id", category_id)) if not _is_id(value)]
        crowd = ann.get("iscrowd", 0)
        if not (_is_number(crowd) and crowd in (0, 1)):
            malformed.append(f"iscrowd must be 0 or 1, got {crowd!r}")
        if malformed:
            issues.report(path, where, "; ".join(malformed), unit="box")
            continue
        image_id, category_id = int(image_id), int(category_id)
        if image_id in skipped_images:
            continue  # its image entry was reported already
        if image_id not in images:
            issues.report(path, where, f"image_id {ann.get('image_id')!r} is not in 'images'", unit="box")
            continue
        if category_id not in categories:
            issues.report(path, where, f"category_id {ann.get('category_id')!r} is not in 'categories'", unit="box")
            continue
        if category_id not in label_of:
            continue  # a class left out by data.classes
        if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
            issues.report(path, where, f"bbox must be 4 numbers [x, y, width, height], got {bbox!r}", unit="box")
            continue
        image = images[image_id]
        x, y, w, h = (float(v) for v in bbox)
        xyxy = (x, y, x + w, y + h)  # COCO [x, y, w, h] -> [x1, y1, x2, y2]
        area = float(ann["area"]) if _is_number(ann.get("area")) else None
        if crowd:
            image.crowd_boxes.append(xyxy)  # as given, like COCO's evaluation uses it
            image.crowd_labels.append(label_of[category_id])
            image.crowd_areas.append(w * h if area is None else area)
            continue
        if w >= 0 and h >= 0:  # as pycocotools scores the file: unclipped; outside the image or of no size, missed
            image.truth.append((xyxy, label_of[category_id], w * h if area is None else area))
        box, problem = check_box(xyxy, image.width, image.height)
        if problem is not None:
            issues.report(path, where, f"bbox {list(bbox)}: {problem}", unit="box",
                          action="skipped" if box is None else "clipped")
        if box is None:
            continue
        image.boxes.append(box)
        image.labels.append(label_of[category_id])
        image.areas.append((box[2] - box[0]) * (box[3] - box[1]) if area is None else area)


def annotated_images(data: dict[str, Any], images_dir: Path, path: Path, categories: dict[int, str],
                     label_of: dict[int, int], issues: DataIssues, contained: bool = False
                     ) -> dict[int, AnnotatedImage]:
    """``{image id: entry}`` of a file :func:`read_annotation_file` read, in file order, each with its annotations of
    the categories in ``label_of`` (``{category id: label}``); malformed entries and annotations reported to
    ``issues`` and skipped (the images are not opened). ``contained``: the images are to be read, so an entry whose
    ``file_name`` leaves ``images_dir`` (absolute, or ``..`` out of it) is reported and skipped too (a caller that only
    compares the names, ``coco_ids``, takes any)."""
    images, skipped = _images(data, images_dir, path, issues, contained)
    _gather(data, images, skipped, categories, label_of, path, issues)
    return images


def load_coco(images_dir: str | os.PathLike, annotation_file: str | os.PathLike, classes: list[str] | None,
              issues: DataIssues, keep_empty: bool) -> tuple[list[DetectionRecord], ClassNames]:
    """``(records, class names)`` of a COCO set, in the order of the file's ``images``; the names carry each
    label's category id in this file (``ClassNames.category_ids``).

    ``keep_empty``: keep images without (remaining) training boxes (validation: yes, training: no); such a set's
    records carry the file's own boxes as the evaluation's ground truth (``DetectionRecord.truth``).
    """
    path = Path(annotation_file)
    data = read_annotation_file(path)
    categories = categories_of(data, path)
    names, label_of = class_mapping(categories, classes, path)
    images = annotated_images(data, Path(images_dir), path, categories, label_of, issues, contained=True)

    chosen = [(image_id, image) for image_id, image in images.items() if image.boxes or keep_empty]
    records = []
    for (image_id, image), (size, problem) in zip(chosen, inspect_images([i.path for _, i in chosen],
                                                                         decode=issues.strict), strict=True):
        if problem is None and size != (image.width, image.height):
            problem = f"image is {size[0]}x{size[1]} but {path} says {image.width}x{image.height}"
        if problem is not None:
            issues.report(image.path, None, problem)
            continue
        records.append(DetectionRecord(
            path=image.path, width=image.width, height=image.height, image_id=image_id,
            boxes=np.array(image.boxes, np.float32).reshape(-1, 4), labels=np.array(image.labels, np.int64),
            areas=np.array(image.areas, np.float32),
            crowd_boxes=np.array(image.crowd_boxes, np.float32).reshape(-1, 4),
            crowd_labels=np.array(image.crowd_labels, np.int64), crowd_areas=np.array(image.crowd_areas, np.float32),
            truth=file_truth(image) if keep_empty else None,
        ))
    category_of = {label: category_id for category_id, label in label_of.items()}  # label -> the file's id
    return records, ClassNames(names, [category_of[label] for label in range(len(names))])


def file_truth(image: AnnotatedImage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An image entry's annotations as the file gives them (``AnnotatedImage.truth``), as ``DetectionRecord.truth``."""
    return (np.array([box for box, _, _ in image.truth], np.float64).reshape(-1, 4),
            np.array([label for _, label, _ in image.truth], np.int64),
            np.array([area for _, _, area in image.truth], np.float64))


def load_coco_splits(splits: list[tuple[Path, Path]], classes: list[str] | None, issues: DataIssues
                     ) -> tuple[list[DetectionRecord], list[DetectionRecord], ClassNames]:
    """(train records, val records, class names) of two COCO splits, each (images folder, annotation file); the
    validation split must have the training split's categories (by name). The names carry the validation
    file's category ids, those a results file is scored against (the two files may number a class apart)."""
    (train_images, train_json), (val_images, val_json) = splits
    train, names = load_coco(train_images, train_json, classes, issues, keep_empty=False)
    val, val_names = load_coco(val_images, val_json, names, issues, keep_empty=True)
    if val_names != names:
        raise UserError(f"data.val: {val_json} has other categories than {train_json}")
    return train, val, val_names


def coco_ground_truth(records: list[DetectionRecord], class_names: list[str],
                      category_ids: list[int] | None = None) -> dict[str, Any]:
    """A COCO-format ground truth of ``records``: category id = ``category_ids[label]`` (default label + 1),
    boxes back to [x, y, w, h], each record's ``areas``, crowd regions with ``iscrowd=1``, annotation ids 1, 2,
    ... (COCOeval treats id 0 as "unmatched"). The objects are a record's ``truth`` where it has one (a COCO file's
    own boxes), else its training boxes. Works for records of any loader (YOLO records: box areas, no crowd)."""
    ids = category_ids_of(class_names, category_ids)
    annotations: list[dict[str, Any]] = []

    def add(record: DetectionRecord, boxes: np.ndarray, labels: np.ndarray, areas: np.ndarray, crowd: int) -> None:
        for (x1, y1, x2, y2), label, area in zip(boxes.tolist(), labels.tolist(), areas.tolist(), strict=True):
            annotations.append({
                "id": len(annotations) + 1, "image_id": record.image_id, "category_id": ids[label],
                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": area, "iscrowd": crowd,
            })

    for record in records:
        add(record, *(record.truth or (record.boxes, record.labels, record.areas)), 0)
        add(record, record.crowd_boxes, record.crowd_labels, record.crowd_areas, 1)
    return {
        "info": {"description": "bigbatch ground truth"},
        "images": [{"id": r.image_id, "file_name": r.path, "width": r.stored_size[0], "height": r.stored_size[1]}
                   for r in records],  # the stored pixels' size, as the boxes (an EXIF-turned YOLO image's too)
        "annotations": annotations,
        "categories": [{"id": ids[label], "name": name} for label, name in enumerate(class_names)],
    }


# ----------------------------------------------------------------------------- the ``coco`` dataset format


def load(cfg: RunConfig, issues: DataIssues, rank: int = 0
         ) -> tuple[list[DetectionRecord], list[DetectionRecord], ClassNames]:
    """The splits ``data.train`` and ``data.val`` (each ``images`` and ``annotations``); the names carry
    ``data.val.annotations``' category ids."""
    data = cfg.data
    splits = [(Path(s.images), Path(s.annotations)) for s in (data.train, data.val)]
    for key, (images, annotation_file) in zip(("data.train", "data.val"), splits, strict=True):
        if not images.is_dir():
            raise UserError(f"{key}.images: {images} is not a folder")
        if not annotation_file.is_file():
            raise UserError(f"{key}.annotations: {annotation_file} does not exist")
    return load_coco_splits(splits, data.classes, issues)


def train_images(cfg: RunConfig) -> int:
    """The images of ``data.train.annotations``; ``data.train_images`` when it is not at hand; neither:
    ``DataNotAtHand``."""
    if cfg.data.train is None:
        return train_images_given(None, cfg.data, "data.train")
    return images_in_annotations(Path(cfg.data.train.annotations), cfg.data, "data.train.annotations")


def _splits_given(data: DataConfig) -> None:
    """Training and evaluation read both splits (planning needs only the count)."""
    for split in ("train", "val"):
        if getattr(data, split) is None:
            raise UserError(f"data.{split}: missing; coco needs data.{split}.images and data.{split}.annotations")


DATASETS.register("coco", load, task="detection", count=train_images, given=_splits_given,
                  fields=DATASET_KEYS["coco"])
