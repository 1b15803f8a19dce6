"""Detection end to end through the real CLI: the generated shapes set, a short training run of the
``shapes-detect`` recipe, COCO evaluation checked against pycocotools on the generator's own annotation file,
bad data in both modes, exact resume with augmentation and multi-scale, and evaluation sharded over two
torchrun processes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from tests.helpers import HANG_GUARD_S, clean_env, once_per_session, run_cli, run_main, standalone

IMAGES = 500
SHORT = ["steps=100", "optim.lr=0.005", "schedule.warmup=[{kind: linear, length: 20, start_factor: 0.02}]",
         "eval.every=100", "checkpoint.every=50", "log.tensorboard=false", "log.every=50", "memory.interval=1"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes") / "set"
    result = run_main("data", "shapes", "--out", str(root), "--images", str(IMAGES), "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "400 train images" in result.stdout and "100 val images" in result.stdout
    return root


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One 100-step run for the session, whichever workers take its three tests, on its own copy of the set."""
    def train(folder: Path) -> subprocess.CompletedProcess:
        result = run_main("data", "shapes", "--out", str(folder / "set"), "--images", str(IMAGES), "--seed", "3")
        assert result.returncode == 0, result.stderr
        return run_main("train", "shapes-detect", "--out", str(folder / "run"), "--set", f"data.path={folder / 'set'}",
                        *SHORT)

    folder, result = once_per_session(tmp_path_factory, "shapes-short-run", train)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "run", folder / "set", result


def test_short_shapes_run_learns_and_reports_coco_metrics(short_run):
    out, _, result = short_run
    final = [r for r in records(out) if r.get("split") == "val"][-1]
    assert final["step"] == 100 and final["images"] == 100
    assert final["mAP50"] > 0.03, "an untrained detector scores 0.0 here"
    assert {"mAP", "mAP75", "mAP_small", "AP/circle", "AP50/star"} <= final.keys()
    assert " mean average precision (mAP@0.50) = " in result.stdout
    assert "mAP@[.5:.95]" in result.stdout and "circle" in result.stdout
    assert (out / "checkpoints" / "best.pt").is_file()


