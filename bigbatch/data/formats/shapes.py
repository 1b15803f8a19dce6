"""The generated ``shapes`` detection set: the demo and test data for detection.

Each image is a textured background (a colour gradient, stripes or blotchy noise, plus pixel noise) with 1-6
flat-coloured shapes of five classes (circle, square, triangle, star, cross) at random positions, sizes,
rotations and colours. Shapes are drawn largest first, so small ones may lie on large ones (some overlap),
but the shapes drawn over a shape never hide more than ``MAX_HIDDEN`` of it. Sizes span COCO's three
area ranges at the default 128 px (small < 32², medium < 96², large above), and image sides vary by up to
an eighth of ``size`` each way, so images are not all square.

The box of a shape is the tight box of its visible pixels, in COCO's ``[x, y, w, h]`` with pixel edges as
coordinates (a shape covering columns 3..7 has ``x = 3, w = 5``); its ``area`` is the count of those
pixels (COCO's area is that of the segmentation mask, not of the box). Category ids are odd (1, 3, 5, 7,
9), as COCO's own ids are not contiguous, so a loader that takes ids for labels is caught.

Everything derives from ``(seed, image index)`` through numpy's Generator; PIL's ImageDraw draws (no
anti-aliasing, so a shape's pixels are exactly its mask) and PIL's JPEG encoder (quality 90) writes, so the
same seed gives the same bytes.

A generated set carries a marker file, ``.bigbatch-shapes.json``, written before anything else. bigbatch
replaces a set (``generate_shapes``) only when the folder holds that marker and nothing but the files the
generator writes; any other existing, non-empty folder is left alone and is an error naming it.

The ``shapes`` detection format of ``registry.DATASETS``: the set at ``data.path`` (default ``data/shapes``),
generated there first (``data.shapes_images`` images, the run's seed) when it is not there.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

from bigbatch.config.data_keys import DATASET_KEYS
from bigbatch.data.formats.coco import images_in_annotations
from bigbatch.data.pipeline.files import read_regular
from bigbatch.errors import UserError
from bigbatch.floor.processes import process_exists
from bigbatch.registry import DATASETS

if TYPE_CHECKING:
    from bigbatch.config import DataConfig, RunConfig
    from bigbatch.data.formats.detection import DetectionRecord
    from bigbatch.data.pipeline.problems import DataIssues

CLASSES = ("circle", "square", "triangle", "star", "cross")
CATEGORY_IDS = (1, 3, 5, 7, 9)
JPEG_QUALITY = 90
MAX_SHAPES = 6
MAX_HIDDEN = 0.4
"""The largest fraction of a shape's pixels the shapes drawn after it may cover, together."""
MIN_PIXELS = 20
"""The fewest visible pixels a shape keeps (a smaller remnant is not an object)."""
MIN_CONTRAST = 100.0
"""Least Euclidean RGB distance between a shape's colour and the mean colour it is drawn over."""

# Outlines in unit coordinates: each shape fits the square [-0.5, 0.5]² before rotation and scaling.
_STAR = [(0.5 * (1.0 if i % 2 == 0 else 0.4) * math.sin(i * math.pi / 5),
          -0.5 * (1.0 if i % 2 == 0 else 0.4) * math.cos(i * math.pi / 5)) for i in range(10)]
_CROSS = [(-1 / 6, -0.5), (1 / 6, -0.5), (1 / 6, -1 / 6), (0.5, -1 / 6), (0.5, 1 / 6), (1 / 6, 1 / 6),
          (1 / 6, 0.5), (-1 / 6, 0.5), (-1 / 6, 1 / 6), (-0.5, 1 / 6), (-0.5, -1 / 6), (-1 / 6, -1 / 6)]
_OUTLINES = {
    "square": [(-0.5, -0.5), (0.5, -0.5), (0.5, 0.5), (-0.5, 0.5)],
    "triangle": [(0.0, -0.5), (0.5, 0.5), (-0.5, 0.5)],
    "star": _STAR,
    "cross": _CROSS,
}


