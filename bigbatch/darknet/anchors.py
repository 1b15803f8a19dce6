"""``bigbatch data anchors``: Darknet's ``detector calc_anchors`` (AlexeyAB's src/detector.c, ``calc_anchors``), and a
``.cfg`` written with the anchors it finds.

Darknet's algorithm, followed step by step (in float32, as Darknet computes):

- the boxes: every box of the training images (``train=`` of the ``.data`` file), its relative width and height
  scaled to the network's input, ``w * width`` and ``h * height``;
- k-means (src/matrix.c, ``do_kmeans``) with the distance ``1 - IoU`` of two boxes put on one centre: the first
  centres are ``K`` of the boxes drawn by ``sample`` (a Fisher-Yates shuffle of the box indices with ``rand()``);
  each step gives every box its nearest centre (the first, on a tie), then moves each centre to the mean width and
  height of its boxes (a centre without boxes stays); it stops when no box changes centre, or after 1,000 moves;
- the centres sorted by area, smallest first (``anchors_data_comparator``);
- the average IoU: each box's IoU with its nearest anchor, averaged over the boxes, in percent.

Darknet draws with glibc's ``rand()`` after ``srand(time(0))``: each run differs. Here ``--seed S`` seeds the same
generator (glibc's ``random_r``, TYPE_3: an additive feedback generator of 31 words, its first 310 outputs
discarded), so that ``--seed S`` draws the centres Darknet draws when started at Unix time ``S`` (glibc takes a seed
of 0 as 1): the same iterations, anchors and average IoU (checked against Darknet's binary by
``benchmarks/anchors_vs_darknet.py``).

One run stops in one local minimum of several, and Darknet's runs differ by a point or more of average IoU
(docs/benchmarks.md). ``--tries N`` (default 5) runs it with the seeds ``S`` to ``S + N - 1``, as Darknet started in
``N`` consecutive seconds, and keeps the run of the highest average IoU; ``--tries 1`` is one Darknet run.

What bigbatch does differently: the boxes are read as training reads them (``darknet/yolo_data.py``,
``data/formats/coco.py``): a box overshooting its image is clipped to it, a malformed one is skipped with a warning,
and an image that cannot be read is skipped with its boxes; Darknet reads the label files only, as they are. A COCO
JSON file's boxes are its annotations (crowd regions left out); the images are not opened.

``--cfg IN.cfg --out OUT.cfg`` writes IN.cfg with the anchors: each ``[yolo]`` gets all of them (``anchors=``,
``num=K``) and its part (``mask=``), and the convolution before it ``filters = len(mask) * (classes + 5)``; every
other line as written (``cfg_edit.py``). The rule for the masks: the ``K`` anchors (sorted by area) are cut into
``H`` equal parts for the ``H`` heads, the largest to the coarsest head (the largest stride), the next to the next,
so that yolov3.cfg's heads get ``6,7,8``, ``3,4,5`` and ``0,1,2`` as Darknet's own cfgs have them.
(Darknet's yolov4-tiny.cfg gives its two heads ``3,4,5`` and ``1,2,3``, anchor 0 unused and anchor 3 twice; here
they get ``3,4,5`` and ``0,1,2``.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bigbatch.errors import UserError, named_as

if TYPE_CHECKING:
    from bigbatch.darknet.spec import DarknetCfg

MAX_ITERATIONS = 1000
"""Darknet's ``do_kmeans``: at most this many moves of the centres."""
DEFAULT_TRIES = 5
"""``--tries``: runs of the k-means (seeds ``S`` to ``S + 4``), the best kept. One run of Darknet's stops in one local
minimum of several; the best of a few is as good as Darknet's typical run or better (docs/benchmarks.md)."""
MAX_ANCHORS = 256
"""The most anchors ``--num`` fits: far past any detector's (9 in YOLOv3 and v4, 12 in yolov4-tiny-3l), and a bound
on the k-means' table of boxes x anchors (a number of anchors near the boxes' asked numpy for tens of GiB)."""
MAX_TRIES = 1000
SMALL_INPUT = 32
"""Darknet prints the anchors as whole pixels for a network wider than this, else with 4 decimals."""


# ----------------------------------------------------------------------------- glibc's rand()


