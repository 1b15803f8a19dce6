"""COCO box evaluation time: bigbatch's ``evaluate_detections`` (faster-coco-eval) against pycocotools, side by side.

Both sides evaluate the same detections against the same ground truth, from the same plain inputs (a COCO
dict and a list of COCO results) to the summary numbers: index the ground truth, load the results,
evaluate, accumulate, summarize. Rounds alternate which side goes first; the ratio pycocotools /
faster-coco-eval is taken per round and the median reported. The two sides' 12 summary numbers are
compared too (they must agree).

Ground truth, in order of preference:
  --annotations PATH   a COCO file, e.g. a shapes set's ``annotations/val.json``;
  otherwise            a shapes set of ``--images`` images generated into a temporary folder with
                       ``bigbatch.data.formats.shapes.write_shapes`` (all in one split);
  --synthetic          (or when the shapes generator is missing) comparable generated boxes without
                       images: 5 categories with odd ids, 1-8 boxes of 8..100 px per 128 px image.
Detections are derived from the ground truth, deterministically from ``--seed``: each object found with
probability 0.9 as a jittered box (sd 8 % of its size), sometimes a second lower-scored duplicate or a
copy with the wrong class, plus 15-40 random false positives per image, so ~20-50 per image.

    python benchmarks/coco_eval_speed.py [--images 3000] [--rounds 5] [--seed 0] [--annotations PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from bigbatch.tasks.coco_eval import SUMMARY_KEYS, evaluate_detections


def synthetic_ground_truth(images: int, seed: int, size: int = 128) -> dict:
    """A COCO dict like the shapes set's: 5 categories (odd ids), 1-8 boxes of 8..100 px per image."""
    rng = np.random.default_rng(seed)
    categories = [{"id": cid, "name": name} for cid, name in
                  zip((1, 3, 5, 7, 9), ("circle", "square", "triangle", "star", "cross"), strict=True)]
    entries, annotations = [], []
    for image_id in range(1, images + 1):
        entries.append({"id": image_id, "width": size, "height": size, "file_name": f"{image_id:06d}.jpg"})
        for _ in range(rng.integers(1, 9)):
            w, h = rng.uniform(8, 100, size=2)
            x, y = rng.uniform(0, size - w), rng.uniform(0, size - h)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": int(rng.choice([1, 3, 5, 7, 9])),
                                "bbox": [round(float(v), 2) for v in (x, y, w, h)],
                                "area": round(float(w * h * rng.uniform(0.5, 1.0)), 2), "iscrowd": 0})
    return {"images": entries, "annotations": annotations, "categories": categories}


def shapes_ground_truth(images: int, seed: int) -> dict:
    """The shapes set's COCO annotations for ``images`` generated images (written to a temporary folder)."""
    from bigbatch.data.formats.shapes import write_shapes

    with tempfile.TemporaryDirectory() as tmp:
        write_shapes(Path(tmp), images, seed=seed, val_fraction=0.0)
        return json.loads((Path(tmp) / "annotations" / "train.json").read_text())


def make_detections(ground_truth: dict, seed: int) -> list[dict]:
    """Detections near the ground truth (found, duplicated, wrong class) plus random false positives."""
    rng = np.random.default_rng(seed + 1)
    cat_ids = [c["id"] for c in ground_truth["categories"]]
    sizes = {im["id"]: (im.get("width", 128), im.get("height", 128)) for im in ground_truth["images"]}
    by_image: dict[int, list[dict]] = {im["id"]: [] for im in ground_truth["images"]}
    for ann in ground_truth["annotations"]:
        by_image[ann["image_id"]].append(ann)

    def rounded(box: np.ndarray) -> list[float]:
        return [round(float(v), 2) for v in box]

    detections = []
    for image_id, anns in by_image.items():
        width, height = sizes[image_id]
        for ann in anns:
            box = np.asarray(ann["bbox"], dtype=np.float64)
            if rng.uniform() < 0.9:
                found = box + rng.normal(0, 0.08, size=4) * box[[2, 3, 2, 3]]
                found[2:] = np.maximum(found[2:], 1.0)
                score = float(rng.uniform(0.3, 1.0))
                detections.append({"image_id": image_id, "category_id": ann["category_id"], "bbox": rounded(found),
                                   "score": round(score, 5)})
                if rng.uniform() < 0.15:
                    detections.append({"image_id": image_id, "category_id": ann["category_id"],
                                       "bbox": rounded(found + rng.normal(0, 2, size=4)),
                                       "score": round(score * float(rng.uniform(0.2, 0.9)), 5)})
                if rng.uniform() < 0.1:
                    detections.append({"image_id": image_id, "category_id": int(rng.choice(cat_ids)),
                                       "bbox": rounded(found), "score": round(score * 0.5, 5)})
        for _ in range(rng.integers(15, 41)):
            w, h = rng.uniform(8, min(100, width)), rng.uniform(8, min(100, height))
            box = np.array([rng.uniform(0, width - w), rng.uniform(0, height - h), w, h])
            detections.append({"image_id": image_id, "category_id": int(rng.choice(cat_ids)), "bbox": rounded(box),
                               "score": round(float(rng.uniform(0, 0.6)), 5)})
    return detections


