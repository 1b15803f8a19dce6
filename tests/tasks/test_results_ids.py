"""The category ids of a COCO results file (``eval --save-detections``) are the data set's own.

The oracle is pycocotools scoring the saved file against the set's own annotation file (its ids, its
categories): it must give bigbatch's own numbers, and 1.0 for detections equal to the ground truth. The
generated shapes set numbers its classes 1, 3, 5, 7, 9; a rewritten validation file numbers them with gaps up
to 90 as COCO does, in another order than the training file; a ``data.classes`` subset names classes out of
order; a YOLO set has no ids and is numbered class index + 1, unless a COCO file of the same images gives them
(``data.annotations``; by default the val.json ``data shapes`` wrote beside a generated set), whose areas then make
the small / medium / large numbers agree too. The detections go through the task's real path
(``predict``: the loader, ``boxes_to_original``, ``detections_to_coco``; then ``save_predictions``), from a detector
that answers each image with its ground truth (or, for a score between 0 and 1, with a deterministic mix of shifted
boxes, wrong labels and false positives), once through the real ``eval`` command; and once from a real YOLO
training run and ``eval``.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from bigbatch.config import load_config
from bigbatch.data.formats.shapes import CATEGORY_IDS, CLASSES, generate_shapes
from bigbatch.data.pipeline.loader import eval_batches
from bigbatch.tasks.coco_eval import SUMMARY_KEYS
from bigbatch.tasks.detection import DetectionTask
from tests.helpers import run_main

GAPPED = {"circle": 90, "square": 13, "triangle": 44, "star": 1, "cross": 27}
"""COCO-like ids for the rewritten validation file: gaps, up to 90, not in the training file's order."""
BATCH = 4


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ids") / "shapes"
    generate_shapes(root, 40, seed=5, yolo=True)
    val = json.loads((root / "annotations" / "val.json").read_text())
    assert [(c["id"], c["name"]) for c in val["categories"]] == list(zip(CATEGORY_IDS, CLASSES, strict=True))
    assert CATEGORY_IDS == (1, 3, 5, 7, 9)  # ids are not label + 1: the old numbering is caught
    assert {a["category_id"] for a in val["annotations"]} == set(CATEGORY_IDS)  # every class has ground truth
    # A validation file with COCO-like gapped ids (and an unused category, as COCO's own files have none but
    # a real subset leaves many): the same images and boxes, each category renumbered.
    old_name = {c["id"]: c["name"] for c in val["categories"]}
    gapped = {
        **val,
        "categories": [{"id": GAPPED[n], "name": n} for n in CLASSES] + [{"id": 60, "name": "person"}],
        "annotations": [{**a, "category_id": GAPPED[old_name[a["category_id"]]]} for a in val["annotations"]],
    }
    (root / "annotations" / "val-gapped.json").write_text(json.dumps(gapped))
    return root


def shapes_task(shapes: Path, *overrides: str) -> DetectionTask:
    return DetectionTask.from_config(load_config("shapes-detect", [f"data.path={shapes}", *overrides]))


def coco_overrides(shapes: Path, val_annotations: str) -> list[str]:
    return ["data.name=coco", f"data.train.images={shapes / 'train'}",
            f"data.train.annotations={shapes / 'annotations' / 'train.json'}", f"data.val.images={shapes / 'val'}",
            f"data.val.annotations={shapes / 'annotations' / val_annotations}"]