class GlibcRand:
    """glibc's ``srand(seed)`` and ``rand()`` (``random_r`` of TYPE_3, the default state of 128 bytes): the state is
    31 words, ``r[0] = seed`` (0 taken as 1), ``r[i] = 16807 * r[i - 1] mod (2^31 - 1)`` for i < 31, then
    ``r[i] = r[i - 31] + r[i - 3] (mod 2^32)``; the first 310 sums are discarded and ``rand()`` is each next sum
    shifted right by one bit."""

    def __init__(self, seed: int):
        seed &= 0xFFFFFFFF
        seed = seed or 1
        state = [seed if seed < 2**31 else seed - 2**32]  # int32_t state[0] = seed
        word = seed
        for _ in range(1, 31):
            hi, lo = divmod(word, 127773)
            word = 16807 * lo - 2836 * hi
            if word < 0:
                word += 2147483647
            state.append(word)
        self._r = [s & 0xFFFFFFFF for s in state]
        self._r += self._r[:3]  # r[31..33] = r[0..2]
        for _ in range(310):
            self._next()

    def _next(self) -> int:
        r = self._r
        value = (r[-31] + r[-3]) & 0xFFFFFFFF
        r.append(value)
        if len(r) > 4096:
            del r[:-31]
        return value

    def rand(self) -> int:
        return self._next() >> 1


def sample(n: int, rng: GlibcRand) -> list[int]:
    """Darknet's ``sample(n)`` (src/matrix.c): the indices 0..n-1 shuffled by Fisher-Yates with ``rand()``."""
    s = list(range(n))
    for i in range(n - 1, -1, -1):
        index = rng.rand() % (i + 1)
        s[i], s[index] = s[index], s[i]
    return s


# ----------------------------------------------------------------------------- Darknet's k-means


def _distances(boxes: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(1 - IoU, IoU)`` [N, K] of each box with each centre, both (w, h) at one corner, in float32 as Darknet's
    ``dist`` computes them."""
    x, y = boxes[:, None, :], centers[None, :, :]
    inter = np.minimum(x[..., 0], y[..., 0]) * np.minimum(x[..., 1], y[..., 1])
    union = (x[..., 0] * x[..., 1] + y[..., 0] * y[..., 1]) - inter
    iou = inter / union
    return np.float32(1) - iou, iou


def _closest(boxes: np.ndarray, centers: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Each box's nearest centre (the first of equal distances), as ``closest_center``."""
    out = np.empty(len(boxes), np.int64)
    for start in range(0, len(boxes), chunk):
        out[start:start + chunk] = _distances(boxes[start:start + chunk], centers)[0].argmin(axis=1)
    return out


def _move(boxes: np.ndarray, assignments: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """``kmeans_maximization``: each centre the mean of its boxes (summed in box order, in float32); a coordinate
    that comes out 0 (a centre without boxes) keeps its old value."""
    sums = np.zeros_like(centers)
    np.add.at(sums, assignments, boxes)
    counts = np.bincount(assignments, minlength=len(centers)).astype(np.float32)
    moved = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], sums).astype(np.float32)
    return np.where(moved == 0, centers, moved)


def kmeans(boxes: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, int]:
    """``(centres float32 [k, 2], moves)``: Darknet's ``do_kmeans`` on ``boxes`` (float32 [N, 2], N >= k) with
    ``random_centers`` drawn by glibc's ``rand()`` after ``srand(seed)``."""
    boxes = np.asarray(boxes, np.float32)
    chosen = sample(len(boxes), GlibcRand(seed))[:k]
    centers = boxes[chosen].copy()
    assignments = np.zeros(len(boxes), np.int64)  # xcalloc: every box starts at centre 0
    if k == 1:
        centers = _move(boxes, assignments, centers)
    moves = 0
    while moves < MAX_ITERATIONS:
        closest = _closest(boxes, centers)
        converged = bool(np.array_equal(closest, assignments))
        assignments = closest
        if converged:
            break
        centers = _move(boxes, assignments, centers)
        moves += 1
    return centers, moves


def sort_by_area(anchors: np.ndarray) -> np.ndarray:
    """``anchors_data_comparator``: smallest area (w * h in float32) first."""
    area = anchors[:, 0] * anchors[:, 1]
    return anchors[np.argsort(area, kind="stable")]