def run_pycocotools(ground_truth: dict, detections: list[dict]) -> np.ndarray:
    """pycocotools from the same plain inputs: its own annotation and result dicts (it writes into them)."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {**ground_truth, "annotations": [dict(a) for a in ground_truth["annotations"]]}
        gt.createIndex()
        dt = gt.loadRes([dict(d) for d in detections])
        evaluator = COCOeval(gt, dt, "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return np.asarray(evaluator.stats)


def run_bigbatch(ground_truth: dict, detections: list[dict], names: list[str]) -> np.ndarray:
    metrics = evaluate_detections(ground_truth, detections, names)
    return np.array([-1.0 if math.isnan(metrics[k]) else metrics[k] for k in SUMMARY_KEYS])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="images of generated ground truth")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--annotations", type=Path, help="a COCO annotation file to use as the ground truth")
    parser.add_argument("--synthetic", action="store_true", help="generated boxes instead of the shapes set")
    args = parser.parse_args()

    if args.annotations is not None:
        ground_truth, source = json.loads(args.annotations.read_text()), str(args.annotations)
    else:
        try:
            if args.synthetic:
                raise ImportError
            ground_truth, source = shapes_ground_truth(args.images, args.seed), "shapes set (write_shapes)"
        except ImportError:
            ground_truth, source = synthetic_ground_truth(args.images, args.seed), "synthetic boxes"
    detections = make_detections(ground_truth, args.seed)
    names = [c["name"] for c in ground_truth["categories"]]
    images = len(ground_truth["images"])

    print("command: " + shlex.join(["python", "benchmarks/coco_eval_speed.py", *sys.argv[1:]]))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"pycocotools {importlib.metadata.version('pycocotools')}, "
          f"faster-coco-eval {importlib.metadata.version('faster-coco-eval')}")
    print(f"ground truth: {source}, {images} images, {len(ground_truth['annotations'])} boxes, "
          f"{len(names)} categories; {len(detections)} detections ({len(detections) / images:.1f} per image)")

    sides = {
        "pycocotools": lambda: run_pycocotools(ground_truth, detections),
        "faster-coco-eval": lambda: run_bigbatch(ground_truth, detections, names),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    stats: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            start = time.perf_counter()
            stats[name] = sides[name]()
            times[name].append(time.perf_counter() - start)
    ratios = [p / f for p, f in zip(times["pycocotools"], times["faster-coco-eval"], strict=True)]
    difference = float(np.max(np.abs(stats["pycocotools"] - stats["faster-coco-eval"])))

    print(f"\n{args.rounds} rounds, alternating which side goes first; medians; "
          f"largest difference of the 12 stats: {difference:.1e}; mAP {stats['faster-coco-eval'][0]:.4f}, "
          f"mAP50 {stats['faster-coco-eval'][1]:.4f}\n")
    print("| images | detections | pycocotools s | faster-coco-eval s | ratio (pycocotools / faster) |")
    print("|-------:|-----------:|--------------:|-------------------:|-----------------------------:|")
    print(f"| {images} | {len(detections)} | {statistics.median(times['pycocotools']):.2f} "
          f"| {statistics.median(times['faster-coco-eval']):.2f} | {statistics.median(ratios):.1f}x |")


if __name__ == "__main__":
    main()
