"""``bigbatch predict`` and ``bigbatch.load`` on a classifier's run: top-1 equal to ``eval``'s, the same answer for an
image given as a path, a PIL image, an array or a tensor, every output, the refusals, and the Python example of
docs/usage.md run as it is written. (A detector's predictions against ``eval``'s mAP: tests/tasks/
test_detection_train.py; against Darknet's ``detector test``: benchmarks/darknet_predict.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import ROOT, colour, run_main, write_photo_folder, write_video

TINY = ["batch=8", "subdivisions=2", "steps=4", "data.size=32", "eval.every=4", "checkpoint.every=4",
        "log.tensorboard=false", "model.width=4", "schedule.warmup=[]", "eval.batch=5"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> tuple[Path, Path]:
    """(a run of the digits CNN on a folder of JPEGs, the folder)."""
    root = tmp_path_factory.mktemp("predict")
    photos = write_photo_folder(root / "photos")
    out = root / "run"
    result = run_main("train", "digits", "--out", str(out), "--set", "data.name=folder", f"data.path={photos}",
                      *TINY)
    assert result.returncode == 0, result.stderr[-2000:]
    return out, photos


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_top1_on_the_validation_folder_is_evals(classifier, tmp_path):
    run, photos = classifier
    result = run_main("predict", str(photos / "val"), "--from", str(run), "--out", str(tmp_path / "pred"),
                      "--top-k", "2")
    assert result.returncode == 0, result.stderr
    found = records(tmp_path / "pred")
    assert len(found) == 12 and all(len(r["top"]) == 2 for r in found)
    assert [r["file"] for r in found] == sorted(r["file"] for r in found)  # the folder's listing order
    hits = sum(r["top"][0]["class_name"] == Path(r["file"]).parent.name for r in found)
    assert run_main("eval", str(run)).returncode == 0
    evaluated = json.loads((run / "eval-last.json").read_text())
    assert 100.0 * hits / len(found) == pytest.approx(evaluated["top1"], abs=1e-9)
    assert re.search(r"^12 images in [\d.]+ s \([\d.]+ images/s\); written: .*predictions.jsonl$", result.stdout,
                     re.M), result.stdout


def test_an_image_as_a_path_pil_image_array_or_tensor_gets_the_same_record(classifier):
    import bigbatch

    run, photos = classifier
    path = sorted((photos / "val" / "flower").glob("*.jpg"))[0]
    model = bigbatch.load(run, device="cpu")
    assert model.task == "classification" and model.classes == ["china", "flower", "upside_down"]
    assert isinstance(model.module, torch.nn.Module)
    pil = Image.open(path)
    array = np.array(pil.convert("RGB"))
    tensor = torch.from_numpy(array).permute(2, 0, 1)
    found = model.predict([str(path), pil, array, tensor], top_k=3)
    assert found[0]["file"] == str(path) and all(r["file"] is None for r in found[1:])
    first = [t["probability"] for t in found[0]["top"]]
    for record in found[1:]:
        assert [t["class_id"] for t in record["top"]] == [t["class_id"] for t in found[0]["top"]]
        assert [t["probability"] for t in record["top"]] == pytest.approx(first, abs=1e-6)
        assert (record["width"], record["height"]) == pil.size
    assert model.transform(tensor)[0].shape == (3, 32, 32)


def test_a_float_array_predicts_as_the_float_tensor_and_other_dtypes_are_refused(classifier):
    """A float numpy image in [0, 1] is scaled as a float tensor is (it was cast to uint8 by truncation: all black);
    uint16, int and bool arrays are refused naming their dtype (a cast wrapped or darkened them)."""
    import bigbatch
    from bigbatch.errors import UserError
    from bigbatch.inference.predictor import as_item

    run, photos = classifier
    path = sorted((photos / "val" / "flower").glob("*.jpg"))[0]
    array = np.array(Image.open(path).convert("RGB"))
    floats = array / 255.0  # float64, as skimage and `img / 255` give
    assert torch.equal(as_item(floats).pixels, as_item(array).pixels)
    assert torch.equal(as_item(floats.astype(np.float32)).pixels, as_item(torch.from_numpy(array).permute(2, 0, 1)
                                                                          .float() / 255).pixels)
    assert torch.equal(as_item(np.full((4, 4, 3), 1.5)).pixels, torch.full((3, 4, 4), 255, dtype=torch.uint8))
    model = bigbatch.load(run, device="cpu")
    from_floats, from_tensor, from_bytes = model.predict([floats, torch.from_numpy(floats).permute(2, 0, 1), array],
                                                         top_k=3)
    assert from_floats == from_tensor == from_bytes
    for bad in (array.astype(np.uint16) * 257, array.astype(np.int64), array > 127):
        with pytest.raises(UserError, match=rf"must be uint8 \(0-255\) or float in \[0, 1\], got {bad.dtype}"):
            model.predict([bad])


def test_outputs_unreadable_images_and_a_second_predict_into_the_same_folder(classifier, tmp_path):
    run, photos = classifier
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    listing = tmp_path / "list.txt"
    china = sorted((photos / "val" / "china").glob("*"))[0]
    listing.write_text(f"# two images and a broken one\n{broken}\n\n{china}\n")
    out = tmp_path / "pred"
    result = run_main("predict", str(listing), str(photos / "val" / "flower" / "000.jpg"), "--from", str(run),
                      "--out", str(out), "--save-images")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(str(broken)) == 1 and "skipped" in result.stderr
    assert "2 images in" in result.stdout and "1 unreadable, skipped" in result.stdout
    assert "; 3 files\n" in result.stdout  # the listed two and the image named
    one = run_main("predict", str(china), "--from", str(run), "--out", str(tmp_path / "one"))
    assert "; 1 file\n" in one.stdout and "\n1 image in " in one.stdout, one.stdout
    assert sorted(p.name for p in (out / "images").iterdir()) == ["000.jpg", "000_2.jpg"]
    assert Image.open(out / "images" / "000.jpg").size == Image.open(photos / "val" / "china" / "000.jpg").size
    again = run_main("predict", str(photos / "val" / "flower"), "--from", str(run), "--out", str(out))
    assert again.returncode == 0, again.stderr  # an earlier predict's folder: its files replaced
    assert not (out / "images").exists() and len(records(out)) == 3


@pytest.mark.parametrize(("args", "message"), [
    (["nowhere/*.jpg"], "nowhere/*.jpg matches no file"),
    (["missing.jpg"], "missing.jpg does not exist"),
    (["{empty}"], "names no image or video file"),
    (["{photos}/val", "--txt"], "--txt: writes detections; the model is a classifier"),
    (["{photos}/val", "--conf", "1.5"], "--conf: expected a number in [0, 1], got 1.5"),
    (["{photos}/val", "--weights", "x.weights"], "--weights: for a Darknet .cfg"),
    (["{photos}/val", "--from", "model.onnx"], "--from: model.onnx does not exist"),
    (["{photos}/val", "--from", "{empty}/notes.txt"], "--from: "),  # not a checkpoint: named as given, not checkpoint:
    (["{photos}/val", "--device", "cuda:7"], "--device: cuda:7 is not on this machine"),
    (["{photos}/val", "--device", "toaster"], "--device: 'toaster' is not a device"),
    (["{photos}/val", "--device", "meta"], "--device: meta is not a device bigbatch predicts on (cpu, cuda"),
    (["{photos}/val", "--device", "mps"], "--device: mps is not a device bigbatch predicts on"),
    (["{photos}/val", "--coco", "{photos}/val/china/000.jpg"], "--coco: "),
])
def test_mistakes_are_one_line_naming_the_option(classifier, tmp_path, args, message):
    run, photos = classifier
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image\n")
    args = [a.format(photos=photos, empty=tmp_path / "empty") for a in args]
    given = ["--from", str(run)] if "--from" not in args else []
    result = run_main("predict", *args, *given, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_out_folder_with_files_of_the_users_is_refused_and_left_alone(classifier, tmp_path):
    run, photos = classifier
    out = tmp_path / "mine"
    out.mkdir()
    (out / "predictions.jsonl").write_text("my own notes\n")
    result = run_main("predict", str(photos / "val"), "--from", str(run), "--out", str(out))
    assert result.returncode == 2 and "did not write" in result.stderr
    assert (out / "predictions.jsonl").read_text() == "my own notes\n"


def test_import_bigbatch_loads_no_torch_and_load_comes_on_first_use():
    code = ("import sys, bigbatch; assert 'torch' not in sys.modules, 'torch imported'; "
            "load = bigbatch.load; assert 'torch' in sys.modules; print(load.__module__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "bigbatch.inference.loading"


def test_the_python_example_of_the_usage_doc_runs_as_written(tmp_path, monkeypatch, capsys):
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text[text.index("## Using a trained model"):]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'bigbatch.load("runs/digits")' in example
    result = run_main("train", "digits", "--out", str(tmp_path / "runs" / "digits"), "--set", "steps=2",
                      "batch=64", "subdivisions=1", "log.tensorboard=false", "eval.every=2", "checkpoint.every=2",
                      "schedule.warmup=[]")
    assert result.returncode == 0, result.stderr[-2000:]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/usage.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("0 {'class_id': ") and "'probability': " in printed[0]
    assert printed[1] == "SmallCNN ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'] classification"


def test_sources_skip_what_is_no_regular_file_refuse_cycles_and_bound_lists(tmp_path, monkeypatch):
    import os

    from bigbatch.errors import UserError
    from bigbatch.inference import sources

    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(folder / "sub" / "a.png")
    os.mkfifo(folder / "pipe.jpg")
    (folder / "notes.txt").write_text("not listed\n")
    warned: list[str] = []
    found = sources.expand_sources([str(folder)], warned.append)
    assert [f.path for f in found] == [str(folder / "sub" / "a.png")]
    assert warned == [f"{folder / 'pipe.jpg'}: not a regular file: skipped"]
    (folder / "sub" / "loop").symlink_to(folder)
    with pytest.raises(UserError, match="a cycle of links"):
        sources.expand_sources([str(folder)], warned.append)
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{folder / 'sub' / 'a.png'}\n" for _ in range(4)))
    monkeypatch.setattr(sources, "MAX_LISTED", 3)
    with pytest.raises(UserError, match=r"list.txt:4: more than 3 lines"):
        sources.expand_sources([str(listing)], warned.append)


def test_a_video_is_predicted_frame_by_frame_and_without_pyav_is_one_line(classifier, tmp_path, monkeypatch):
    run, photos = classifier
    clip = tmp_path / "clip.mp4"
    write_video(clip, [colour(i) for i in range(5)])
    out = tmp_path / "pred"
    image = str(photos / "val" / "china" / "000.jpg")
    result = run_main("predict", image, str(clip), "--from", str(run), "--out", str(out), "--vid-stride", "2",
                      "--save-images")
    assert result.returncode == 0, result.stderr
    found = records(out)
    assert [(Path(r["file"]).name, r["frame"]) for r in found] == [("000.jpg", None), ("clip.mp4", 0),
                                                                   ("clip.mp4", 2), ("clip.mp4", 4)]
    assert sorted(p.name for p in (out / "images").iterdir()) == ["000.jpg", "clip_0.jpg", "clip_2.jpg", "clip_4.jpg"]
    monkeypatch.setitem(sys.modules, "av", None)  # PyAV not installed
    missing = run_main("predict", str(clip), "--from", str(run), "--out", str(tmp_path / "other"))
    assert missing.returncode == 2
    assert missing.stderr == "error: video input needs the optional 'video' extra: pip install 'bigbatch[video]'\n"


def test_a_darknet_cfg_with_its_weights_and_names_and_a_checkpoint_file(classifier, tmp_path):
    """``--from NET.cfg --weights --names``: detections in the image's pixels, as YOLO labels and COCO results; and a
    run's checkpoint file in place of its directory."""
    from bigbatch.config import RECIPES_DIR

    cfg = RECIPES_DIR / "yolov3-tiny-shapes.cfg"
    weights = tmp_path / "net.weights"
    assert run_main("export", str(cfg), "--darknet-weights", str(weights), "--seed", "1").returncode == 0
    (tmp_path / "shapes.names").write_text("circle\nsquare\ntriangle\nstar\ncross\n")
    (tmp_path / "shapes.data").write_text("classes = 5\nnames = shapes.names\n")
    image = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 90, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "pred"
    result = run_main("predict", str(image), "--from", str(cfg), "--weights", str(weights), "--names",
                      str(tmp_path / "shapes.data"), "--size", "64", "--conf", "0.01", "--out", str(out), "--txt",
                      "--coco", str(tmp_path / "results.json"))
    assert result.returncode == 0, result.stderr
    [record] = records(out)
    assert (record["width"], record["height"]) == (90, 40) and record["detections"], record
    for found in record["detections"]:
        x1, y1, x2, y2 = found["box"]
        assert 0 <= x1 <= x2 <= 90 and 0 <= y1 <= y2 <= 40 and found["score"] >= 0.01
        assert found["class_name"] == ["circle", "square", "triangle", "star", "cross"][found["class_id"]]
    labels = (out / "labels" / "wide.txt").read_text().splitlines()
    assert len(labels) == len(record["detections"]) and all(len(line.split()) == 5 for line in labels)
    coco = json.loads((tmp_path / "results.json").read_text())
    assert {r["image_id"] for r in coco} == {0} and {r["category_id"] for r in coco} <= {1, 2, 3, 4, 5}
    run, photos = classifier
    from_file = run_main("predict", str(photos / "val" / "china"), "--from", str(run / "checkpoints" / "last.pt"),
                         "--out", str(tmp_path / "from-file"))
    assert from_file.returncode == 0, from_file.stderr
    assert len(records(tmp_path / "from-file")) == 3


