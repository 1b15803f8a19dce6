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

``--out`` is a new or empty folder, or one an earlier ``predict`` wrote and finished: it holds ``.bigbatch-predict``,
the list of the files it wrote with each one's identity as it was closed (device, inode, size, modification time in
ns, SHA-256), and nothing else. The list itself is recorded as bigbatch's as it is closed (``floor/written.py``), so
that it cannot be forged or edited; a file counts as the earlier predict's only while it is still exactly what that
predict wrote. Those files (and only they) are removed before the new ones are written. Anything else there (a
file of yours, a file predict wrote and you edited since, a list not as a finished predict left it: a predict cut
short, an older bigbatch's) stops ``predict`` before any work, naming it, with nothing removed: bigbatch never
deletes or overwrites a file it did not create. An existing ``--coco`` file is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import torch

from bigbatch.errors import UserError

MARKER = ".bigbatch-predict"
MARKER_HEAD = "bigbatch predict 2: the files it wrote here, one JSON object a line:"
PREDICTIONS = "predictions.jsonl"
LABELS = "labels"
IMAGES = "images"
MAX_LISTED = 2**24
"""The most files a marker may list (an earlier run's record, read before anything is removed)."""
MAX_MARKER = 2**32
"""The most bytes a marker is read to (a line is about 250 bytes: 2^24 files fit)."""
MAX_MARKER_LINE = 16384
"""The longest line of a marker (a name is at most a few hundred bytes, escaped at most 6 bytes a character)."""
_IDENTITY = ("device", "inode", "size", "mtime_ns")


def check_out_dir(out: Path) -> list[tuple[Path, os.stat_result]]:
    """The files an earlier ``predict`` wrote in ``out`` and the marker, each with its ``lstat`` as proven (to remove
    before writing), after checking that ``out`` is new, empty or holds nothing else, each file still exactly what
    that predict wrote (see the module docstring); one ``UserError`` naming the first file that is not otherwise."""
    if not out.exists() and not out.is_symlink():
        if not out.parent.is_dir():
            raise UserError(f"--out: the folder {out.parent} does not exist")
        return []
    if out.is_symlink() or not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a folder")
    present = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir() or p.is_symlink())
    if not present:
        return []
    marker = out / MARKER
    if not marker.exists() and not marker.is_symlink():
        raise UserError(f"--out: {out} holds files bigbatch predict did not write ({out / present[0]}, ...); "
                        "nothing removed: choose a new or empty folder")
    listed = _listed(marker)
    if listed is None:
        raise UserError(f"--out: {marker} is not the list of files a finished bigbatch predict left (edited since, "
                        "copied, a predict cut short, or an older bigbatch's); nothing removed: choose a new or empty "
                        "folder, or empty this one yourself")
    proven = []
    for name in present:
        path = out / name
        st = marker.lstat() if name == MARKER else _unchanged(path, listed.get(name))
        if st is None:
            raise UserError(f"--out: {path} is not a file an earlier bigbatch predict wrote there, unchanged since "
                            "(edited since, or put there by anything else); nothing removed: choose a new or empty "
                            "folder, or move the file away")
        proven.append((path, st))
    return sorted(proven, key=lambda kept: kept[0].name == MARKER)  # the marker last: removed after its files


def _listed(marker: Path) -> dict[str, dict] | None:
    """The files a marker lists, each with its identity, or None when ``marker`` is not one bigbatch predict wrote
    and finished, unchanged since (``written.is_ours``), or is not a regular file of at most :data:`MAX_MARKER`
    bytes, or is not a list."""
    from bigbatch.data.pipeline.files import read_lines
    from bigbatch.floor import written

    if not written.is_ours(marker):
        return None
    listed: dict[str, dict] = {}
    try:
        lines = read_lines(marker, MAX_LISTED + 1, "a predict marker", limit=MAX_MARKER, max_line=MAX_MARKER_LINE)
        if next(lines, (0, None))[1] != MARKER_HEAD:
            return None
        for _, line in lines:
            entry = json.loads(line)
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("sha256"), str)
                    and all(type(entry.get(key)) is int for key in _IDENTITY)):
                return None
            name = entry["name"]
            if name and ".." not in PurePath(name).parts and not PurePath(name).is_absolute():
                listed[name] = entry
    except (OSError, ValueError):
        return None
    return listed