def average_iou(boxes: np.ndarray, anchors: np.ndarray) -> float:
    """Darknet's ``avg IoU``: the IoU of each box with its nearest anchor (by ``1 - IoU``, the first on a tie),
    summed in box order in float32, times 100, over the number of boxes."""
    total = np.float32(0)
    for start in range(0, len(boxes), 1 << 16):
        distance, iou = _distances(boxes[start:start + (1 << 16)], anchors)
        best = np.take_along_axis(iou, distance.argmin(axis=1)[:, None], axis=1)[:, 0]
        best = best[(best >= 0) & (best <= 1)]  # Darknet leaves out a "Wrong label" (none here: sizes are positive)
        total = np.cumsum(np.concatenate([[total], best]), dtype=np.float32)[-1]
    return float(np.float32(100) * total / np.float32(len(boxes)))


@dataclass(frozen=True)
class Anchors:
    """What ``calc_anchors`` finds: the anchors (float32 [K, 2], smallest area first, input pixels), the average
    IoU in percent, the k-means moves, the seed of the run they come from, each try's average IoU (in seed order),
    and the boxes they were fitted to (float32 [N, 2] at the input size)."""

    anchors: np.ndarray
    avg_iou: float
    moves: int
    seed: int
    tries: tuple[float, ...]
    boxes: np.ndarray
    width: int
    height: int

    def anchor_texts(self) -> list[str]:
        """Each anchor as Darknet prints it: ``%3.0f,%3.0f`` for a network wider than 32 pixels, else
        ``%2.4f,%2.4f``."""
        form = "%3.0f,%3.0f" if self.width > SMALL_INPUT else "%2.4f,%2.4f"
        return [form % (float(w), float(h)) for w, h in self.anchors]

    def lines(self) -> list[str]:
        """Darknet's two lines: ``avg IoU = 81.23 %`` and ``anchors =  13, 12,  20, 19, ...``."""
        return [f"avg IoU = {self.avg_iou:2.2f} %", "anchors = " + ", ".join(self.anchor_texts())]


def fit_anchors(relative: np.ndarray, k: int, width: int, height: int, seed: int, tries: int = 1) -> Anchors:
    """``calc_anchors`` on boxes of ``relative`` (width, height) sizes (fractions of their images): scaled to the
    ``width`` x ``height`` input, clustered into ``k`` anchors, sorted, and their average IoU; run ``tries`` times,
    with the seeds ``seed``, ``seed + 1``, ... (Darknet's runs started in that many consecutive seconds), the run of
    the highest average IoU kept (the first of equal ones)."""
    relative = np.asarray(relative, np.float32).reshape(-1, 2)
    boxes = relative * np.array([width, height], np.float32)
    if not 1 <= k <= len(boxes):
        raise UserError(f"--num: {k} anchors from {len(boxes)} boxes; k-means needs at least as many boxes as "
                        "anchors, and 1 anchor or more")
    best, ious = None, []
    for t in range(tries):
        centers, moves = kmeans(boxes, k, (seed + t) & 0xFFFFFFFF)
        anchors = sort_by_area(centers)
        ious.append(average_iou(boxes, anchors))
        if best is None or ious[-1] > best[1]:
            best = (anchors, ious[-1], moves, (seed + t) & 0xFFFFFFFF)
    assert best is not None
    return Anchors(*best, tuple(ious), boxes, width, height)


# ----------------------------------------------------------------------------- the boxes of a dataset


