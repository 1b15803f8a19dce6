"""What ``bigbatch predict`` writes: ``--out DIR`` with ``predictions.jsonl`` (and ``labels/``, ``images/``), and a
COCO results file (``--coco``).

- ``predictions.jsonl``: one record per image or frame (``inference/predictor.py``), boxes to 3 decimals.
- ``labels/<name>.txt`` (``--txt``): a detector's boxes as Darknet / YOLO labels, ``class cx cy w h`` relative to the
  image, 6 decimals (as ``data shapes --format yolo`` writes them: a set Darknet or bigbatch trains on). A video's
  frame ``k`` is ``<name>_<k>.txt``; a name met twice gains ``_2``, ``_3``, ...
- ``images/<name>.jpg`` (``--save-images``): the image drawn with its boxes, class names and scores
  (``torchvision.utils.draw_bounding_boxes``), or with its top class for a classifier.
- ``--coco FILE.json``: the detections as COCO results (``tasks/coco_eval.py``'s ``detections_to_coco``, as ``eval
  --save-detections`` writes them). With ``--annotations A.json`` (a COCO file of the same images), an image's id is
  the entry whose ``file_name`` ends its path and a class's the category of its name (``data/formats/coco_ids.py``'s
  rule); without, the image id is its place in the order predicted (from 0) and the category id the class + 1.

``--out`` is a new or empty folder, or one an earlier ``predict`` wrote: it holds ``.bigbatch-predict``, the list of
the files it wrote (each name added before its file is made), and nothing else; those files (and only they) are
removed before the new ones are written.
Anything else there stops ``predict`` before any work: bigbatch never deletes or overwrites a file it did not
create. An existing ``--coco`` file is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import torch

from bigbatch.errors import UserError

MARKER = ".bigbatch-predict"
MARKER_HEAD = "bigbatch predict wrote these files here, one a line:"
PREDICTIONS = "predictions.jsonl"
LABELS = "labels"
IMAGES = "images"
MAX_LISTED = 2**24
"""The most files a marker may list (an earlier run's record, read before anything is removed)."""


def check_out_dir(out: Path) -> list[Path]:
    """The files an earlier ``predict`` wrote in ``out`` (to remove before writing), after checking that ``out`` is
    new, empty or holds nothing else (see the module docstring); a ``UserError`` otherwise."""
    if not out.exists() and not out.is_symlink():
        if not out.parent.is_dir():
            raise UserError(f"--out: the folder {out.parent} does not exist")
        return []
    if out.is_symlink() or not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a folder")
    present = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir() or p.is_symlink())
    if not present:
        return []
    listed = _listed(out / MARKER)
    if listed is None:
        raise UserError(f"--out: {out} holds files bigbatch predict did not write ({present[0]}, ...); choose a new "
                        "or empty folder")
    foreign = [name for name in present if name != MARKER and name not in listed]
    if foreign:
        raise UserError(f"--out: {out} holds {foreign[0]}, which no earlier bigbatch predict wrote there; choose a "
                        "new or empty folder")
    return [out / name for name in present if name != MARKER]


def _listed(marker: Path) -> set[str] | None:
    """The files a marker lists, or None when ``marker`` is not one (missing, not a regular file, not ours)."""
    from bigbatch.data.pipeline.files import read_lines

    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        lines = [line for _, line in read_lines(marker, MAX_LISTED, "a predict marker")]
    except OSError:
        return None
    if not lines or lines[0] != MARKER_HEAD:
        return None
    return {name for name in lines[1:] if name and ".." not in PurePath(name).parts}