class GroundTruthDetector(nn.Module):
    """A detector answering each validation image, in the order ``detect`` reads them, with its ground truth in
    the model's input pixels (as a detector's output is). ``imperfect``: every third box shifted by a third of
    its width, every fourth one given the next class, scores falling with the box's index, and one false
    positive per image, so that AP lies strictly between 0 and 1."""

    def __init__(self, task: DetectionTask, batch: int, imperfect: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))  # ``detect`` asks the parameters for the device
        self.answers = [targets for _, targets in eval_batches(task.val_set, batch)]
        self.classes, self.imperfect = len(task.class_names), imperfect

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        targets = self.answers.pop(0)
        assert len(targets) == len(images)
        return [self.answer(t) for t in targets]

    def answer(self, target: dict) -> dict[str, torch.Tensor]:
        boxes = torch.as_tensor(target["boxes"]).clone().float()
        labels = torch.as_tensor(target["labels"]).clone()
        scores = torch.ones(len(labels))
        if self.imperfect:
            index = torch.arange(len(labels))
            shift = (boxes[:, 2] - boxes[:, 0]) / 3 * (index % 3 == 1)
            boxes[:, [0, 2]] += shift[:, None]
            labels = torch.where(index % 4 == 3, (labels + 1) % self.classes, labels)
            scores = 0.95 - 0.1 * (index % 7)
            false_positive = torch.tensor([[2.0, 2.0, 14.0, 14.0]])
            boxes = torch.cat([boxes, false_positive])
            labels = torch.cat([labels, torch.tensor([int(target["image_id"]) % self.classes])])
            scores = torch.cat([scores, torch.tensor([0.6])])
        return {"boxes": boxes, "labels": labels, "scores": scores}


def saved_results(task: DetectionTask, path: Path, imperfect: bool = False) -> tuple[dict, list[dict]]:
    """bigbatch's metrics and the saved file's detections, through ``predict`` and ``save_predictions``."""
    metrics, predictions = task.predict(GroundTruthDetector(task, BATCH, imperfect), BATCH)
    task.save_predictions(path, predictions)
    return metrics, json.loads(path.read_text())


