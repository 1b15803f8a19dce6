"""A COCO file's ids for records loaded from elsewhere (a YOLO set): images matched by file name, categories by
name, and each object's box, ``area`` and the crowd regions taken from the file.

A YOLO set numbers nothing: bigbatch's image id is an image's position in its list, its category id the class index
+ 1. When a COCO annotation file describes the same images (the ``yolo`` format's ``data.annotations``), the
validation records take that file's ids and objects, so that a COCO results file (``eval --save-detections``) scores
against the file with pycocotools as bigbatch scores it:

- an image is the file's one entry whose ``file_name`` ends the image's path (``000048.jpg`` or ``val/000048.jpg``
  for ``/data/set/val/000048.jpg``), of the image's width and height; no two images may be one entry's;
- a class is the file's one category of that name (a ``data.classes`` subset included);
- an object, a labelled box, is the file's annotation of its image and class whose box is the same within
  ``SAME_BOX_PX`` on every side (both clipped to the image), matched one to one, the closest first. The evaluation's
  ground truth then holds the annotation's box and ``area``: COCO's area is the mask's, not the box's, so the small /
  medium / large ranges are the file's. The file's crowd regions (``iscrowd: 1``) join the ground truth as in the
  ``coco`` format (detections on them are ignored); a labelled box on one is that region.

Orientation: a COCO file describes an image's stored pixels (its ``width`` and ``height``, its boxes, as pycocotools
reads them); a YOLO record the image as shown, its stored pixels turned by their EXIF orientation
(``DetectionRecord.orientation``, ``darknet/yolo_data.py``). The two are compared in the shown image: the entry's size
with the record's stored size, the file's boxes and crowd regions turned (``images.boxes_to_displayed``) to be matched
with the labelled boxes and to become the training boxes; the evaluation's ground truth (``truth`` and the crowd
regions) keeps the file's own, on the stored pixels, where a results file is scored.

Anything else (an image the file lacks, a class it does not name, a box without its annotation, an annotation of a
class in use without its box) means the two do not describe the same set, and a results file could not be scored
against the file as bigbatch scores it: one ``UserError`` naming the key, the file, the first mismatches and their
count. The file is read as ``coco.read_annotation_file`` reads one (a regular file, bounded); its ``file_name``
values are only compared with the images' paths, never opened.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath, PurePosixPath

import numpy as np

from bigbatch.data.formats.coco import (
    AnnotatedImage,
    annotated_images,
    categories_of,
    file_truth,
    read_annotation_file,
)
from bigbatch.data.formats.detection import DetectionRecord
from bigbatch.data.pipeline.images import boxes_to_displayed
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError

SAME_BOX_PX = 1.0
"""How far (pixels, each side) a labelled box may lie from its annotation's box: a YOLO label's 6 decimals round a
box by about a millionth of the image's side, a converter's own rounding or the loaders' clipping by at most 1 px."""
SHOWN = 3
"""The mismatches a message names (then their count)."""


def take_coco_ids(records: list[DetectionRecord], class_names: list[str], path: str | os.PathLike, key: str,
                  issues: DataIssues, advice: str = "") -> tuple[list[DetectionRecord], list[int]]:
    """``(records, category ids)``: each record with the file's image id, its objects' boxes and areas and the crowd
    regions of its image; the file's category id of each class (``category_ids[label]``).

    A mismatch is a ``UserError`` naming ``key`` and the file, ``advice`` appended (what else the user can do).
    Malformed image entries and annotations of the file are reported to ``issues`` (as the ``coco`` format does).
    """
    path = Path(path)
    data = read_annotation_file(path, key)
    categories = categories_of(data, path, key)
    category_ids = category_ids_by_name(categories, class_names, path, key)
    label_of = {category_id: label for label, category_id in enumerate(category_ids)}
    images = annotated_images(data, Path(), path, categories, label_of, issues)
    problems: list[str] = []
    matched = _match_images(records, images, problems)
    taken = []
    for record, image_id in zip(records, matched, strict=True):
        if image_id is not None:
            taken.append(_with_objects(record, image_id, images[image_id], class_names, problems))
    if problems:
        shown = "; ".join(problems[:SHOWN]) + ("; ..." if len(problems) > SHOWN else "")
        raise UserError(f"{key}: {path} does not describe the same images and objects ({len(problems)} "
                        f"mismatch{'es' if len(problems) > 1 else ''}: {shown}); each image must have its entry (by "
                        f"file name) and each box its annotation (same class, same box within {SAME_BOX_PX:g} px)"
                        f"{'; ' + advice if advice else ''}")
    return taken, category_ids


def category_ids_by_name(categories: dict[int, str], class_names: list[str], path: Path, key: str) -> list[int]:
    """The file's one category id of each class name."""
    ids_of: dict[str, list[int]] = {}
    for category_id, name in categories.items():
        ids_of.setdefault(name, []).append(category_id)
    missing = [name for name in class_names if name not in ids_of]
    if missing:
        known = ", ".join(categories[i] for i in sorted(categories))
        raise UserError(f"{key}: {path} has no category named {', '.join(map(repr, missing))} (classes are matched by "
                        f"name; its categories: {known})")
    twice = [f"{name!r} (ids {', '.join(map(str, ids_of[name]))})" for name in class_names if len(ids_of[name]) > 1]
    if twice:
        raise UserError(f"{key}: {path} names several categories {', '.join(twice)}; classes are matched by name")
    return [ids_of[name][0] for name in class_names]