class Outputs:
    """The files of one ``predict`` (see the module docstring); ``add`` each record as it comes, then ``close``."""

    def __init__(self, out: Path, classes: list[str], task: str, txt: bool = False, save_images: bool = False,
                 coco: Path | None = None, annotations: Path | None = None) -> None:
        self.out, self.classes, self.task = out, classes, task
        self.txt, self.save_images, self.coco = txt, save_images, coco
        if (txt or coco is not None) and task != "detection":
            raise UserError(f"{'--txt' if txt else '--coco'}: writes detections; the model is a classifier")
        if annotations is not None and coco is None:
            raise UserError("--annotations: gives --coco's ids; add --coco FILE.json")
        self.stale = check_out_dir(out)
        if coco is not None:
            from bigbatch.floor.outputs import check_output_file

            check_output_file(coco, "--coco")
        self.ids = CocoIds(annotations, classes) if annotations is not None else None
        self.written: list[str] = []
        self.names_used: set[str] = set()
        self.detections: list[dict[str, Any]] = []
        self.count = 0
        self._jsonl = None
        self._marker = None

    def open(self) -> None:
        """Remove the earlier predict's files (proven its own by :func:`check_out_dir`), write the marker first, then
        start ``predictions.jsonl``."""
        for path in self.stale:
            path.unlink()
        for folder in (self.out / LABELS, self.out / IMAGES):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()  # an empty folder an earlier predict made (it held only listed files)
        self.out.mkdir(exist_ok=True)
        self._marker = open(self.out / MARKER, "w", encoding="utf-8")
        self._marker.write(MARKER_HEAD + "\n")
        self._claim(PREDICTIONS)
        self._jsonl = open(self.out / PREDICTIONS, "x", encoding="utf-8")

    def _claim(self, name: str) -> None:
        """Add ``name`` to the marker before its file is made: a predict cut short leaves no file it did not list."""
        self._marker.write(name + "\n")
        self._marker.flush()
        self.written.append(name)

    def add(self, record: dict[str, Any], pixels: torch.Tensor | None) -> None:
        """One record; ``pixels`` (uint8 [3, H, W]) are drawn for ``--save-images``."""
        assert self._jsonl is not None
        self._jsonl.write(json.dumps(_rounded(record)) + "\n")
        name = self._name(record)
        if self.txt:
            self._write(f"{LABELS}/{name}.txt", _yolo_lines(record).encode())
        if self.save_images and pixels is not None:
            self._write(f"{IMAGES}/{name}.jpg", self._drawn(record, pixels))
        if self.coco is not None:
            self._coco(record)
        self.count += 1

    def close(self) -> list[Path]:
        """Finish every file; -> the paths written (``predictions.jsonl``, the folders, the COCO file)."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._marker.close()
        written = [self.out / PREDICTIONS]
        written += [self.out / folder for folder in (LABELS, IMAGES) if (self.out / folder).is_dir()]
        if self.coco is not None:
            from bigbatch.tasks.coco_eval import save_detections

            save_detections(self.coco, self.detections)
            written.append(self.coco)
        return written

    def _name(self, record: dict[str, Any]) -> str:
        """The record's file name without its suffix (``_<frame>`` for a video's), unique in this predict."""
        stem = PurePath(record["file"]).stem if record["file"] is not None else "image"
        if record["frame"] is not None:
            stem = f"{stem}_{record['frame']}"
        name, k = stem, 1
        while name in self.names_used:
            k += 1
            name = f"{stem}_{k}"
        self.names_used.add(name)
        return name

    def _write(self, name: str, data: bytes) -> None:
        path = self.out / name
        path.parent.mkdir(exist_ok=True)
        self._claim(name)
        with open(path, "xb") as f:  # a new file: what was there was removed in open()
            f.write(data)

    def _drawn(self, record: dict[str, Any], pixels: torch.Tensor) -> bytes:
        from torchvision.io import encode_jpeg
        from torchvision.utils import draw_bounding_boxes

        if self.task == "detection":
            boxes = torch.tensor([d["box"] for d in record["detections"]], dtype=torch.float32).reshape(-1, 4)
            labels = [f"{d['class_name']} {d['score']:.2f}" for d in record["detections"]]
        else:
            height, width = pixels.shape[1:]
            boxes = torch.tensor([[0, 0, width - 1, height - 1]], dtype=torch.float32)
            top = record["top"][0]
            labels = [f"{top['class_name']} {top['probability']:.2f}"]
        drawn = draw_bounding_boxes(pixels, boxes, labels, width=2) if len(labels) else pixels
        return encode_jpeg(drawn, quality=90).numpy().tobytes()

    def _coco(self, record: dict[str, Any]) -> None:
        from bigbatch.tasks.coco_eval import detections_to_coco

        if self.ids is not None:
            image_id, category_ids = self.ids.image_id(record["file"], record), self.ids.category_ids
        else:
            image_id, category_ids = self.count, list(range(1, len(self.classes) + 1))
        found = record["detections"]
        output = {"boxes": torch.tensor([d["box"] for d in found], dtype=torch.float64).reshape(-1, 4),
                  "scores": torch.tensor([d["score"] for d in found], dtype=torch.float64),
                  "labels": torch.tensor([d["class_id"] for d in found], dtype=torch.int64)}
        self.detections += detections_to_coco([image_id], [output], category_ids)


def _rounded(record: dict[str, Any]) -> dict[str, Any]:
    """A record as ``predictions.jsonl`` holds it: boxes to 3 decimals, scores and probabilities to 6."""
    out = dict(record)
    if "detections" in record:
        out["detections"] = [{**d, "box": [round(v, 3) for v in d["box"]], "score": round(d["score"], 6)}
                             for d in record["detections"]]
    if "top" in record:
        out["top"] = [{**t, "probability": round(t["probability"], 6)} for t in record["top"]]
    return out


def _yolo_lines(record: dict[str, Any]) -> str:
    """``class cx cy w h`` per detection, relative to the image (Darknet's label format)."""
    width, height = record["width"], record["height"]
    lines = []
    for d in record["detections"]:
        x1, y1, x2, y2 = d["box"]
        lines.append(f"{d['class_id']} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} "
                     f"{(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}\n")
    return "".join(lines)


class CocoIds:
    """The image and category ids of a COCO annotation file, for the images predicted (the module docstring)."""

    def __init__(self, path: Path, classes: list[str]) -> None:
        from bigbatch.data.formats.coco import categories_of, read_annotation_file
        from bigbatch.data.formats.coco_ids import category_ids_by_name

        data = read_annotation_file(path, "--annotations")
        self.path = path
        self.category_ids = category_ids_by_name(categories_of(data, path, "--annotations"), classes, path,
                                                 "--annotations")
        self.by_last: dict[str, list[tuple[tuple[str, ...], int]]] = {}
        for k, image in enumerate(data["images"]):
            if not (isinstance(image, dict) and isinstance(image.get("file_name"), str)
                    and isinstance(image.get("id"), int)):
                raise UserError(f"--annotations: {path}: image #{k}: expected an id and a file_name")
            parts = PurePosixPath(image["file_name"]).parts
            if parts:
                self.by_last.setdefault(parts[-1], []).append((parts, image["id"]))

    def image_id(self, file: str | None, record: dict[str, Any]) -> int:
        """The id of the one entry whose ``file_name`` ends ``file``'s path; none or several: a ``UserError``."""
        if file is None or record["frame"] is not None:
            raise UserError("--annotations: ids are matched by file name; a video frame or an image given as "
                            "pixels has none")
        parts = PurePath(os.path.normpath(file)).parts
        hits = [image_id for names, image_id in self.by_last.get(parts[-1], []) if parts[-len(names):] == names]
        if len(hits) != 1:
            what = "no image entry" if not hits else f"{len(hits)} image entries"
            raise UserError(f"--annotations: {self.path} has {what} whose file_name ends {file}")
        return hits[0]
