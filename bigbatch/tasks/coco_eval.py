"""COCO box evaluation with faster-coco-eval (the C++ port of pycocotools' ``COCOeval``, same numbers).

Inputs are plain COCO structures: the ground truth a COCO dict (``images``, ``annotations``,
``categories``) and the detections a list in the COCO results format (``image_id``,
``category_id``, ``bbox`` [x, y, w, h] in pixels, ``score``).

The numbers are pycocotools' ``COCOeval.stats`` for ``iouType="bbox"`` (Lin et al., "Microsoft
COCO", 2014; cocodataset/cocoapi ``cocoeval.py``): AP is the precision interpolated at 101 recall
points, averaged over the recall points, the categories and, for ``mAP``, the 10 IoU thresholds
0.50:0.05:0.95, with at most 100 detections per image; small / medium / large are objects of area
< 32^2, 32^2..96^2 and > 96^2 pixels. All values are fractions in 0..1.

A summary value pycocotools reports as -1 (no ground truth object in that area range, or none at
all) is NaN here, so every summary key is always present. Per-class keys ``AP/<name>`` and
``AP50/<name>`` exist only for classes with at least one ground-truth object (a class without
ground truth has no AP).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from faster_coco_eval import COCO, COCOeval_faster
from torchvision import tv_tensors
from torchvision.ops import box_convert
from torchvision.transforms.v2.functional import convert_bounding_box_format

from bigbatch.errors import UserError

# pycocotools' ``stats`` in its order: index i of ``COCOeval.stats`` is SUMMARY_KEYS[i].
SUMMARY_KEYS = (
    "mAP",  # AP @ IoU 0.50:0.95, all areas, 100 detections
    "mAP50",  # AP @ IoU 0.50
    "mAP75",  # AP @ IoU 0.75
    "mAP_small",  # AP, area < 32^2
    "mAP_medium",  # AP, 32^2 <= area < 96^2
    "mAP_large",  # AP, area >= 96^2
    "AR1",  # AR @ 0.50:0.95, 1 detection per image
    "AR10",  # ... 10 detections per image
    "AR100",  # ... 100 detections per image
    "AR_small",
    "AR_medium",
    "AR_large",
)

_TABLE_ROWS = (
    ("mAP@[.5:.95]", "mAP"),
    ("mAP@0.5", "mAP50"),
    ("mAP@0.75", "mAP75"),
    ("mAP small", "mAP_small"),
    ("mAP medium", "mAP_medium"),
    ("mAP large", "mAP_large"),
)


def _quiet(*args: Any, **kwargs: Any) -> None:
    """faster-coco-eval's ``print_function``: say nothing."""


def _category_ids(ground_truth: Mapping[str, Any], class_names: Sequence[str]) -> list[int]:
    """The COCO category id of each class name, in ``class_names`` order."""
    ids_by_name: dict[str, list[int]] = {}
    for category in ground_truth.get("categories", []):
        ids_by_name.setdefault(category["name"], []).append(int(category["id"]))
    ids = []
    for name in class_names:
        found = ids_by_name.get(name, [])
        if len(found) != 1:
            problem = "is not among" if not found else f"names {len(found)} categories ({found}) in"
            known = ", ".join(sorted(ids_by_name)) or "none"
            raise UserError(f"class {name!r} {problem} the ground truth's categories (known: {known})")
        ids.append(found[0])
    return ids


def _ground_truth_copy(ground_truth: Mapping[str, Any]) -> dict[str, Any]:
    """The ground truth with its own annotation dicts (the evaluator writes into them), ``area`` defaulting
    to the box's w x h and ``iscrowd`` to 0 where absent."""
    annotations = []
    for ann in ground_truth.get("annotations", []):
        ann = dict(ann)
        ann.setdefault("area", float(ann["bbox"][2]) * float(ann["bbox"][3]))
        ann.setdefault("iscrowd", 0)
        annotations.append(ann)
    return {
        "images": list(ground_truth.get("images", [])),
        "annotations": annotations,
        "categories": list(ground_truth.get("categories", [])),
    }


def run_cocoeval(ground_truth: Mapping[str, Any], detections: Sequence[Mapping[str, Any]],
                 category_ids: Sequence[int] | None = None) -> COCOeval_faster:
    """faster-coco-eval's ``COCOeval`` for boxes, evaluated, accumulated and summarized, silently.

    ``category_ids`` restricts the evaluation to those categories (default: all of the ground truth's).
    Detections of other categories are ignored. Neither input is modified.
    """
    gt = COCO(_ground_truth_copy(ground_truth), print_function=_quiet)
    known = set(gt.getImgIds())
    unknown = sorted({d["image_id"] for d in detections} - known)
    if unknown:
        raise ValueError(f"detections name {len(unknown)} image ids not in the ground truth, e.g. {unknown[:5]}")
    dt = gt.loadRes([dict(d) for d in detections])  # loadRes adds keys to each dict: give it copies
    dt.print_function = _quiet
    evaluator = COCOeval_faster(gt, dt, iouType="bbox", print_function=_quiet)
    if category_ids is not None:
        evaluator.params.catIds = sorted(set(category_ids))
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return evaluator


def _mean_defined(values: np.ndarray) -> float:
    """pycocotools' average over an array slice: the mean of the entries > -1, or -1 when none is."""
    defined = values[values > -1]
    return float(defined.mean()) if defined.size else -1.0