def pycocotools_stats(annotation_file: Path, results_file: Path, category_ids: list[int] | None = None
                      ) -> np.ndarray:
    """pycocotools' 12 summary numbers of a results file against an annotation file (quietly)."""
    with contextlib.redirect_stdout(io.StringIO()):
        ground_truth = COCO(str(annotation_file))
        evaluator = COCOeval(ground_truth, ground_truth.loadRes(str(results_file)), "bbox")
        if category_ids is not None:
            evaluator.params.catIds = sorted(category_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats


def assert_same_numbers(metrics: dict, stats: np.ndarray) -> None:
    assert metrics["mAP"] == pytest.approx(stats[0], abs=1e-6)
    assert metrics["mAP50"] == pytest.approx(stats[1], abs=1e-6)
    assert metrics["mAP75"] == pytest.approx(stats[2], abs=1e-6)


@pytest.mark.parametrize("imperfect", [False, True], ids=["perfect", "imperfect"])
def test_shapes_results_file_scores_against_its_own_annotation_file(shapes, tmp_path, imperfect):
    task = shapes_task(shapes)
    metrics, detections = saved_results(task, tmp_path / "d.json", imperfect)
    stats = pycocotools_stats(shapes / "annotations" / "val.json", tmp_path / "d.json")
    assert_same_numbers(metrics, stats)
    assert {d["category_id"] for d in detections} == set(CATEGORY_IDS)
    assert task.category_ids == [1, 3, 5, 7, 9]
    if imperfect:
        assert 0.2 < stats[0] < 0.9 and 0.3 < stats[1] < 0.95
    else:
        assert stats[0] == pytest.approx(1.0) and stats[1] == pytest.approx(1.0)


@pytest.mark.parametrize("imperfect", [False, True], ids=["perfect", "imperfect"])
def test_gapped_coco_ids_of_the_validation_file_are_written(shapes, tmp_path, imperfect):
    """Labels follow the training file's ids (1..9); the results carry the validation file's (13..90)."""
    task = DetectionTask.from_config(load_config("shapes-detect", coco_overrides(shapes, "val-gapped.json")))
    assert task.class_names == list(CLASSES)
    metrics, detections = saved_results(task, tmp_path / "d.json", imperfect)
    stats = pycocotools_stats(shapes / "annotations" / "val-gapped.json", tmp_path / "d.json")
    assert_same_numbers(metrics, stats)
    assert {d["category_id"] for d in detections} == set(GAPPED.values())
    assert task.category_ids == [GAPPED[name] for name in CLASSES]
    if not imperfect:
        assert stats[0] == pytest.approx(1.0)


@pytest.mark.parametrize("source", ["shapes", "coco gapped"])
def test_a_class_subset_out_of_order_keeps_the_files_ids(shapes, tmp_path, source):
    subset = ["star", "circle", "cross"]
    if source == "shapes":
        task, file, ids = shapes_task(shapes, "data.classes=[star, circle, cross]"), "val.json", dict(
            zip(CLASSES, CATEGORY_IDS, strict=True))
    else:
        overrides = [*coco_overrides(shapes, "val-gapped.json"), "data.classes=[star, circle, cross]"]
        task, file, ids = DetectionTask.from_config(load_config("shapes-detect", overrides)), "val-gapped.json", GAPPED
    assert task.class_names == subset
    for imperfect in (False, True):
        metrics, detections = saved_results(task, tmp_path / "d.json", imperfect)
        stats = pycocotools_stats(shapes / "annotations" / file, tmp_path / "d.json", [ids[n] for n in subset])
        assert_same_numbers(metrics, stats)
        assert (stats[0] == pytest.approx(1.0)) is not imperfect
        assert {d["category_id"] for d in detections} == {ids[name] for name in subset}
    assert task.category_ids == [ids[name] for name in subset]


def yolo_task(shapes: Path, *overrides: str, path: str = "shapes.data") -> DetectionTask:
    return shapes_task(shapes, "data.name=yolo", f"data.path={shapes / path}", *overrides)


def assert_same_summary(metrics: dict, stats: np.ndarray) -> None:
    """All 12 numbers, the area ranges' included (bigbatch leaves out what pycocotools says is -1)."""
    for key, value in zip(SUMMARY_KEYS, stats, strict=True):
        if value == -1:
            assert key not in metrics, key
        else:
            assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_a_yolo_set_without_a_coco_file_numbers_images_by_place_and_classes_by_index_plus_one(shapes, tmp_path):
    task = yolo_task(shapes, "data.annotations=null")
    assert task.class_names == list(CLASSES) and task.category_ids is None
    assert "image id = place in the image list, category id = class index + 1" in task.predictions_note
    assert "data.annotations" in task.predictions_note
    metrics, detections = saved_results(task, tmp_path / "d.json")
    assert {d["category_id"] for d in detections} == {1, 2, 3, 4, 5}
    assert [c["id"] for c in task.ground_truth["categories"]] == [1, 2, 3, 4, 5]
    assert [i["id"] for i in task.ground_truth["images"]] == list(range(8))  # places in val.txt
    assert metrics["mAP"] == pytest.approx(1.0)


@pytest.mark.parametrize("imperfect", [False, True], ids=["perfect", "imperfect"])
@pytest.mark.parametrize("path", ["shapes.data", "."], ids=["data file", "folder"])
def test_a_yolo_run_of_a_generated_set_scores_against_the_val_json_beside_it(shapes, tmp_path, imperfect, path):
    """``data.annotations: auto`` takes the set's own annotations/val.json: pycocotools accepts the saved file
    against it and gives bigbatch's 12 numbers, small / medium / large included (8 of the 28 objects lie in
    another area range by their box than by their mask)."""
    task = yolo_task(shapes, path=path)
    val_json = shapes / "annotations" / "val.json"
    metrics, detections = saved_results(task, tmp_path / "d.json", imperfect)
    stats = pycocotools_stats(val_json, tmp_path / "d.json")  # "Results do not correspond to current coco set"
    assert_same_summary(metrics, stats)
    assert task.ids_from == str(val_json) and task.predictions_note == f"image and category ids of {val_json}"
    val = json.loads(val_json.read_text())
    assert {d["image_id"] for d in detections} == {i["id"] for i in val["images"]} == set(range(33, 41))
    assert {d["category_id"] for d in detections} == set(CATEGORY_IDS)
    if imperfect:
        assert 0.2 < stats[0] < 0.9 and not np.isclose(stats[3], stats[4])
    else:
        assert stats[0] == pytest.approx(1.0)


def test_a_yolo_ground_truth_takes_each_objects_box_and_area_from_the_coco_file(shapes):
    """COCO's area is the mask's: each object's is the file's, not its box's (w x h)."""
    task = yolo_task(shapes)
    val = json.loads((shapes / "annotations" / "val.json").read_text())

    def objects(annotations: list[dict]) -> list[tuple]:
        return sorted((a["image_id"], a["category_id"], *np.round(a["bbox"], 3), round(a["area"], 3))
                      for a in annotations)

    assert objects(task.ground_truth["annotations"]) == objects(val["annotations"])
    assert sum(a["area"] < 0.9 * a["bbox"][2] * a["bbox"][3] for a in val["annotations"]) > 10
    without = yolo_task(shapes, "data.annotations=null").ground_truth["annotations"]
    assert all(a["area"] == pytest.approx(a["bbox"][2] * a["bbox"][3]) for a in without)


def test_a_yolo_class_subset_takes_the_ids_of_a_coco_file_given(shapes, tmp_path):
    """``data.annotations`` names a file: categories by name (gapped ids, another order, one more category)."""
    subset = ["star", "circle", "cross"]
    gapped = shapes / "annotations" / "val-gapped.json"
    task = yolo_task(shapes, "data.classes=[star, circle, cross]", f"data.annotations={gapped}")
    assert task.class_names == subset and task.category_ids == [GAPPED[name] for name in subset]
    for imperfect in (False, True):
        metrics, detections = saved_results(task, tmp_path / "d.json", imperfect)
        stats = pycocotools_stats(gapped, tmp_path / "d.json", [GAPPED[name] for name in subset])
        assert_same_summary(metrics, stats)
        assert (stats[0] == pytest.approx(1.0)) is not imperfect
        assert {d["category_id"] for d in detections} == {GAPPED[name] for name in subset}


def test_eval_command_writes_the_annotation_files_ids(shapes, tmp_path, monkeypatch):
    """The real ``eval --save-detections``: its file scores 1.0 against the set's own annotation file, as its
    own record says, and the printed line says whose ids it holds."""
    overrides = [f"data.path={shapes}", "eval.batch=4"]
    cfg = load_config("shapes-detect", overrides)
    monkeypatch.setattr(DetectionTask, "build_model", lambda self, cfg: GroundTruthDetector(self, cfg.eval.batch))
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    weights = {"weight": torch.zeros(1)}
    torch.save({"step": 0, "model": weights, "config": cfg.model_dump(mode="json")}, checkpoint)
    saved = tmp_path / "detections.json"
    result = run_main("eval", str(tmp_path / "run"), "--save-detections", str(saved))
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "run" / "eval-last.json").read_text())
    stats = pycocotools_stats(shapes / "annotations" / "val.json", saved)
    assert record["mAP"] == pytest.approx(1.0) and stats[0] == pytest.approx(1.0)
    assert {d["category_id"] for d in json.loads(saved.read_text())} == set(CATEGORY_IDS)
    assert f"detections written to {saved} (COCO results format, category ids of the annotation file)" in result.stdout