def test_saved_detections_score_the_same_with_pycocotools(short_run, tmp_path):
    out, shapes, _ = short_run
    saved = tmp_path / "detections.json"
    result = run_main("eval", str(out), "--save-detections", str(saved))
    assert result.returncode == 0, result.stderr
    ours = json.loads((out / "eval-last.json").read_text())
    final = [r for r in records(out) if r.get("split") == "val"][-1]
    assert ours["mAP"] == pytest.approx(final["mAP"], abs=1e-9), "eval reproduces the training's evaluation"
    # The oracle: pycocotools on the generator's own annotation file (its category ids, not ours).
    ground_truth = COCO(str(shapes / "annotations" / "val.json"))
    detections = json.loads(saved.read_text())  # the file's own category ids (1, 3, ...), scored as they are
    assert {d["category_id"] for d in detections} <= set(ground_truth.getCatIds())
    evaluator = COCOeval(ground_truth, ground_truth.loadRes(detections), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    assert ours["mAP"] == pytest.approx(evaluator.stats[0], abs=1e-6)
    assert ours["mAP50"] == pytest.approx(evaluator.stats[1], abs=1e-6)


def test_predict_on_the_validation_images_scores_what_eval_scores(short_run, tmp_path):
    """``bigbatch predict`` on the validation files, at eval's thresholds, batch and order, written as COCO results
    with the annotation file's ids and scored by faster-coco-eval: eval's mAP within 1e-6."""
    from faster_coco_eval import COCO as FasterCOCO
    from faster_coco_eval import COCOeval_faster

    from bigbatch.models.detectors import SCORE_THRESH

    out, shapes, _ = short_run
    annotations = shapes / "annotations" / "val.json"
    listing = tmp_path / "val.txt"  # the annotation file's order, which eval's records keep
    listing.write_text("".join(f"{shapes / 'val' / image['file_name']}\n"
                               for image in json.loads(annotations.read_text())["images"]))
    results = tmp_path / "predicted.json"
    result = run_main("predict", str(listing), "--from", str(out), "--out", str(tmp_path / "pred"), "--coco",
                      str(results), "--annotations", str(annotations), "--conf", str(SCORE_THRESH))
    assert result.returncode == 0, result.stderr
    assert "100 images in" in result.stdout
    ours = json.loads((out / "eval-last.json").read_text()) if (out / "eval-last.json").is_file() else None
    if ours is None:
        assert run_main("eval", str(out)).returncode == 0
        ours = json.loads((out / "eval-last.json").read_text())
    truth = FasterCOCO(str(annotations))
    evaluator = COCOeval_faster(truth, truth.loadRes(str(results)), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    assert ours["mAP"] > 0.01
    assert evaluator.stats[0] == pytest.approx(ours["mAP"], abs=1e-6)
    assert evaluator.stats[1] == pytest.approx(ours["mAP50"], abs=1e-6)
    lines = (tmp_path / "pred" / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 100 and json.loads(lines[0])["file"].endswith(".jpg")


def broken_copy(shapes: Path, root: Path) -> tuple[Path, str, str, str]:
    """The set with a truncated val JPEG, a missing train image and a train box of negative width; and 50 train
    JPEGs truncated after their header, found only when a training step decodes them."""
    root = shutil.copytree(shapes, root)
    corrupt = sorted((root / "val").glob("*.jpg"))[0]
    corrupt.write_bytes(corrupt.read_bytes()[:300])
    for train_jpeg in sorted((root / "train").glob("*.jpg"))[100:150]:
        train_jpeg.write_bytes(train_jpeg.read_bytes()[: len(train_jpeg.read_bytes()) * 6 // 10])
    train_json = root / "annotations" / "train.json"
    data = json.loads(train_json.read_text())
    missing = root / "train" / data["images"][5]["file_name"]
    missing.unlink()
    data["annotations"][0]["bbox"][2] = -4
    train_json.write_text(json.dumps(data))
    return root, str(corrupt), str(missing), str(train_json)


def test_bad_data_is_reported_and_skipped_or_stops_in_strict_mode(shapes, tmp_path):
    root, corrupt, missing, train_json = broken_copy(shapes, tmp_path / "broken")
    settings = ["--set", f"data.path={root}", "steps=2", "eval.every=2", "log.tensorboard=false"]
    # A real process: its DataLoader worker, a child, prints the warnings of what it decodes to the stderr it inherits.
    lenient = run_cli("train", "shapes-detect", "--out", str(tmp_path / "lenient"), *settings, "data.workers=1")
    assert lenient.returncode == 0, lenient.stderr[-2000:]
    warnings = [line for line in lenient.stderr.splitlines() if line.startswith("warning: ")]
    assert any(missing in w for w in warnings)
    assert any(train_json in w and "annotation #0" in w for w in warnings)
    assert any(corrupt in w for w in warnings)
    # The summary at the end counts what was found while loading (a missing image and a bad box), and the
    # corrupt JPEGs found while decoding: in evaluation, and in training by the DataLoader's worker process.
    replaced = {w.split(": ")[1] for w in warnings if "the next readable sample is used instead" in w}
    assert replaced and all("/train/" in path for path in replaced), "training met some of the 50 corrupt JPEGs"
    summaries = [line for line in lenient.stdout.splitlines() if line.startswith("data: ")]
    assert summaries[0] == "data: 3 problems in 3 files: 2 images and 1 box skipped"  # found while loading
    problems, images = 3 + len(replaced), "images" if len(replaced) > 1 else "image"
    assert summaries[-1] == (f"data: {problems} problems in {problems} files: 2 images and 1 box skipped; "
                             f"{len(replaced)} {images} replaced"), lenient.stdout[-3000:]

    strict = run_main("train", "shapes-detect", "--out", str(tmp_path / "strict"), *settings, "data.strict=true")
    assert strict.returncode == 2
    assert strict.stderr.startswith("error: data: ") and strict.stderr.count("\n") == 1
    assert any(name in strict.stderr for name in (missing, train_json, corrupt))
    assert not (tmp_path / "strict" / "checkpoints").exists(), "nothing trained"


def test_resume_is_exact_with_augmentation_and_multiscale(shapes, tmp_path):
    settings = [f"data.path={shapes}", "data.crop=true", "data.color_jitter=0.4", "data.multiscale.sizes=[96, 128]",
                "data.multiscale.every=1", "data.multiscale.final=0", "schedule.warmup=[]",
                "schedule.decay={kind: constant}", "batch=8",
                "eval.every=100", "checkpoint.every=2", "log.tensorboard=false"]
    whole = run_main("train", "shapes-detect", "--out", str(tmp_path / "whole"), "--set", *settings, "steps=4")
    assert whole.returncode == 0, whole.stderr[-2000:]
    part = run_main("train", "shapes-detect", "--out", str(tmp_path / "part"), "--set", *settings, "steps=2")
    assert part.returncode == 0, part.stderr[-2000:]
    resumed = run_main("train", "--resume", str(tmp_path / "part"), "--set", "steps=4")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "part" / "checkpoints" / "last.pt", weights_only=True)["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_evaluation_sharded_over_two_processes_equals_one(shapes, tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT

    out = tmp_path / "two"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *standalone(),
               "-m", "bigbatch", "train", "shapes-detect", "--out", str(out),
               "--set", f"data.path={shapes}", "steps=2", "eval.every=2", "eval.batch=1", "log.tensorboard=false",
               "norm.sync=bigbatch"]
    result = subprocess.run(command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-3000:]
    final = [r for r in records(out) if r.get("split") == "val"][-1]
    assert final["images"] == 100
    single = run_main("eval", str(out))  # eval.batch=1 from the run's config: no batch padding differs
    assert single.returncode == 0, single.stderr
    alone = json.loads((out / "eval-last.json").read_text())
    for key in ("mAP", "mAP50", "mAP75"):
        assert alone[key] == pytest.approx(final[key], abs=1e-9), key


def test_plan_measures_the_largest_detection_input(shapes):
    """``bigbatch plan`` measures a micro-batch of the largest multi-scale size, longer side at its cap."""
    from bigbatch.config import load_config
    from bigbatch.tasks import build_task

    cfg = load_config("shapes-detect", [f"data.path={shapes}", "data.multiscale.sizes=[96, 160]"])
    task = build_task(cfg)
    images, targets = task.synthetic_batch(cfg, 2, torch.device("cpu"))
    assert [tuple(image.shape) for image in images] == [(3, 160, 200)] * 2  # 160 x 160 / 128 (max_size / size)
    terms = task.loss(task.build_model(cfg).train(), (images, targets))
    assert terms and all(name.startswith("loss_") and torch.isfinite(value) for name, value in terms.items())


def write_yolo_copy(shapes: Path, root: Path) -> Path:
    """The shapes set in Ultralytics' YOLO layout: images/{train,val}, labels/{train,val}, classes.txt."""
    names = None
    for split in ("train", "val"):
        data = json.loads((shapes / "annotations" / f"{split}.json").read_text())
        ids = sorted(c["id"] for c in data["categories"])
        names = [next(c["name"] for c in data["categories"] if c["id"] == i) for i in ids]
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        lines: dict[int, list[str]] = {image["id"]: [] for image in data["images"]}
        sizes = {image["id"]: (image["width"], image["height"]) for image in data["images"]}
        for a in data["annotations"]:
            (x, y, w, h), (width, height) = a["bbox"], sizes[a["image_id"]]
            lines[a["image_id"]].append(f"{ids.index(a['category_id'])} {(x + w / 2) / width:.6f} "
                                        f"{(y + h / 2) / height:.6f} {w / width:.6f} {h / height:.6f}")
        for image in data["images"]:
            shutil.copy(shapes / split / image["file_name"], root / "images" / split / image["file_name"])
            label = (root / "labels" / split / image["file_name"]).with_suffix(".txt")
            label.write_text("\n".join(lines[image["id"]]) + "\n")
    (root / "classes.txt").write_text("\n".join(names) + "\n")
    return root


def test_yolo_folder_trains_and_evaluates_every_val_image(shapes, tmp_path):
    root = write_yolo_copy(shapes, tmp_path / "yolo")
    out = tmp_path / "run"
    result = run_main("train", "shapes-detect", "--out", str(out), "--set", "data.name=yolo", f"data.path={root}",
                      "steps=2", "eval.every=2", "log.tensorboard=false", "data.classes=[star, circle]")
    assert result.returncode == 0, result.stderr[-2000:]
    final = [r for r in records(out) if r.get("split") == "val"][-1]
    assert final["images"] == 100
    assert {k for k in final if k.startswith("AP/")} <= {"AP/star", "AP/circle"}
    assert "star" in result.stdout and "square" not in result.stdout


def test_megdet_recipe_shows_without_the_data():
    result = run_main("show", "configs/megdet-r50-fpn.yaml")
    assert result.returncode == 0, result.stderr
    assert "fasterrcnn_resnet50_fpn" in result.stdout and "sync: bigbatch" in result.stdout
    assert "epochs          11.00 (of 118287 training images)" in result.stdout


@pytest.mark.parametrize(("overrides", "message"), [
    (["task=detection"], "error: data.name: 'digits' is not a detection dataset; expected shapes, coco or yolo"),
    (["task=detection", "data.name=shapes"], "error: model.name: 'small_cnn' is not a detector (task: detection)"),
    (["task=detection", "data.name=shapes", "model.name=small_detector", "eval.metric=top1"],
     "error: eval.metric: 'top1' is not a detection metric"),
    (["task=detection", "data.name=shapes", "model.name=small_detector", "data.multiscale.sizes=[100]"],
     "error: data.multiscale.sizes.0: input should be a multiple of 32"),
])
def test_detection_config_mistakes_name_the_field(overrides, message):
    from bigbatch.config import load_config
    from bigbatch.errors import UserError

    with pytest.raises(UserError) as caught:
        load_config("digits", overrides)
    assert f"error: {caught.value}".startswith(message), str(caught.value)


def test_coco_splits_not_given_are_named_by_a_run_not_by_show(capsys, no_training):
    """``show`` plans a COCO config before its paths are set (its epochs unknown); ``train`` names the key."""
    from bigbatch.cli import main

    settings = ["--set", "task=detection", "data.name=coco", "model.name=small_detector", "eval.metric=mAP",
                "schedule.warmup=[]",
                "steps=10"]
    assert main(["show", "digits", *settings]) == 0
    assert "epochs          unknown" in capsys.readouterr().out
    assert main(["train", "digits", *settings]) == 2
    assert capsys.readouterr().err.startswith("error: data.train: missing; coco needs data.train.images and "
                                              "data.train.annotations")


def test_coco_paths_that_do_not_exist_are_named(tmp_path):
    result = run_main("train", "megdet-r50-fpn", "--out", str(tmp_path / "run"), "--set", "steps=1",
                      f"data.train.images={tmp_path}", f"data.train.annotations={tmp_path / 'nope.json'}")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: data.train.annotations: {tmp_path / 'nope.json'} does not exist")