def test_the_pjreddie_dialect_follows_its_detector_test_and_run_options_are_refused_for_a_cfg(tmp_path):
    import bigbatch
    from bigbatch.config import RECIPES_DIR
    from bigbatch.errors import UserError

    cfg = RECIPES_DIR / "yolov4-tiny-shapes.cfg"  # nms_kind=greedynms, no letter_box
    weights = tmp_path / "net.weights"
    assert run_main("export", str(cfg), "--darknet-weights", str(weights)).returncode == 0
    alexeyab = bigbatch.load(cfg, weights=weights, size=64, device="cpu")
    assert (alexeyab.pipeline.letter, alexeyab.pipeline.nms_kind, alexeyab.settings.conf) == (False, "greedynms", 0.25)
    pjreddie = bigbatch.load(cfg, weights=weights, size=64, device="cpu", dialect="pjreddie")
    assert (pjreddie.pipeline.letter, pjreddie.pipeline.nms_kind, pjreddie.settings.conf) == (True, "default", 0.5)
    with pytest.raises(UserError, match="--set: overrides a run's config"):
        bigbatch.load(cfg, weights=weights, overrides=["data.size=64"])
    with pytest.raises(UserError, match="--weights: a Darknet .cfg .* needs its weights"):
        bigbatch.load(cfg)


