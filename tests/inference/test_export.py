"""``bigbatch export --format onnx|torchscript|openvino``: the file is checked in its runtime before it is written,
carries what ``predict`` needs, and predicts as the PyTorch model does (a classifier's run, a Darknet detector's run
and cfg, raw or decoded with ``--postprocess``, FCOS whole); the refusals (an existing or misnamed file, an unknown
format, TensorRT without CUDA, ``--half`` without it, a missing extra, a failed check)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import run_main, write_photo_folder

SHORT = ["steps=2", "batch=16", "subdivisions=1", "log.tensorboard=false", "eval.every=2", "checkpoint.every=2",
         "schedule.warmup=[]"]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "digits"
    result = run_main("train", "digits", "--out", str(out), "--set", *SHORT, "data.size=16", "model.width=4")
    assert result.returncode == 0, result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return write_photo_folder(tmp_path_factory.mktemp("photos") / "set", train=1, val=1)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def same_records(a: list[dict], b: list[dict], tolerance: float = 1e-5) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if "top" in x:
            assert [t["class_id"] for t in x["top"]] == [t["class_id"] for t in y["top"]]
            assert [t["probability"] for t in x["top"]] == pytest.approx([t["probability"] for t in y["top"]],
                                                                         abs=tolerance)
        else:  # detections tied in score may come in either order: compared in one order
            def key(d):
                return -round(d["score"], 4), d["class_id"], [round(v, 1) for v in d["box"]]

            mine, theirs = sorted(x["detections"], key=key), sorted(y["detections"], key=key)
            assert [d["class_id"] for d in mine] == [d["class_id"] for d in theirs]
            for d, e in zip(mine, theirs, strict=True):
                assert d["box"] == pytest.approx(e["box"], abs=1e-2) and d["score"] == pytest.approx(e["score"],
                                                                                                      abs=tolerance)


@pytest.mark.parametrize("fmt", [pytest.param("onnx", marks=pytest.mark.slow), "torchscript", "openvino"])
def test_a_classifier_exports_checked_and_predicts_as_its_run(digits_run, photos, tmp_path, fmt):
    """(ONNX's dynamo export takes ~10 s on 2 cores: the suite exports to ONNX once, a Darknet run below.)"""
    if fmt != "torchscript":
        pytest.importorskip("onnxruntime" if fmt == "onnx" else "openvino")
    out = tmp_path / f"digits.{ {'openvino': 'xml'}.get(fmt, fmt)}"
    result = run_main("export", str(digits_run), "--format", fmt, "--out", str(out), "--check", "4")
    assert result.returncode == 0, result.stderr
    assert f"{fmt} written to {out}" in result.stdout and "checked in" in result.stdout
    expected = [out.name] if fmt != "openvino" else ["digits.bin", "digits.xml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == expected  # no temporary file left
    for source, folder in ((out, "exported"), (digits_run, "torch")):
        assert run_main("predict", str(photos / "val"), "--from", str(source), "--out",
                        str(tmp_path / folder)).returncode == 0
    same_records(records(tmp_path / "exported"), records(tmp_path / "torch"))
    again = run_main("export", str(digits_run), "--format", fmt, "--out", str(out))
    assert again.returncode == 2 and "exists" in again.stderr


def test_a_darknet_run_exports_to_onnx_and_predicts_as_itself(tmp_path):
    pytest.importorskip("onnxruntime")
    shapes = tmp_path / "shapes"
    assert run_main("data", "shapes", "--out", str(shapes), "--images", "10", "--format", "yolo").returncode == 0
    run = tmp_path / "yolo"
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(run), "--set", "data.name=yolo",
                      f"data.path={shapes / 'shapes.data'}", "data.size=64", "data.multiscale.sizes=null", "batch=4",
                      "eval.batch=4", *SHORT[:1], *SHORT[3:])
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / "yolo.onnx"
    exported = run_main("export", str(run), "--format", "onnx", "--out", str(out), "--check", "2")
    assert exported.returncode == 0, exported.stderr
    for source, folder in ((out, "exported"), (run, "torch")):
        assert run_main("predict", str(shapes / "val"), "--from", str(source), "--out", str(tmp_path / folder),
                        "--conf", "0.001").returncode == 0
    same_records(records(tmp_path / "exported"), records(tmp_path / "torch"))
    assert sum(len(r["detections"]) for r in records(tmp_path / "torch")) > 0
    if importlib.util.find_spec("openvino") is not None:  # the decoding in the graph, NMS outside it
        decoded = tmp_path / "decoded.xml"
        exported = run_main("export", str(run), "--format", "openvino", "--postprocess", "--out", str(decoded),
                            "--check", "2")
        assert exported.returncode == 0, exported.stderr
        assert run_main("predict", str(shapes / "val"), "--from", str(decoded), "--out", str(tmp_path / "decoded"),
                        "--conf", "0.001").returncode == 0
        same_records(records(tmp_path / "decoded"), records(tmp_path / "torch"))


def test_a_darknet_cfg_exports_with_its_detector_test_settings(tmp_path):
    from bigbatch.config import RECIPES_DIR

    cfg = RECIPES_DIR / "yolov4-tiny-shapes.cfg"
    weights = tmp_path / "net.weights"
    assert run_main("export", str(cfg), "--darknet-weights", str(weights), "--seed", "2").returncode == 0
    out = tmp_path / "net.torchscript"
    result = run_main("export", str(cfg), "--weights", str(weights), "--size", "64", "--format", "torchscript",
                      "--out", str(out), "--check", "2")
    assert result.returncode == 0, result.stderr
    assert "random images of 64x64" in result.stderr
    image = tmp_path / "photo.png"
    Image.new("RGB", (90, 50), (200, 120, 40)).save(image)
    for source, extra, folder in ((out, [], "exported"), (cfg, ["--weights", str(weights), "--size", "64"], "torch")):
        done = run_main("predict", str(image), "--from", str(source), *extra, "--conf", "0.01", "--out",
                        str(tmp_path / folder))
        assert done.returncode == 0, done.stderr
    same_records(records(tmp_path / "exported"), records(tmp_path / "torch"))
    decoded = tmp_path / "decoded.torchscript"
    result = run_main("export", str(cfg), "--weights", str(weights), "--size", "64", "--format", "torchscript",
                      "--postprocess", "--out", str(decoded), "--check", "2")
    assert result.returncode == 0, result.stderr
    done = run_main("predict", str(image), "--from", str(decoded), "--conf", "0.01", "--out", str(tmp_path / "dec"))
    assert done.returncode == 0, done.stderr
    same_records(records(tmp_path / "dec"), records(tmp_path / "torch"))


def test_refusals_a_misnamed_file_a_missing_extra_a_failed_check(digits_run, tmp_path, monkeypatch):
    from bigbatch.inference import export

    unknown = run_main("export", str(digits_run), "--format", "caffe", "--out", str(tmp_path / "m.caffe"))
    assert unknown.returncode == 2 and "invalid choice: 'caffe'" in unknown.stderr
    tensorrt = run_main("export", str(digits_run), "--format", "tensorrt", "--out", str(tmp_path / "m.engine"))
    assert tensorrt.returncode == 2 and tensorrt.stderr.startswith(
        "error: --format tensorrt: TensorRT engines are not written by this version yet: export --format onnx")
    wrong = run_main("export", str(digits_run), "--format", "onnx", "--out", str(tmp_path / "m.pt"))
    assert wrong.returncode == 2 and "*.onnx" in wrong.stderr
    alone = run_main("export", str(digits_run), "--out", str(tmp_path / "m.onnx"))
    assert alone.returncode == 2 and "--out: goes with --format" in alone.stderr
    half = run_main("export", str(digits_run), "--format", "onnx", "--half", "--out", str(tmp_path / "m.onnx"))
    assert half.returncode == 2 and half.stderr.startswith("error: --half: ") and "CUDA" in half.stderr
    decoded = run_main("export", str(digits_run), "--format", "torchscript", "--postprocess", "--out",
                       str(tmp_path / "m.torchscript"))
    assert decoded.returncode == 2 and "error: --postprocess: for a detector" in decoded.stderr
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    missing = run_main("export", str(digits_run), "--format", "onnx", "--out", str(tmp_path / "m.onnx"))
    assert missing.stderr == ("error: export --format onnx needs the optional 'export' extra: "
                              "pip install 'bigbatch[export]'\n")
    monkeypatch.setattr(export, "TOLERANCE", -1.0)  # every difference, even 0, is too large
    failed = run_main("export", str(digits_run), "--format", "torchscript", "--out", str(tmp_path / "m.torchscript"))
    assert failed.returncode == 1 and "more than -1: not written" in failed.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_torchvision_detector_exports_whole_and_predicts_as_itself_one_image_at_a_time(tmp_path):
    """FCOS (``small_detector``) with its decoding and NMS in the graph: ``predict --batch 1`` equal, its ``eval``
    at ``eval.batch=1`` equal; the same from TorchScript (scripted) and OpenVINO (converted from the ONNX file)."""
    pytest.importorskip("onnxruntime")
    shapes = tmp_path / "shapes"
    run = tmp_path / "fcos"
    result = run_main("train", "shapes-detect", "--out", str(run), "--set", f"data.path={shapes}",
                      "data.shapes_images=12", "data.size=64", "batch=4", "eval.batch=1", *SHORT[:1], *SHORT[3:])
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / "fcos.onnx"
    exported = run_main("export", str(run), "--format", "onnx", "--out", str(out), "--check", "3")
    assert exported.returncode == 0, exported.stderr
    assert "TorchScript-based exporter, opset 17" in exported.stdout
    for source, folder in ((out, "exported"), (run, "torch")):
        assert run_main("predict", str(shapes / "val"), "--from", str(source), "--out", str(tmp_path / folder),
                        "--conf", "0.01", "--batch", "1").returncode == 0
    same_records(records(tmp_path / "exported"), records(tmp_path / "torch"))
    assert run_main("eval", str(out)).returncode == 0 and run_main("eval", str(run)).returncode == 0
    from_file = json.loads((tmp_path / "fcos.eval.json").read_text())
    from_checkpoint = json.loads((run / "eval-last.json").read_text())
    assert abs(from_file["mAP50"] - from_checkpoint["mAP50"]) <= 0.001
    fixed = run_main("predict", str(shapes / "val"), "--from", str(out), "--iou", "0.3", "--out", str(tmp_path / "x"))
    assert fixed.returncode == 2 and "--iou: " in fixed.stderr and "fixed when it was exported" in fixed.stderr
    for fmt, name in (("torchscript", "fcos.torchscript"), ("openvino", "fcos.xml")):  # scripted; OpenVINO from ONNX
        if fmt == "openvino" and importlib.util.find_spec("openvino") is None:
            continue
        exported = run_main("export", str(run), "--format", fmt, "--out", str(tmp_path / name), "--check", "2")
        assert exported.returncode == 0, exported.stderr
        assert run_main("predict", str(shapes / "val"), "--from", str(tmp_path / name), "--out", str(tmp_path / fmt),
                        "--conf", "0.01", "--batch", "1").returncode == 0
        same_records(records(tmp_path / fmt), records(tmp_path / "torch"))


def test_eval_of_an_exported_run_is_the_checkpoints(digits_run, tmp_path):
    """``eval MODEL.torchscript`` on the run's validation set: the checkpoint's top-1 and loss (within 0.001)."""
    out = tmp_path / "digits.torchscript"
    assert run_main("export", str(digits_run), "--format", "torchscript", "--out", str(out), "--check", "2"
                    ).returncode == 0
    result = run_main("eval", str(out))
    assert result.returncode == 0, result.stderr
    assert run_main("eval", str(digits_run)).returncode == 0
    exported = json.loads((tmp_path / "digits.eval.json").read_text())
    checkpoint = json.loads((digits_run / "eval-last.json").read_text())
    assert exported["images"] == checkpoint["images"] == 360
    assert abs(exported["top1"] - checkpoint["top1"]) <= 0.001 and abs(exported["loss"] - checkpoint["loss"]) <= 1e-3
    # a size no machine holds is refused before any image is read, as a checkpoint's eval refuses it (it was numpy's
    # traceback, asking for 57 TB)
    for source in (out, digits_run):
        refused = run_main("eval", str(source), "--set", "data.size=100000")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "data.size" in refused.stderr, refused.stderr


@pytest.mark.parametrize(("model", "size", "fmt"), [
    pytest.param("timm/resnet10t", 32, "torchscript", marks=pytest.mark.slow),
    pytest.param("resnet18", 32, "onnx", marks=pytest.mark.slow),
    pytest.param("inception_v3", 75, "onnx", marks=pytest.mark.slow),  # in eval mode, without its auxiliary head
])
def test_timm_and_torchvision_classifiers_export_and_pass_the_check(tmp_path, model, size, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    run = tmp_path / "run"
    result = run_main("train", "digits", "--out", str(run), "--set", f"model.name={model}", f"data.size={size}",
                      "steps=1", "batch=4", "subdivisions=1", "eval.batch=8", *SHORT[3:])
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / f"model.{fmt}"
    exported = run_main("export", str(run), "--format", fmt, "--out", str(out), "--check", "2")
    assert exported.returncode == 0, exported.stderr
    assert f"input 1 x 3 x {size} x {size}" in exported.stdout


def test_a_shared_parts_mistake_names_the_option_of_the_command_typed(digits_run, tmp_path):
    """``eval X.onnx`` said ``--from:`` (an option of predict's, not eval's) and ``export --check-images`` said
    ``predict:``: the loaders they share with predict now name the option the user typed."""
    broken = tmp_path / "m.onnx"
    broken.write_text("not an onnx file")
    result = run_main("eval", str(broken))
    assert result.returncode == 2 and result.stderr.startswith(f"error: eval: {broken} does not load"), result.stderr
    result = run_main("export", str(digits_run), "--format", "onnx", "--out", str(tmp_path / "ok.onnx"),
                      "--check-images", str(tmp_path / "nothing.png"))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: --check-images: {tmp_path / 'nothing.png'} does not exist\n"
    assert not (tmp_path / "ok.onnx").exists()