def test_the_detections_of_a_yolo_training_run_score_against_the_sets_val_json(shapes, tmp_path):
    """The whole path of a user's first day: ``data shapes --format yolo``, a YOLO run of a Darknet network (2 steps),
    ``eval --save-detections``; pycocotools scores the file against the set's val.json with the numbers of eval's own
    record, all 12 of them."""
    out, saved = tmp_path / "run", tmp_path / "detections.json"
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(out), "--set", "data.name=yolo",
                      f"data.path={shapes / 'shapes.data'}", "steps=2", "batch=8", "data.size=64", "data.workers=0",
                      "eval.every=100", "checkpoint.every=2", "log.tensorboard=false")
    assert result.returncode == 0, result.stderr[-2000:]
    result = run_main("eval", str(out), "--save-detections", str(saved))
    assert result.returncode == 0, result.stderr[-2000:]
    val_json = shapes / "annotations" / "val.json"
    assert f"(COCO results format, image and category ids of {val_json})" in result.stdout
    detections = json.loads(saved.read_text())
    assert len(detections) > 100
    stats = pycocotools_stats(val_json, saved)
    assert stats[8] > 0  # AR100: some detections match objects, so the ids and boxes were understood
    assert_same_summary(json.loads((out / "eval-last.json").read_text()), stats)