def _unchanged(path: Path, entry: dict | None) -> os.stat_result | None:
    """``path``'s ``lstat`` when it is a regular file whose device, inode, size, modification time and SHA-256 are
    ``entry``'s (what predict wrote there); else None."""
    from bigbatch.floor.written import sha256_of_fd

    if entry is None:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or _identity(st) != {key: entry[key] for key in _IDENTITY}:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if _identity(os.fstat(fd)) != _identity(st):  # replaced between the lstat and the open
            return None
        same = sha256_of_fd(fd, st.st_size) == entry["sha256"] and _identity(os.fstat(fd)) == _identity(st)
        return st if same else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> dict[str, int]:
    return {"device": st.st_dev, "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


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
        """Remove the earlier predict's files (proven its own, unchanged, by :func:`check_out_dir`), start the marker,
        then ``predictions.jsonl``."""
        from bigbatch.floor import written

        for path, proven in self.stale:
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(now.st_mode) or _identity(now) != _identity(proven):
                raise UserError(f"--out: {path} changed since predict started; not removed (choose a new or empty "
                                "folder)")
            path.unlink()  # proven predict's own, unchanged, by check_out_dir
            if path.name == MARKER:
                written.forget(path, proven)  # its record vouches for a file that is gone
        for folder in (self.out / LABELS, self.out / IMAGES):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()  # an empty folder an earlier predict made (it held only listed files)
        self.out.mkdir(exist_ok=True)
        self._marker = open(self.out / MARKER, "xb")  # new: the earlier one was removed above
        self._marker_sha = hashlib.sha256()
        self._marker_line(MARKER_HEAD)
        self._jsonl = open(self.out / PREDICTIONS, "xb")
        self._jsonl_sha = hashlib.sha256()

    def _marker_line(self, line: str) -> None:
        data = (line + "\n").encode()
        self._marker.write(data)
        self._marker.flush()
        self._marker_sha.update(data)

    def _list(self, name: str, st: os.stat_result, sha256: str) -> None:
        """Add ``name`` to the marker with its identity as closed: the proof a later predict may remove it."""
        self._marker_line(json.dumps({"name": name, **_identity(st), "sha256": sha256}))
        self.written.append(name)

    def add(self, record: dict[str, Any], pixels: torch.Tensor | None) -> None:
        """One record; ``pixels`` (uint8 [3, H, W]) are drawn for ``--save-images``."""
        assert self._jsonl is not None
        line = (json.dumps(_rounded(record)) + "\n").encode()
        self._jsonl.write(line)
        self._jsonl_sha.update(line)
        name = self._name(record)
        if self.txt:
            self._write(f"{LABELS}/{name}.txt", _yolo_lines(record).encode())
        if self.save_images and pixels is not None:
            self._write(f"{IMAGES}/{name}.jpg", self._drawn(record, pixels))
        if self.coco is not None:
            self._coco(record)
        self.count += 1

    def close(self, complete: bool = True) -> list[Path]:
        """Finish every file; -> the paths written (``predictions.jsonl``, the folders, the COCO file). Not
        ``complete`` (a predict stopped by Ctrl-C between images): the files written so far are finished and listed,
        so that the next ``predict`` to the folder may replace them; no COCO file."""
        if self._jsonl is not None:
            self._jsonl.flush()
            st = os.fstat(self._jsonl.fileno())
            self._jsonl.close()
            self._list(PREDICTIONS, st, self._jsonl_sha.hexdigest())
            self._close_marker()
        written = [self.out / PREDICTIONS]
        written += [self.out / folder for folder in (LABELS, IMAGES) if (self.out / folder).is_dir()]
        if self.coco is not None and complete:
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

    def _close_marker(self) -> None:
        """Close the marker and record it as bigbatch's (``floor/written.py``): a later predict trusts only a list
        it finds unchanged since."""
        from bigbatch.floor import written

        self._marker.flush()
        os.fsync(self._marker.fileno())
        made = os.fstat(self._marker.fileno())
        self._marker.close()
        path = self.out / MARKER
        try:
            now = os.lstat(path)
        except OSError:
            return
        if _identity(now) == _identity(made):  # still the file made
            written.record(path, now, self._marker_sha.hexdigest())

    def _write(self, name: str, data: bytes) -> None:
        path = self.out / name
        path.parent.mkdir(exist_ok=True)
        with open(path, "xb") as f:  # a new file: what was there was removed in open()
            f.write(data)
            f.flush()
            st = os.fstat(f.fileno())
        self._list(name, st, hashlib.sha256(data).hexdigest())

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