def _relative(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.stack([(boxes[:, 2] - boxes[:, 0]) / width, (boxes[:, 3] - boxes[:, 1]) / height], axis=1)


def read_box_sizes(source: Path) -> tuple[np.ndarray, int, str]:
    """``(relative (w, h) float32 [N, 2], images with boxes, what was read)`` of the training boxes of ``source``:
    a COCO annotation file (``*.json``), a Darknet ``.data`` file (its ``train=`` list) or a YOLO folder (its
    ``train/`` split, as ``bigbatch data shapes --format yolo`` writes it, or a folder of images and labels)."""
    from bigbatch.darknet.yolo_data import load_yolo, yolo_splits
    from bigbatch.data.pipeline.problems import DataIssues

    if not source.exists():
        raise UserError(f"DATA: {source} not found; expected a COCO JSON file, a Darknet .data file or a YOLO folder")
    issues = DataIssues()
    # held: a set without a usable box is one error, not a warning for each problem first; the readers shared with
    # training name the set data:, here it is the command's DATA
    with named_as("DATA", instead_of="data"), issues.held():
        if source.is_file() and source.suffix.lower() == ".json":
            from bigbatch.data.formats.coco import (
                annotated_images,
                categories_of,
                class_mapping,
                read_annotation_file,
            )

            data = read_annotation_file(source, key="DATA")
            categories = categories_of(data, source, key="DATA")
            _, label_of = class_mapping(categories, None, source)
            images = annotated_images(data, source.parent, source, categories, label_of, issues)
            sizes = [_relative(np.array(image.boxes), image.width, image.height) for image in images.values()]
            what = f"{source}"
        else:
            split = "train"
            if source.is_dir():
                try:
                    source, _, split, _ = yolo_splits(source)
                except UserError:
                    pass  # a folder of one split: its images and labels
            records, _ = load_yolo(source, issues, keep_empty=False, split=split)
            sizes = [_relative(r.boxes, r.width, r.height) for r in records]
            what = f"{source} (train)" if source.is_file() else f"{source}"
        sizes = [s for s in sizes if len(s)]
        if not sizes:
            raise UserError(f"DATA: {what} holds no boxes{issues.first()}; anchors are fitted to a set's boxes")
    return np.concatenate(sizes).astype(np.float32), len(sizes), what


# ----------------------------------------------------------------------------- the .cfg


def parse_size(text: str) -> tuple[int, int]:
    """``--size``: ``WxH`` or ``S`` (square), in pixels."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text)
    if match is None:
        raise UserError(f"--size: expected WIDTHxHEIGHT in pixels (e.g. 416x416) or one side, got {text!r}")
    width, height = int(match[1]), int(match[2] or match[1])
    if not (1 <= width <= 65536 and 1 <= height <= 65536):
        raise UserError(f"--size: expected sides of 1 to 65536 pixels, got {width}x{height}")
    return width, height


def head_masks(strides: list[float], k: int) -> list[tuple[int, ...]]:
    """The mask of each head (in cfg order), given its stride: ``k`` anchors (smallest first) in equal parts, the
    largest part to the head of the largest stride (the coarsest), and so on; heads of equal stride in cfg order."""
    heads = len(strides)
    per = k // heads
    order = sorted(range(heads), key=lambda h: (-strides[h], h))  # coarsest first
    masks: list[tuple[int, ...]] = [()] * heads
    for rank, head in enumerate(order):
        first = k - (rank + 1) * per
        masks[head] = tuple(range(first, first + per))
    return masks


def plan_heads(path: Path, k: int, width: int, height: int) -> tuple[DarknetCfg, list[tuple[int, ...]]]:
    """``(the network of the .cfg at path, the mask of each [yolo] head)`` for ``k`` anchors (:func:`head_masks`;
    the strides at the cfg's [net] size, else ``width`` x ``height``), checked before any work: the cfg has heads,
    they can share ``k`` anchors equally, and each follows a ``[convolutional]`` whose filters can follow its mask."""
    from bigbatch.darknet.cfg import read_darknet_cfg
    from bigbatch.darknet.layers import Convolutional
    from bigbatch.darknet.shapes import layer_shapes

    network = read_darknet_cfg(path, key="--cfg")
    heads = network.yolo_layers
    if not heads:
        raise UserError(f"--cfg: {path} has no [yolo] layer to take anchors")
    if k < len(heads) or k % len(heads):
        raise UserError(f"--num: {k} anchors cannot be shared equally by the {len(heads)} [yolo] heads of {path}; "
                        f"give a multiple of {len(heads)} (each head takes --num / {len(heads)})")
    for yolo in heads:
        if not (yolo.index and isinstance(network.layers[yolo.index - 1], Convolutional)):
            raise network.error(yolo, None, "the layer before is not a [convolutional]: its filters cannot follow "
                                            "the new mask")
    width, height = network.net.width or width, network.net.height or height
    shapes = layer_shapes(network, network.net.channels or 3, height, width)
    return network, head_masks([width / shapes[yolo.index][1].width for yolo in heads], k)


def cfg_with_anchors(network: DarknetCfg, masks: list[tuple[int, ...]], fitted: Anchors, header: str) -> str:
    """The text of ``network``'s .cfg with the anchors: each ``[yolo]``'s ``anchors`` (as printed), ``num`` and
    ``mask`` (``masks``, from :func:`plan_heads`), the ``filters`` of the convolution before it; every other line
    as written, ``header`` first. The new network is checked to build."""
    from bigbatch.darknet.cfg_edit import edit_cfg_text
    from bigbatch.darknet.shapes import layer_shapes

    texts = [t.replace(" ", "") for t in fitted.anchor_texts()]
    values = tuple((float(t.split(",")[0]), float(t.split(",")[1])) for t in texts)
    layers = list(network.layers)
    changes: dict[int, dict[str, str]] = {}
    for yolo, mask in zip(network.yolo_layers, masks, strict=True):
        before = layers[yolo.index - 1]
        filters = len(mask) * (yolo.classes + 5)
        layers[yolo.index] = replace(yolo, mask=mask, anchors=values, num=len(values))
        layers[before.index] = replace(before, filters=filters)
        changes[yolo.index] = {"mask": ",".join(map(str, mask)), "anchors": ",  ".join(texts), "num": str(len(values))}
        changes.setdefault(before.index, {})["filters"] = str(filters)
    net = network.net
    layer_shapes(replace(network, layers=tuple(layers)), net.channels or 3, net.height or fitted.height,
                 net.width or fitted.width)
    return edit_cfg_text(network.path, changes, header)


# ----------------------------------------------------------------------------- the command


def anchors_command(data: Path, num: int, size: str | None, cfg: Path | None, out: Path | None, seed: int,
                    tries: int = DEFAULT_TRIES) -> list[str]:
    """``bigbatch data anchors``: the lines it prints (the cfg written first, with ``--cfg`` and ``--out``)."""
    from bigbatch.floor.files import atomic_write
    from bigbatch.floor.outputs import check_output_file

    if (cfg is None) != (out is None):
        raise UserError("--cfg: goes with --out OUT.cfg (the new cfg to write)" if out is None else
                        "--out: goes with --cfg IN.cfg (the cfg whose anchors are replaced)")
    if not 1 <= num <= MAX_ANCHORS:
        raise UserError(f"--num: expected 1 to {MAX_ANCHORS} anchors, got {num}")
    if not 0 <= seed < 2**32:
        raise UserError(f"--seed: expected a whole number from 0 to 2^32 - 1 (srand's unsigned int), got {seed}")
    if not 1 <= tries <= MAX_TRIES:
        raise UserError(f"--tries: expected 1 to {MAX_TRIES} runs of the k-means, got {tries}")
    if out is not None:
        check_output_file(out, "--out")
    if cfg is not None:  # a path, or a cfg of bigbatch's own by name (yolov3-tiny-shapes.cfg), as model.cfg
        from bigbatch.darknet.models import find_cfg

        cfg = find_cfg(str(cfg), key="--cfg")
    if size is None:
        if cfg is None:
            raise UserError("--size: the network's input, WIDTHxHEIGHT (e.g. 416x416), or give --cfg to take its "
                            "[net] width and height")
        from bigbatch.darknet.cfg import read_darknet_cfg

        net = read_darknet_cfg(cfg, key="--cfg").net
        if not (net.width and net.height):
            raise UserError(f"--size: {cfg} gives no [net] width and height; give --size WIDTHxHEIGHT")
        width, height = net.width, net.height
    else:
        width, height = parse_size(size)
    planned = None if cfg is None else plan_heads(cfg, num, width, height)  # before the work: the heads take --num
    relative, images, what = read_box_sizes(data)
    fitted = fit_anchors(relative, num, width, height, seed, tries)
    lines = [f"read {len(relative)} boxes of {images} images from {what}"]
    if tries > 1:
        lines.append(f"k-means (1 - IoU), {num} anchors at {width}x{height}: {tries} tries, seeds {seed} to "
                     f"{seed + tries - 1}, avg IoU {' '.join(f'{iou:.2f}' for iou in fitted.tries)} %; kept: seed "
                     f"{fitted.seed}, {fitted.moves} iterations")
    else:
        lines.append(f"k-means (1 - IoU), {num} anchors at {width}x{height}: seed {seed}, {fitted.moves} iterations")
    lines += fitted.lines()
    if planned is not None and out is not None:
        network, masks = planned
        header = (f"# anchors by bigbatch data anchors: {num} fitted to {what} at {width}x{height}, "
                  f"avg IoU {fitted.avg_iou:.2f} %")
        text = cfg_with_anchors(network, masks, fitted, header)
        check_output_file(out, "--out")  # still new after the work
        atomic_write(out, lambda f: f.write(text), mode="w")
        lines.append(f"written to {out}: {cfg} with these anchors, masks "
                     f"{' / '.join(','.join(map(str, m)) for m in masks)} and the filters before each [yolo]")
    return lines