def test_a_checkpoint_whose_class_names_are_not_a_short_list_of_names_is_refused(classifier, tmp_path):
    import bigbatch
    from bigbatch.errors import UserError

    run, _ = classifier
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    for classes in (["a"] * (2**16 + 1), "abc", [1, 2, 3], []):
        torch.save({**state, "classes": classes}, tmp_path / "bad.pt")
        with pytest.raises(UserError, match="'classes' is not a list of 1 to 65,536 class names"):
            bigbatch.load(tmp_path / "bad.pt", device="cpu")


def test_predict_thresholds_hold_for_its_own_forward_only():
    """``predict``'s ``--conf``/``--iou``/``--max-det`` are set on the detector for its forward and put back after:
    a Python user who predicts and then evaluates or exports the same module gets the module's own (evaluation)
    thresholds, not predict's (they were once left written into the module)."""
    from bigbatch.data.transforms.det_transforms import eval_transform
    from bigbatch.inference.pipelines import EvalDetection, Settings, own_thresholds
    from bigbatch.models.detectors import build_detector

    torch.manual_seed(0)
    module = build_detector("small_detector", 3, min_size=64, max_size=64).eval()
    before = own_thresholds(module)
    pipeline = EvalDetection(eval_transform("letterbox", 64))
    image, geometry = pipeline.prepare(torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8))
    out = pipeline.run(module, [image], [geometry], Settings(conf=0.0, iou=0.3, max_det=3))
    assert len(out[0]["boxes"]) == 3  # predict's max_det held for the forward
    assert own_thresholds(module) == before and before["max_det"] != 3


def test_a_predict_stopped_by_ctrl_c_lists_what_it_wrote_and_the_next_predict_replaces_it(classifier, tmp_path,
                                                                                         monkeypatch):
    """Ctrl-C during ``predict``: the files written so far are finished and listed as predict's own, so
    the next ``predict`` to the folder replaces them (a list never closed is refused, as a kill -9 leaves it)."""
    from bigbatch.cli import main
    from bigbatch.inference import outputs as outputs_module

    run, photos = classifier
    out = tmp_path / "pred"
    added = outputs_module.Outputs.add

    def add_then_stop(self, record, pixels):
        added(self, record, pixels)
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs_module.Outputs, "add", add_then_stop)
    assert main(["predict", str(photos / "val"), "--from", str(run), "--out", str(out)]) != 0  # interrupted
    assert len(records(out)) == 1
    monkeypatch.setattr(outputs_module.Outputs, "add", added)
    again = run_main("predict", str(photos / "val" / "flower"), "--from", str(run), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert len(records(out)) == len(list((photos / "val" / "flower").iterdir()))