def evaluate_detections(ground_truth: Mapping[str, Any], detections: Sequence[Mapping[str, Any]],
                        class_names: Sequence[str]) -> dict[str, float]:
    """COCO box metrics of ``detections`` against ``ground_truth``, over the categories named ``class_names``.

    Returns the 12 pycocotools summary numbers under ``SUMMARY_KEYS`` (NaN where pycocotools says -1),
    and for each class with ground truth ``AP/<name>`` (AP @ 0.50:0.95) and ``AP50/<name>`` (AP @ 0.50),
    both read from the accumulated precision array ``precision[T, R, K, A, M]`` at area "all" and 100
    detections, averaged over its defined (> -1) entries as pycocotools' summary does.
    Empty detections give zeros. Class names are matched to the ground truth's category names.
    """
    category_ids = _category_ids(ground_truth, class_names)
    evaluator = run_cocoeval(ground_truth, detections, category_ids)
    metrics = {key: (float(v) if v > -1 else math.nan) for key, v in zip(SUMMARY_KEYS, evaluator.stats, strict=True)}
    precision = np.asarray(evaluator.eval["precision"])  # [IoU thresholds, recall points, K, areas, maxDets]
    params = evaluator.params
    k_of = {cat: k for k, cat in enumerate(params.catIds)}
    area_all, max_dets = params.areaRngLbl.index("all"), len(params.maxDets) - 1
    iou50 = int(np.argmin(np.abs(np.asarray(params.iouThrs) - 0.5)))
    for name, cat in zip(class_names, category_ids, strict=True):
        per_class = precision[:, :, k_of[cat], area_all, max_dets]
        ap = _mean_defined(per_class)
        if ap > -1:  # -1: no ground truth of this class
            metrics[f"AP/{name}"] = ap
            metrics[f"AP50/{name}"] = _mean_defined(per_class[iou50])
    return metrics


def detections_to_coco(image_ids: Sequence[int], outputs: Sequence[Mapping[str, torch.Tensor]],
                       category_ids: Sequence[int]) -> list[dict[str, Any]]:
    """torchvision detector outputs -> COCO results.

    ``outputs[i]`` (``boxes`` [N, 4] XYXY pixels of the original image, ``scores`` [N], ``labels`` [N] in
    0..C-1) belongs to image ``image_ids[i]``; label ``l`` becomes category ``category_ids[l]``. Boxes
    become [x, y, w, h] (torchvision ``box_convert``) rounded to 2 decimals, scores to 5.
    """
    if len(image_ids) != len(outputs):
        raise ValueError(f"{len(image_ids)} image ids for {len(outputs)} outputs")
    results: list[dict[str, Any]] = []
    for image_id, output in zip(image_ids, outputs, strict=True):
        boxes = output["boxes"]
        if isinstance(boxes, tv_tensors.BoundingBoxes) and boxes.format != tv_tensors.BoundingBoxFormat.XYXY:
            boxes = convert_bounding_box_format(boxes, new_format=tv_tensors.BoundingBoxFormat.XYXY)
        boxes = torch.as_tensor(boxes).detach().cpu().to(torch.float64).reshape(-1, 4)
        xywh = box_convert(boxes, "xyxy", "xywh").round(decimals=2).tolist()
        scores = output["scores"].detach().cpu().to(torch.float64).round(decimals=5).tolist()
        labels = output["labels"].detach().cpu().tolist()
        if labels and not (0 <= min(labels) and max(labels) < len(category_ids)):
            raise ValueError(f"image {image_id}: labels must lie in 0..{len(category_ids) - 1}, "
                             f"got {sorted(set(labels))}")
        results.extend(
            {"image_id": int(image_id), "category_id": int(category_ids[label]), "bbox": box, "score": score}
            for box, score, label in zip(xywh, scores, labels, strict=True)
        )
    return results


def _percent(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def format_table(metrics: Mapping[str, float], class_names: Sequence[str]) -> str:
    """The six AP summary numbers, then AP and AP50 per class, in percent ("-": undefined, no ground truth)."""
    width = max([len(label) for label, _ in _TABLE_ROWS] + [len(name) for name in class_names] + [5])
    lines = [f"{'metric':<{width}}  {'AP %':>7}"]
    lines += [f"{label:<{width}}  {_percent(metrics.get(key)):>7}" for label, key in _TABLE_ROWS]
    lines += ["", f"{'class':<{width}}  {'AP %':>7}  {'AP50 %':>7}"]
    lines += [
        f"{name:<{width}}  {_percent(metrics.get(f'AP/{name}')):>7}  {_percent(metrics.get(f'AP50/{name}')):>7}"
        for name in class_names
    ]
    return "\n".join(lines)


def darknet_line(metrics: Mapping[str, float]) -> str:
    """Darknet's summary line for ``metrics["mAP50"]``, worded as AlexeyAB/darknet's ``validate_detector_map``
    prints it: ``" mean average precision (mAP@%0.2f) = %f, or %2.2f %% "`` (without the newline).

    The number is COCO's AP@0.5 (101-point interpolation), not Darknet's own all-point VOC-style average.
    """
    value = metrics["mAP50"]
    return " mean average precision (mAP@%0.2f) = %f, or %2.2f %% " % (0.5, value, value * 100)  # noqa: UP031


def save_detections(path: str | Path, detections: Sequence[Mapping[str, Any]]) -> None:
    """Write ``detections`` (COCO results format) as JSON, atomically (``floor/files.py``'s ``atomic_write``)."""
    from bigbatch.floor.files import atomic_write

    atomic_write(path, lambda f: json.dump(list(detections), f), mode="w")
