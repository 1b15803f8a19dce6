"""COCO evaluation: our numbers (faster-coco-eval) against pycocotools' on the same detections, hand-computed
AP on a tiny case, the conversions from torchvision outputs, the printed lines and the results file."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchvision import tv_tensors

from bigbatch.errors import UserError
from bigbatch.tasks.coco_eval import (
    SUMMARY_KEYS,
    darknet_line,
    detections_to_coco,
    evaluate_detections,
    format_table,
    save_detections,
)

CATEGORIES = [
    {"id": 3, "name": "circle"},
    {"id": 7, "name": "square"},
    {"id": 11, "name": "triangle"},
    {"id": 20, "name": "star"},  # ground truth, no detection at all
    {"id": 25, "name": "hexagon"},  # no ground truth, one false positive
]
NAMES = [c["name"] for c in CATEGORIES]
CAT = {c["name"]: c["id"] for c in CATEGORIES}


def _gt(image_id: int, name: str, bbox: list[float], area: float | None = None) -> dict:
    return {"image_id": image_id, "category_id": CAT[name], "bbox": bbox,
            "area": bbox[2] * bbox[3] if area is None else area, "iscrowd": 0}


def _dt(image_id: int, name: str, bbox: list[float], score: float) -> dict:
    return {"image_id": image_id, "category_id": CAT[name], "bbox": bbox, "score": score}


def hand_made() -> tuple[dict, list[dict]]:
    """6 images; small (< 32^2), medium and large (> 96^2) objects; a GT area that is not w x h (a circle);
    matches at various IoUs, duplicates, false positives (one on an image without objects, one of a class
    without ground truth, one of the wrong class), missed objects, a class never detected."""
    annotations = [
        _gt(1, "circle", [10, 10, 20, 20], area=math.pi * 10**2),
        _gt(1, "square", [100, 100, 60, 50]),
        _gt(1, "triangle", [300, 200, 150, 120]),
        _gt(2, "circle", [50, 60, 40, 40]),
        _gt(2, "circle", [200, 220, 25, 25]),
        _gt(2, "square", [400, 300, 200, 150]),
        _gt(2, "star", [20, 300, 30, 30]),
        _gt(3, "triangle", [10, 10, 80, 70]),
        _gt(3, "square", [300, 50, 16, 16]),  # missed
        _gt(3, "circle", [500, 400, 100, 60]),
        _gt(4, "star", [100, 100, 100, 100]),
        _gt(4, "triangle", [250, 250, 40, 30]),
        _gt(6, "square", [0, 0, 120, 90]),
        _gt(6, "circle", [200, 200, 12, 10]),
    ]
    for i, ann in enumerate(annotations):
        ann["id"] = 100 + i
    ground_truth = {
        "images": [{"id": i, "width": 640, "height": 480, "file_name": f"{i}.jpg"} for i in range(1, 7)],
        "annotations": annotations,
        "categories": CATEGORIES,
    }
    detections = [
        _dt(1, "circle", [11, 10, 20, 21], 0.95),
        _dt(1, "circle", [9, 12, 22, 19], 0.61),  # duplicate
        _dt(1, "square", [104, 98, 58, 55], 0.85),
        _dt(1, "triangle", [310, 210, 150, 120], 0.70),
        _dt(1, "hexagon", [400, 400, 30, 30], 0.50),  # class without ground truth
        _dt(2, "circle", [52, 58, 40, 42], 0.90),
        _dt(2, "circle", [200, 220, 25, 25], 0.30),
        _dt(2, "square", [420, 320, 200, 150], 0.88),
        _dt(2, "square", [50, 60, 40, 40], 0.80),  # wrong class on the circle
        _dt(2, "triangle", [500, 50, 60, 60], 0.65),
        _dt(3, "triangle", [12, 14, 76, 70], 0.75),
        _dt(3, "circle", [505, 395, 100, 60], 0.92),
        _dt(3, "circle", [510, 410, 80, 50], 0.40),  # duplicate
        _dt(4, "triangle", [240, 245, 50, 40], 0.55),
        _dt(4, "triangle", [250, 250, 40, 30], 0.35),  # exact, but below a looser box
        _dt(5, "circle", [100, 100, 30, 30], 0.97),  # high-scoring false positive on an empty image
        _dt(5, "square", [200, 200, 100, 100], 0.45),
        _dt(6, "square", [2, 1, 118, 92], 0.99),
        _dt(6, "circle", [201, 201, 12, 10], 0.20),
        _dt(6, "circle", [300, 300, 10, 10], 0.52),
    ]
    return ground_truth, detections


def seeded(seed: int) -> tuple[dict, list[dict]]:
    """40 images, 6 categories with non-contiguous ids, jittered matches, duplicates and false positives."""
    rng = np.random.default_rng(seed)
    categories = [{"id": int(i), "name": f"c{i}"} for i in (2, 5, 6, 13, 40, 41)]
    ids = [c["id"] for c in categories]
    annotations, detections = [], []

    def box() -> list[float]:
        w, h = rng.uniform(6, 180, size=2)
        return [float(rng.uniform(0, 640 - w)), float(rng.uniform(0, 480 - h)), float(w), float(h)]

    for image_id in range(1, 41):
        for _ in range(rng.integers(0, 7)):
            bbox, cat = box(), int(rng.choice(ids))
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cat, "bbox": bbox,
                                "area": bbox[2] * bbox[3], "iscrowd": 0})
            for _ in range(rng.choice([0, 1, 1, 1, 2])):  # missed, found, or found twice
                x, y, w, h = bbox
                jitter = rng.normal(0, 0.12, size=4) * [w, h, w, h]
                detections.append({"image_id": image_id, "category_id": cat, "score": float(rng.uniform()),
                                   "bbox": [x + jitter[0], y + jitter[1], max(1.0, w + jitter[2]),
                                            max(1.0, h + jitter[3])]})
        for _ in range(rng.integers(0, 5)):
            detections.append({"image_id": image_id, "category_id": int(rng.choice(ids)), "bbox": box(),
                               "score": float(rng.uniform(0, 0.7))})
    images = [{"id": i, "width": 640, "height": 480} for i in range(1, 41)]
    return {"images": images, "annotations": annotations, "categories": categories}, detections


def pycocotools_eval(ground_truth: dict, detections: list[dict], cat_ids: list[int] | None = None) -> COCOeval:
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = copy.deepcopy(ground_truth)
        gt.createIndex()
        dt = gt.loadRes(copy.deepcopy(detections))
        evaluator = COCOeval(gt, dt, "bbox")
        if cat_ids is not None:
            evaluator.params.catIds = cat_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


def as_pycocotools_stats(metrics: dict[str, float]) -> np.ndarray:
    return np.array([-1.0 if math.isnan(metrics[k]) else metrics[k] for k in SUMMARY_KEYS])


CASES = {"hand-made": hand_made, "seeded-0": lambda: seeded(0), "seeded-1": lambda: seeded(1)}


@pytest.mark.parametrize("case", list(CASES))
def test_all_twelve_stats_equal_pycocotools(case: str) -> None:
    ground_truth, detections = CASES[case]()
    names = [c["name"] for c in ground_truth["categories"]]
    reference = pycocotools_eval(ground_truth, detections)
    metrics = evaluate_detections(ground_truth, detections, names)
    np.testing.assert_allclose(as_pycocotools_stats(metrics), reference.stats, rtol=0, atol=1e-9)
    assert 0.05 < metrics["mAP"] < 0.95 and metrics["mAP50"] > metrics["mAP75"]  # a case that tells numbers apart


@pytest.mark.parametrize("case", list(CASES))
def test_per_class_ap_equals_pycocotools(case: str) -> None:
    ground_truth, detections = CASES[case]()
    categories = ground_truth["categories"]
    metrics = evaluate_detections(ground_truth, detections, [c["name"] for c in categories])
    reference = pycocotools_eval(ground_truth, detections)
    precision = reference.eval["precision"]  # [T, R, K, A, M]
    with_gt = {a["category_id"] for a in ground_truth["annotations"]}
    for category in categories:
        name = category["name"]
        if category["id"] not in with_gt:
            assert f"AP/{name}" not in metrics and f"AP50/{name}" not in metrics
            continue
        k = reference.params.catIds.index(category["id"])
        p_all, p_50 = precision[:, :, k, 0, -1], precision[0, :, k, 0, -1]
        assert metrics[f"AP/{name}"] == pytest.approx(p_all[p_all > -1].mean(), abs=1e-9)
        assert metrics[f"AP50/{name}"] == pytest.approx(p_50[p_50 > -1].mean(), abs=1e-9)
        # the same number as pycocotools' mAP over this one category
        alone = pycocotools_eval(ground_truth, detections, cat_ids=[category["id"]])
        assert metrics[f"AP/{name}"] == pytest.approx(alone.stats[0], abs=1e-9)
        assert metrics[f"AP50/{name}"] == pytest.approx(alone.stats[1], abs=1e-9)


def test_hand_made_case_specifics() -> None:
    ground_truth, detections = hand_made()
    metrics = evaluate_detections(ground_truth, detections, NAMES)
    assert metrics["AP/star"] == 0.0 and metrics["AP50/star"] == 0.0  # ground truth, never detected
    assert "AP/hexagon" not in metrics  # detected, but no ground truth
    assert set(SUMMARY_KEYS) <= set(metrics)


def test_class_subset_equals_pycocotools_restricted_to_those_categories() -> None:
    ground_truth, detections = hand_made()
    metrics = evaluate_detections(ground_truth, detections, ["triangle", "circle"])
    reference = pycocotools_eval(ground_truth, detections, cat_ids=[CAT["circle"], CAT["triangle"]])
    np.testing.assert_allclose(as_pycocotools_stats(metrics), reference.stats, rtol=0, atol=1e-9)
    assert {k for k in metrics if "/" in k} == {"AP/triangle", "AP50/triangle", "AP/circle", "AP50/circle"}


def test_hand_computed_ap() -> None:
    """Two objects; detections by score: hit, false positive, hit. Precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1;
    interpolated: 1 at the 51 recall points 0..0.50 and 2/3 at the 50 points 0.51..1, so AP = (51 + 50 * 2/3) / 101
    at every IoU threshold (the hits are exact)."""
    ground_truth = {
        "images": [{"id": 7, "width": 200, "height": 200}],
        "categories": [{"id": 4, "name": "a"}, {"id": 9, "name": "b"}],
        "annotations": [{"id": 1, "image_id": 7, "category_id": 4, "bbox": [0, 0, 10, 10]},  # no area, no iscrowd
                        {"id": 2, "image_id": 7, "category_id": 4, "bbox": [50, 50, 40, 40]}],
    }
    detections = [
        {"image_id": 7, "category_id": 4, "bbox": [0, 0, 10, 10], "score": 0.9},
        {"image_id": 7, "category_id": 4, "bbox": [150, 150, 10, 10], "score": 0.8},
        {"image_id": 7, "category_id": 4, "bbox": [50, 50, 40, 40], "score": 0.7},
    ]
    metrics = evaluate_detections(ground_truth, detections, ["a", "b"])
    expected = (51 + 50 * 2 / 3) / 101
    for key in ("mAP", "mAP50", "mAP75", "AP/a", "AP50/a"):
        assert metrics[key] == pytest.approx(expected, abs=1e-12)
    # area defaulted to w x h (100: small, 1600: medium). Small: the hit, then the (small) false positive after
    # recall 1 is reached: AP 1. Medium: the false positive is small, outside the range and unmatched: ignored.
    assert metrics["mAP_small"] == 1.0 and metrics["mAP_medium"] == 1.0
    assert math.isnan(metrics["mAP_large"])  # no large object: pycocotools' -1
    assert metrics["AR1"] == 0.5 and metrics["AR100"] == 1.0
    assert "AP/b" not in metrics


def test_perfect_detections_score_one() -> None:
    ground_truth, _ = hand_made()
    perfect = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
               for a in ground_truth["annotations"]]
    metrics = evaluate_detections(ground_truth, perfect, NAMES)
    for key in ("mAP", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large", "AR100"):
        assert metrics[key] == pytest.approx(1.0, abs=1e-12)
    assert all(metrics[f"AP/{n}"] == pytest.approx(1.0, abs=1e-12) for n in NAMES if n != "hexagon")


def test_empty_detections_give_zeros_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    ground_truth, _ = hand_made()
    metrics = evaluate_detections(ground_truth, [], NAMES)
    assert all(metrics[k] == 0.0 for k in SUMMARY_KEYS)  # every area range has ground truth here
    assert all(metrics[f"AP/{n}"] == 0.0 and metrics[f"AP50/{n}"] == 0.0 for n in NAMES if n != "hexagon")
    evaluate_detections(*hand_made(), NAMES)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_inputs_are_not_modified() -> None:
    ground_truth, detections = hand_made()
    before = copy.deepcopy((ground_truth, detections))
    evaluate_detections(ground_truth, detections, NAMES)
    assert (ground_truth, detections) == before


def test_unknown_class_name_and_image_id_are_errors() -> None:
    ground_truth, detections = hand_made()
    with pytest.raises(UserError, match="'dog'"):
        evaluate_detections(ground_truth, detections, ["circle", "dog"])
    with pytest.raises(ValueError, match="99"):
        evaluate_detections(ground_truth, [*detections, _dt(99, "circle", [0, 0, 5, 5], 0.5)], NAMES)


def test_detections_to_coco_by_hand() -> None:
    outputs = [
        {"boxes": torch.tensor([[10.0, 20.0, 30.0, 60.0], [1.234567, 2.0, 3.5, 4.25]]),
         "scores": torch.tensor([0.9, 0.123456789]), "labels": torch.tensor([1, 0])},
        {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)},
        {"boxes": tv_tensors.BoundingBoxes([[50.0, 40.0, 20.0, 10.0]], format="CXCYWH", canvas_size=(100, 100)),
         "scores": torch.tensor([0.5]), "labels": torch.tensor([2])},
    ]
    results = detections_to_coco([42, 43, 44], outputs, category_ids=[3, 7, 11])
    assert len(results) == 3
    assert results[0] == {"image_id": 42, "category_id": 7, "bbox": [10.0, 20.0, 20.0, 40.0],
                          "score": pytest.approx(0.9, abs=1e-6)}
    assert results[1]["category_id"] == 3
    assert results[1]["bbox"] == pytest.approx([1.23, 2.0, 2.27, 2.25], abs=1e-9)
    assert results[1]["score"] == pytest.approx(0.12346, abs=1e-9)
    assert results[2] == {"image_id": 44, "category_id": 11, "bbox": [40.0, 35.0, 20.0, 10.0], "score": 0.5}
    json.dumps(results)  # plain Python numbers
    with pytest.raises(ValueError, match="labels"):
        detections_to_coco([1], [{"boxes": torch.zeros(1, 4), "scores": torch.ones(1), "labels": torch.tensor([3])}],
                           category_ids=[3, 7, 11])


def test_detections_to_coco_round_trip_is_perfect() -> None:
    ground_truth, _ = hand_made()
    names = NAMES[:4]
    label = {c["id"]: i for i, c in enumerate(CATEGORIES[:4])}
    image_ids, outputs = [], []
    for image in ground_truth["images"]:
        anns = [a for a in ground_truth["annotations"] if a["image_id"] == image["id"]]
        xywh = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        image_ids.append(image["id"])
        labels = torch.tensor([label[a["category_id"]] for a in anns])
        outputs.append({"boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1),
                        "scores": torch.ones(len(anns)), "labels": labels})
    results = detections_to_coco(image_ids, outputs, category_ids=[c["id"] for c in CATEGORIES[:4]])
    metrics = evaluate_detections(ground_truth, results, names)
    assert metrics["mAP"] == pytest.approx(1.0, abs=1e-12)


def test_darknet_line() -> None:
    line = darknet_line({"mAP50": (51 + 50 * 2 / 3) / 101})
    assert line == " mean average precision (mAP@0.50) = 0.834983, or 83.50 % "
    assert darknet_line({"mAP50": 0.0}) == " mean average precision (mAP@0.50) = 0.000000, or 0.00 % "


def test_format_table() -> None:
    metrics = {"mAP": 0.41234, "mAP50": 0.7, "mAP75": 0.4, "mAP_small": 0.1, "mAP_medium": 0.5,
               "mAP_large": math.nan, "AP/cat": 0.5, "AP50/cat": 0.75}
    lines = format_table(metrics, ["cat", "dog"]).splitlines()
    rows = {line.split("  ")[0].strip(): line.split()[-2:] for line in lines if line.strip()}
    assert lines[1].split()[-1] == "41.23"
    assert rows["mAP large"][-1] == "-"
    assert rows["cat"] == ["50.00", "75.00"]
    assert rows["dog"] == ["-", "-"]


def test_save_detections_atomic_round_trip(tmp_path) -> None:
    _, detections = hand_made()
    path = tmp_path / "out" / "detections.json"
    save_detections(path, detections[:3])
    save_detections(path, detections)  # replaces the old file
    assert json.loads(path.read_text()) == detections
    assert [p.name for p in path.parent.iterdir()] == ["detections.json"]  # no temporary file left