@dataclass(frozen=True)
class Shape:
    """One shape: its class, centre (pixels), nominal size (the side of the square it fits before rotation,
    pixels), rotation (radians) and RGB colour."""

    kind: str
    cx: float
    cy: float
    size: float
    angle: float
    colour: tuple[int, int, int]


def shape_mask(shape: Shape, height: int, width: int) -> np.ndarray:
    """The shape's pixels on a ``height x width`` canvas (bool), clipped by the canvas."""
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    r = shape.size / 2
    if shape.kind == "circle":
        draw.ellipse([shape.cx - r, shape.cy - r, shape.cx + r, shape.cy + r], fill=1)
    else:
        c, s = math.cos(shape.angle), math.sin(shape.angle)
        points = [(shape.cx + shape.size * (x * c - y * s), shape.cy + shape.size * (x * s + y * c))
                  for x, y in _OUTLINES[shape.kind]]
        draw.polygon(points, fill=1)
    return np.asarray(canvas, dtype=bool)


def tight_box(mask: np.ndarray) -> list[float]:
    """COCO ``[x, y, w, h]`` of the pixels set in ``mask``, pixel edges as coordinates."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    x0, y0, x1, y1 = cols[0], rows[0], cols[-1] + 1, rows[-1] + 1
    return [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]


def background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A float32 ``[H, W, 3]`` texture in 0..255: a gradient, stripes or blotches between two colours,
    plus Gaussian pixel noise."""
    c0 = rng.uniform(0, 255, 3)
    c1 = np.clip(c0 + rng.normal(0, 70, 3), 0, 255)
    kind = rng.integers(3)
    if kind == 2:  # blotches: coarse uniform noise, bilinearly upsampled
        coarse = rng.random((height // 12 + 2, width // 12 + 2)).astype(np.float32)
        t = np.asarray(Image.fromarray(coarse, mode="F").resize((width, height), Image.BILINEAR))
    else:
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        theta = rng.uniform(0, 2 * math.pi)
        along = xx * math.cos(theta) + yy * math.sin(theta)
        if kind == 0:  # linear gradient across the image
            t = (along - along.min()) / max(float(along.max() - along.min()), 1.0)
        else:  # sinusoidal stripes
            t = 0.5 + 0.5 * np.sin(along * (2 * math.pi / rng.uniform(6, 24)))
    image = c0 + t[..., None] * (c1 - c0)
    image += rng.normal(0, rng.uniform(2, 10), image.shape)
    return image.astype(np.float32)


def _sizes(rng: np.random.Generator, count: int, short_side: int) -> list[float]:
    """Nominal sizes, largest first: 10 % large (0.8-1.1 of the short side), 45 % medium, 45 % small."""
    scale = short_side / 128
    sizes = []
    for _ in range(count):
        u = rng.random()
        if u < 0.1:
            sizes.append(rng.uniform(0.8, 1.1) * short_side)
        elif u < 0.55:
            sizes.append(math.exp(rng.uniform(math.log(28), math.log(80))) * scale)
        else:
            sizes.append(math.exp(rng.uniform(math.log(10), math.log(26))) * scale)
    return sorted(sizes, reverse=True)


def render_sample(seed: int, index: int, size: int = 128) -> tuple[np.ndarray, list[dict]]:
    """Image ``index`` of the set of ``seed``: uint8 ``[H, W, 3]`` pixels (before JPEG) and its objects
    (``label``, ``bbox`` as COCO ``[x, y, w, h]``, ``area``, the drawn ``shape``), in drawing order."""
    rng = np.random.default_rng([seed, index])
    jitter = size // 8
    height, width = (int(size + rng.integers(-jitter, jitter + 1)) for _ in range(2))
    image = background(rng, height, width)
    owner = np.zeros((height, width), dtype=np.int16)  # 1 + index of the shape that shows at each pixel
    shapes: list[Shape] = []
    drawn: list[int] = []  # each accepted shape's pixel count when it was drawn
    shown: list[int] = []  # ... and how many of them still show
    for nominal in _sizes(rng, int(rng.integers(1, MAX_SHAPES + 1)), min(height, width)):
        for _ in range(10):  # placement attempts; the shape is dropped if none fits
            kind = CLASSES[int(rng.integers(len(CLASSES)))]
            margin = min(nominal / 2, min(height, width) / 2)  # large shapes may be cut by the border
            cx, cy = rng.uniform(margin, width - margin), rng.uniform(margin, height - margin)
            shape = Shape(kind, float(cx), float(cy), float(nominal), float(rng.uniform(0, 2 * math.pi)), (0, 0, 0))
            mask = shape_mask(shape, height, width)
            count = int(mask.sum())
            if count < MIN_PIXELS:
                continue
            covered = np.bincount(owner[mask], minlength=len(shapes) + 1)[1:]
            if any(shown[k] - covered[k] < max((1 - MAX_HIDDEN) * drawn[k], MIN_PIXELS) for k in range(len(shapes))):
                continue
            under = image[mask].mean(axis=0)
            colour = rng.integers(0, 256, 3)
            for _ in range(20):
                if np.linalg.norm(colour - under) >= MIN_CONTRAST:
                    break
                colour = rng.integers(0, 256, 3)
            shape = replace(shape, colour=tuple(int(c) for c in colour))
            image[mask] = colour
            owner[mask] = len(shapes) + 1
            shown = [n - c for n, c in zip(shown, covered.tolist(), strict=True)] + [count]
            shapes.append(shape)
            drawn.append(count)
            break
    pixels_u8 = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    objects = []
    for k, shape in enumerate(shapes):
        visible = owner == k + 1
        objects.append({"label": CLASSES.index(shape.kind), "bbox": tight_box(visible),
                        "area": float(visible.sum()), "shape": shape})
    return pixels_u8, objects


def _coco(split_images: list[dict], annotations: list[dict]) -> dict:
    return {
        "info": {"description": "bigbatch generated shapes detection set"},
        "licenses": [],
        "images": split_images,
        "annotations": annotations,
        "categories": [{"id": cid, "name": name, "supercategory": "shape"}
                       for cid, name in zip(CATEGORY_IDS, CLASSES, strict=True)],
    }


def split_sizes(images: int, val_fraction: float = 0.2) -> tuple[int, int]:
    """(train, val) image counts: the last ``round(images * val_fraction)`` images, at least one when there are
    two or more, are the validation set."""
    val_count = round(images * val_fraction)
    if images >= 2 and val_fraction > 0:
        val_count = min(max(val_count, 1), images - 1)
    return images - val_count, val_count


def yolo_line(label: int, bbox: list[float], width: int, height: int) -> str:
    """A Darknet label line ``<class> <xc> <yc> <w> <h>`` for a COCO ``[x, y, w, h]`` box in pixels, normalised
    by the image's size, six decimals as Darknet's ``voc_label.py`` writes them."""
    x, y, w, h = bbox
    return f"{label} {(x + w / 2) / width:.6f} {(y + h / 2) / height:.6f} {w / width:.6f} {h / height:.6f}"


def write_shapes(out_dir: Path, images: int, seed: int = 0, size: int = 128, val_fraction: float = 0.2,
                 yolo: bool = False) -> dict:
    """Write ``images`` generated images: ``out_dir/train/*.jpg``, ``out_dir/val/*.jpg`` and the COCO files
    ``out_dir/annotations/train.json`` and ``val.json``. Image ``i`` has COCO id ``i + 1`` and file
    ``{i:06d}.jpg``; the last ``round(images * val_fraction)`` images (at least one, when there are two or
    more) are the validation set. Returns the image and box counts of each split.

    With ``yolo`` the Darknet/YOLO layout is written as well: a label file beside each image
    (``train/{i:06d}.txt``, Darknet's rule for a path without an ``images`` folder; empty for an image without
    shapes), the image lists ``train.txt`` and ``val.txt`` (paths relative to the set's folder), ``shapes.names``
    and ``shapes.data`` (``classes``, ``train``, ``valid``, ``names``): ``data.name: yolo`` with
    ``data.path: DIR/shapes.data`` reads it, as Darknet does."""
    if images < 1:
        raise UserError(f"--images: expected a positive number of images, got {images}")
    if size < 32:
        raise UserError(f"size: expected at least 32 pixels, got {size}")
    if not 0 <= val_fraction < 1:
        raise UserError(f"val_fraction: expected a fraction in [0, 1), got {val_fraction}")
    train_count, _ = split_sizes(images, val_fraction)
    splits = {"train": range(train_count), "val": range(train_count, images)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise UserError(f"--out: {out_dir} is not empty; the shapes set is written into a new or empty folder only")
    marker = {"written_by": MARKER_SIGNATURE, "images": images, "seed": seed, "size": size,
              "val_fraction": val_fraction, "yolo": yolo}
    (out_dir / MARKER).write_text(json.dumps(marker) + "\n")
    (out_dir / "annotations").mkdir()
    counts: dict = {"classes": list(CLASSES)}
    for split, indices in splits.items():
        (out_dir / split).mkdir(parents=True, exist_ok=True)
        entries, annotations = [], []
        for index in indices:
            pixels, objects = render_sample(seed, index, size)
            name = f"{index:06d}.jpg"
            Image.fromarray(pixels).save(out_dir / split / name, quality=JPEG_QUALITY)
            height, width = pixels.shape[:2]
            entries.append({"id": index + 1, "file_name": name, "width": width, "height": height})
            for obj in objects:
                annotations.append({"id": len(annotations) + 1, "image_id": index + 1,
                                    "category_id": CATEGORY_IDS[obj["label"]], "bbox": obj["bbox"],
                                    "area": obj["area"], "iscrowd": 0})
            if yolo:
                lines = [yolo_line(obj["label"], obj["bbox"], width, height) + "\n" for obj in objects]
                (out_dir / split / f"{index:06d}.txt").write_text("".join(lines))
        if yolo:
            (out_dir / f"{split}.txt").write_text("".join(f"{split}/{e['file_name']}\n" for e in entries))
        final = out_dir / "annotations" / f"{split}.json"  # val.json, written last, marks the set complete
        partial = final.with_name(f".{final.name}.tmp")
        partial.write_text(json.dumps(_coco(entries, annotations)))
        os.replace(partial, final)
        counts[f"{split}_images"], counts[f"{split}_boxes"] = len(entries), len(annotations)
    if yolo:
        (out_dir / "shapes.names").write_text("".join(f"{name}\n" for name in CLASSES))
        (out_dir / "shapes.data").write_text(f"classes={len(CLASSES)}\ntrain=train.txt\nvalid=val.txt\n"
                                             f"names=shapes.names\n")
    return counts


MARKER = ".bigbatch-shapes.json"
"""The file that marks a folder as a shapes set bigbatch wrote (JSON: ``written_by`` and the generator's
arguments)."""
MARKER_SIGNATURE = "bigbatch shapes generator"
_GENERATED = re.compile(r"^(?:(?:train|val)/\d{6,}\.(?:jpg|txt)|annotations/\.?(?:train|val)\.json(?:\.tmp)?"
                        r"|(?:train|val)\.txt|shapes\.(?:names|data))$")
"""Paths (relative to the set's folder) of the files ``write_shapes`` writes, besides the marker."""
_GENERATED_DIRS = ("train", "val", "annotations")


MARKER_LIMIT = 2**16
"""The largest marker file read (bytes; the generator writes about 130)."""


def read_marker(root: Path) -> dict | None:
    """The marker of a set bigbatch generated at ``root`` (a regular file, no link, read within ``MARKER_LIMIT``
    bytes, signed by the generator), or None."""
    marker_path = root / MARKER
    try:
        if marker_path.is_symlink():
            return None
        marker = json.loads(read_regular(marker_path, MARKER_LIMIT, "a marker").decode("utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("written_by") == MARKER_SIGNATURE else None


def is_generated_set(root: Path) -> bool:
    """Whether ``root`` carries the marker of a set bigbatch generated (:func:`read_marker`)."""
    return read_marker(root) is not None


def own_annotation_file(root: Path, split: str = "val") -> Path | None:
    """The COCO file ``write_shapes`` wrote for ``split`` in the set at ``root`` (``annotations/<split>.json``), when
    ``root`` carries the marker of a set bigbatch generated and that file is there as written: a regular file inside
    ``root``, with no link on the way from ``root``. None otherwise."""
    if not is_generated_set(root):
        return None
    folder = root / "annotations"
    path = folder / f"{split}.json"
    if folder.is_symlink() or path.is_symlink() or not path.is_file():
        return None
    return path


def foreign_entry(root: Path) -> str | None:
    """The first entry under ``root`` that ``write_shapes`` did not write (the folder itself, when it lacks the
    marker), or None when every entry is the generator's own."""
    if not is_generated_set(root):
        return str(root)
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        own_dir = relative in _GENERATED_DIRS and path.is_dir() and not path.is_symlink()
        own_file = (relative == MARKER or _GENERATED.match(relative)) and path.is_file() and not path.is_symlink()
        if not (own_dir or own_file):
            return str(path)
    return None


def remove_generated_set(root: Path, key: str, keep_folder: bool = False) -> None:
    """Delete a set that bigbatch generated, file by file, after proving that every entry is the generator's;
    anything else in the folder stops it before anything is deleted (``UserError`` naming ``key``). With
    ``keep_folder`` the (then empty) folder itself stays."""
    foreign = foreign_entry(root)
    if foreign is not None:
        raise UserError(f"{key}: {root} is not a shapes set bigbatch generated, or holds other files too "
                        f"({foreign}); bigbatch deletes nothing it did not write: choose an empty or new folder")
    for path in sorted(root.rglob("*"), reverse=True):  # files before the folders holding them
        path.rmdir() if path.is_dir() else path.unlink()
    if not keep_folder:
        root.rmdir()


def shapes_target(root: Path, key: str = "--out") -> Path:
    """Where a shapes set for ``root`` is written, checked before any work: the folder itself when ``root`` is a
    link to one (data kept on another disk), as an absolute path (``.`` and ``sub/..`` have a name); it must be
    absent, an empty folder or a set bigbatch generated. Anything else is a ``UserError`` naming ``key``."""
    root = Path(os.path.abspath(root))
    if root.is_symlink():
        root = root.resolve()
    if root.exists() and not root.is_dir():
        raise UserError(f"{key}: {root} is a file, not a folder")
    blocking = next((p for p in root.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"{key}: cannot make {root}: {blocking} is a file, not a folder")
    if root.is_dir() and any(root.iterdir()):
        foreign = foreign_entry(root)
        if foreign is not None:
            other = f"; {OTHER_FORMATS}" if key == "data.path" else ""
            why = f"no {MARKER} in it" if foreign == str(root) else f"{foreign} is not one of its files"
            raise UserError(f"{key}: {root} exists and is not a shapes set bigbatch generated ({why}); bigbatch never "
                            f"overwrites what it did not write: choose an empty or new folder{other}")
    return root


def generate_shapes(root: Path, images: int, seed: int = 0, key: str = "--out", yolo: bool = False) -> dict:
    """Write the shapes set at ``root`` (checked by :func:`shapes_target`).

    An absent ``root`` is written as a sibling ``<root>.partial-<pid>`` folder, then renamed, so that an
    interrupted generation is never taken for a set. An existing folder (an empty one of the user's, with its own
    owner and mode, or a set bigbatch generated, whose files are removed first) is written in place; a set counts
    as complete once ``annotations/val.json``, the last file written, is there, so an interrupted generation is
    regenerated. Partial folders of generations whose process is gone are removed first (they carry the marker).
    A place that cannot be written is a ``UserError`` naming ``key``."""
    root = shapes_target(root, key)
    try:
        remove_stale_partials(root)
        if root.is_dir():
            if any(root.iterdir()):
                remove_generated_set(root, key, keep_folder=True)
            return write_shapes(root, images, seed, yolo=yolo)
        partial = root.with_name(f"{root.name}.partial-{os.getpid()}")
        try:
            counts = write_shapes(partial, images, seed, yolo=yolo)
        except BaseException:
            if partial.is_dir() and foreign_entry(partial) is None:
                remove_generated_set(partial, key)  # ours, just made: nothing half-written is left behind
            raise
        partial.rename(root)
        return counts
    except OSError as e:
        raise UserError(f"{key}: cannot write the shapes set at {root}: {e.strerror or e}") from None


def remove_stale_partials(root: Path) -> None:
    """Remove ``<root>.partial-<pid>`` folders left by a generation that was killed: its process is gone and the
    folder holds the marker and generated files only."""
    if not root.parent.is_dir():
        return
    for partial in root.parent.glob(f"{glob.escape(root.name)}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_exists(int(pid)) and partial.is_dir() and foreign_entry(partial) is None:
            remove_generated_set(partial, "data.path")


# ----------------------------------------------------------------------------- the ``shapes`` dataset format

DEFAULT_PATH = "data/shapes"


def ensure_shapes(root: Path, images: int, seed: int, rank: int = 0) -> Path:
    """The generated shapes set at ``root``, written first (by rank 0; the other ranks wait) when it is not there.
    A folder that is neither empty nor a set bigbatch generated is never touched: it is an error naming it."""
    import torch.distributed as dist

    complete = (root / "annotations" / "val.json").is_file()
    if not complete and rank == 0:
        target = shapes_target(root, "data.path")
        print(f"generating the shapes set ({images} images) in {target}", flush=True)
        generate_shapes(target, images, seed, key="data.path")
    elif rank == 0:
        generated = (read_marker(root) or {}).get("images")
        if isinstance(generated, int) and not isinstance(generated, bool) and generated != images:
            print(f"note: {root} holds a shapes set generated earlier, of {generated} images; data.shapes_images "
                  f"({images}) is the size of a set generated where there is none: to train on {images}, remove "
                  f"that folder (bigbatch wrote it) or set another data.path", flush=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return root


def load(cfg: RunConfig, issues: DataIssues, rank: int = 0
         ) -> tuple[list[DetectionRecord], list[DetectionRecord], list[str]]:
    from bigbatch.data.formats.coco import load_coco_splits

    root = ensure_shapes(Path(cfg.data.path or DEFAULT_PATH), cfg.data.shapes_images, cfg.seed, rank)
    splits = [(root / split, root / "annotations" / f"{split}.json") for split in ("train", "val")]
    return load_coco_splits(splits, cfg.data.classes, issues)


def train_images(cfg: RunConfig) -> int:
    """From the set's training annotations, or for a set not generated yet from ``data.shapes_images``."""
    path = Path(cfg.data.path or DEFAULT_PATH) / "annotations" / "train.json"
    try:
        there = path.is_file()
    except OSError:  # a name no system can open (too long): no set there yet
        there = False
    if not there:
        return split_sizes(cfg.data.shapes_images)[0]
    return images_in_annotations(path, cfg.data, "data.path")


OTHER_FORMATS = ("a Darknet .data file or a YOLO folder is read with --set data.name=yolo, a COCO set with "
                 "data.name=coco")
"""What a ``data.path`` that is not a shapes set is likely meant to be (the shapes set is the detection default)."""


def _path_usable(data: DataConfig) -> None:
    """Before any work: ``data.path`` is a folder to hold the generated set (or holds it), not a file (a Darknet
    ``.data`` file given without ``data.name=yolo``) nor another folder, and the message says which format it is."""
    if data.path is None:
        return
    root = Path(data.path)
    if root.exists() and not root.is_dir():
        raise UserError(f"data.path: {root} is a file, not the folder of a shapes set (data.name: shapes, the "
                        f"default); {OTHER_FORMATS}")
    if not (root / "annotations" / "val.json").is_file():
        shapes_target(root, "data.path")  # a folder the set can be generated in


DATASETS.register("shapes", load, task="detection", count=train_images, given=_path_usable,
                  fields=DATASET_KEYS["shapes"])