def _match_images(records: list[DetectionRecord], images: dict[int, AnnotatedImage], problems: list[str]
                  ) -> list[int | None]:
    """The file's image id of each record (None where there is none; the problem is added to ``problems``)."""
    by_last: dict[str, list[tuple[tuple[str, ...], int]]] = {}
    for image_id, image in images.items():
        parts = PurePosixPath(image.file_name).parts
        if parts:  # "." names no file
            by_last.setdefault(parts[-1], []).append((parts, image_id))
    owner: dict[int, str] = {}
    matched: list[int | None] = []
    for record in records:
        parts = PurePath(os.path.normpath(record.path)).parts
        hits = [image_id for names, image_id in by_last.get(parts[-1], []) if parts[-len(names):] == names]
        image_id = hits[0] if len(hits) == 1 else None
        if not hits:
            problems.append(f"{record.path} has no image entry (none whose file_name ends its path)")
        elif len(hits) > 1:
            names = ", ".join(f"{images[i].file_name!r} (id {i})" for i in hits[:SHOWN])
            problems.append(f"{record.path} matches several image entries: {names}")
        elif (images[image_id].width, images[image_id].height) != record.stored_size:
            entry = images[image_id]
            width, height = record.stored_size
            shown = "" if record.orientation == 1 else (f" stored ({record.width}x{record.height} as shown, EXIF "
                                                        f"orientation {record.orientation})")
            problems.append(f"{record.path} is {width}x{height}{shown}, its entry {entry.file_name!r} (id "
                            f"{image_id}) says {entry.width}x{entry.height}")
            image_id = None
        elif image_id in owner:
            problems.append(f"{owner[image_id]} and {record.path} both match the entry "
                            f"{images[image_id].file_name!r} (id {image_id})")
            image_id = None
        else:
            owner[image_id] = record.path
        matched.append(image_id)
    return matched


def _pairs(boxes: np.ndarray, labels: np.ndarray, others: np.ndarray, other_labels: np.ndarray
           ) -> list[tuple[int, int]]:
    """``(i, j)`` pairs of boxes of one label whose sides lie within ``SAME_BOX_PX``, one to one, the closest first
    (the largest side difference; ties by index)."""
    if not len(boxes) or not len(others):
        return []
    distance = np.abs(boxes[:, None, :] - others[None, :, :]).max(axis=2)  # [N, M]: the largest side difference
    distance[labels[:, None] != other_labels[None, :]] = np.inf
    candidates = sorted((float(distance[i, j]), int(i), int(j)) for i, j in np.argwhere(distance <= SAME_BOX_PX))
    pairs, used, used_other = [], set(), set()
    for _, i, j in candidates:
        if i not in used and j not in used_other:
            pairs.append((i, j))
            used.add(i)
            used_other.add(j)
    return pairs


def _with_objects(record: DetectionRecord, image_id: int, image: AnnotatedImage, class_names: list[str],
                  problems: list[str]) -> DetectionRecord:
    """``record`` with the file's image id, the boxes and areas of its annotations and its image's crowd regions.

    The file's boxes are turned to the record's shown image (``record.orientation``) to be matched and trained on; the
    crowd regions and the ground truth (``truth``) stay as the file gives them, on the stored pixels."""
    boxes = record.boxes.astype(np.float64)
    labels = record.labels
    stored = (image.width, image.height)
    theirs = boxes_to_displayed(np.array(image.boxes, np.float64).reshape(-1, 4), record.orientation, stored)
    their_labels = np.array(image.labels, np.int64)
    crowd = np.array(image.crowd_boxes, np.float64).reshape(-1, 4)
    crowd_labels = np.array(image.crowd_labels, np.int64)
    pairs = _pairs(boxes, labels, theirs, their_labels)
    rest = sorted(set(range(len(boxes))) - {i for i, _ in pairs})
    clipped_crowd = boxes_to_displayed(np.clip(crowd, 0, [*stored, *stored]), record.orientation, stored)
    on_crowd = {rest[i] for i, _ in _pairs(boxes[rest], labels[rest], clipped_crowd, crowd_labels)}
    entry = f"entry {image.file_name!r} (id {image_id})"
    shown = "" if record.orientation == 1 else f" on the image as shown (EXIF orientation {record.orientation})"
    for i in rest:
        if i not in on_crowd:
            box = ", ".join(f"{v:g}" for v in np.round(boxes[i], 2))
            problems.append(f"{record.path}: its {class_names[labels[i]]} box [{box}] (x1, y1, x2, y2){shown} has no "
                            f"annotation in {entry}")
    for j in sorted(set(range(len(theirs))) - {j for _, j in pairs}):
        x1, y1, x2, y2 = image.boxes[j]  # as the file gives it
        box = ", ".join(f"{v:g}" for v in np.round([x1, y1, x2 - x1, y2 - y1], 2))
        problems.append(f"{record.path}: the {class_names[their_labels[j]]} annotation [{box}] (x, y, w, h) of "
                        f"{entry} has no labelled box")
    pairs.sort()
    kept = [j for _, j in pairs]
    return DetectionRecord(path=record.path, width=record.width, height=record.height, image_id=image_id,
                           boxes=theirs[kept], labels=their_labels[kept],
                           areas=np.array([image.areas[j] for j in kept], np.float32),
                           crowd_boxes=crowd, crowd_labels=crowd_labels,
                           crowd_areas=np.array(image.crowd_areas, np.float32), truth=file_truth(image),
                           orientation=record.orientation)
