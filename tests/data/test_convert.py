"""``bigbatch data convert`` (``darknet/convert.py``): COCO JSON to YOLO labels and back, in Darknet's and Ultralytics'
layouts, through the real command.

The oracle is the generated shapes set, which holds the same boxes in both formats, each written by the generator
itself: its COCO files (integer boxes, odd category ids) and its Darknet layout (``data shapes --format yolo``). A
conversion of one must give the other: the generator's own label files byte for byte, its COCO boxes within 0.5 px
with their ids. Sources are checked untouched by every conversion (contents, inodes, times).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from PIL import Image

from bigbatch.config import load_config
from bigbatch.darknet.yolo_data import load as load_yolo_format
from bigbatch.data.formats.shapes import CATEGORY_IDS, CLASSES, generate_shapes
from bigbatch.data.pipeline.problems import DataIssues
from tests.helpers import run_main

SPLITS = ("train", "val")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    """A generated set in both formats: COCO (annotations/, train/, val/) and Darknet's layout (shapes.data)."""
    root = tmp_path_factory.mktemp("convert") / "shapes"
    generate_shapes(root, 12, seed=3, yolo=True)
    return root


@pytest.fixture(scope="module")
def coco_only(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("convert-coco") / "coco"
    generate_shapes(root, 6, seed=5)
    return root


def convert(*args: str | Path):
    return run_main("data", "convert", *map(str, args))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file under ``root``: its inode, size, modification time and contents' hash (a link made to it changes
    none of them)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            info = path.stat()
            found[path.relative_to(root).as_posix()] = (info.st_ino, info.st_size, info.st_mtime_ns,
                                                        hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def coco_file(root: Path, split: str) -> dict:
    return json.loads((root / "annotations" / f"{split}.json").read_text())


def boxes_by_image(data: dict) -> dict[int, list[tuple]]:
    """``{image id: sorted (category id, x, y, w, h)}``, every image listed."""
    found: dict[int, list[tuple]] = {image["id"]: [] for image in data["images"]}
    for ann in data["annotations"]:
        found[ann["image_id"]].append((ann["category_id"], *ann["bbox"]))
    return {image_id: sorted(boxes) for image_id, boxes in found.items()}


def largest_box_difference(a: dict, b: dict) -> float:
    """The largest difference of a box coordinate between two COCO files of the same images and ids, each box
    paired with its own (same image, same category, the same order); their images and box counts must agree."""
    mine, theirs = boxes_by_image(a), boxes_by_image(b)
    assert mine.keys() == theirs.keys()
    largest = 0.0
    for image_id in mine:
        assert [box[0] for box in mine[image_id]] == [box[0] for box in theirs[image_id]], image_id
        for x, y in zip(mine[image_id], theirs[image_id], strict=True):
            largest = max(largest, *(abs(p - q) for p, q in zip(x[1:], y[1:], strict=True)))
    return largest


def label_values(path: Path) -> list[list[float]]:
    return [[float(v) for v in line.split()] for line in path.read_text().splitlines() if line.strip()]


def image_entries(data: dict) -> list[tuple]:
    return [(image["id"], image["file_name"], image["width"], image["height"]) for image in data["images"]]


@pytest.mark.fast
def test_coco_to_yolo_and_back_keeps_every_box_and_the_ids(shapes, tmp_path):
    before = snapshot(shapes)
    yolo, back = tmp_path / "yolo", tmp_path / "coco"
    result = convert(shapes, "--to", "yolo", "--out", yolo)  # a folder of both formats: read as COCO (--to yolo)
    assert result.returncode == 0, result.stderr
    assert f"COCO {shapes} converted to YOLO (Darknet's layout) in {yolo}" in result.stdout
    assert f"train with --set data.name=yolo data.path={yolo / 'shapes.data'}" in result.stdout
    # the source's COCO file, for its image and category ids in saved detections (the YOLO set numbers its own)
    assert f" data.annotations={(shapes / 'annotations' / 'val.json').resolve()}\n" in result.stdout
    for split in SPLITS:  # the generator's own label files, byte for byte, and its lists and names
        labels = sorted((shapes / split).glob("*.txt"))
        assert labels and [p.name for p in sorted((yolo / split).glob("*.txt"))] == [p.name for p in labels]
        assert all((yolo / split / p.name).read_text() == p.read_text() for p in labels)
        assert (yolo / f"{split}.txt").read_text() == (shapes / f"{split}.txt").read_text()
    assert (yolo / "shapes.names").read_text() == (shapes / "shapes.names").read_text()
    ids = json.loads((yolo / "shapes.coco-ids.json").read_text())
    assert [(c["id"], c["name"]) for c in ids["categories"]] == list(zip(CATEGORY_IDS, CLASSES, strict=True))

    result = convert(yolo, "--to", "coco", "--out", back)
    assert result.returncode == 0, result.stderr
    for split in SPLITS:
        original, converted = coco_file(shapes, split), coco_file(back, split)
        assert converted["categories"] == original["categories"]  # ids, names and supercategories
        assert image_entries(converted) == image_entries(original)  # ids by file name
        assert largest_box_difference(converted, original) < 1e-3  # the labels' six decimals of a ~130 px side
        jpegs = sorted(p.name for p in (shapes / split).glob("*.jpg"))
        assert sorted(p.name for p in (back / split).iterdir()) == jpegs
    assert snapshot(shapes) == before


@pytest.mark.fast
def test_a_darknet_set_to_coco_and_back(shapes, tmp_path):
    """A YOLO set without an ids file: images numbered 0, 1, ... in list order, as the ``yolo`` format numbers them
    (so that a run's saved detections score against the converted file), categories class index + 1; boxes those of
    the generator's COCO files; back in YOLO, the same label values."""
    coco, back = tmp_path / "coco", tmp_path / "yolo"
    result = convert(shapes / "shapes.data", "--to", "coco", "--out", coco)
    assert result.returncode == 0, result.stderr
    for split in SPLITS:
        converted, original = coco_file(coco, split), coco_file(shapes, split)
        assert [(c["id"], c["name"]) for c in converted["categories"]] == list(enumerate(CLASSES, 1))
        listed = (shapes / f"{split}.txt").read_text().split()
        assert image_entries(converted) == [(n, Path(line).name, image["width"], image["height"])
                                            for n, (line, image) in enumerate(zip(listed, original["images"],
                                                                                  strict=True))]
        renumbered = {**original, "images": [{**image, "id": n} for n, image in enumerate(original["images"])],
                      "annotations": [{**a, "image_id": a["image_id"] - original["images"][0]["id"],
                                       "category_id": CATEGORY_IDS.index(a["category_id"]) + 1}
                                      for a in original["annotations"]]}
        assert largest_box_difference(converted, renumbered) < 1e-3
    cfg = load_config("shapes-detect", ["data.name=yolo", f"data.path={shapes / 'shapes.data'}",
                                        "data.annotations=null"])
    _, val, _ = load_yolo_format(cfg, DataIssues(strict=True))  # the ids a run's --save-detections writes
    assert {Path(r.path).name: r.image_id for r in val} == {
        image["file_name"]: image["id"] for image in coco_file(coco, "val")["images"]}
    same = tmp_path / "same"  # the folder of both formats, --to coco: read as YOLO, as the .data file is
    assert convert(shapes, "--to", "coco", "--out", same).returncode == 0
    assert all(coco_file(same, split) == coco_file(coco, split) for split in SPLITS)

    result = convert(coco, "--to", "yolo", "--out", back)
    assert result.returncode == 0, result.stderr
    assert (back / "coco.names").read_text() == (shapes / "shapes.names").read_text()
    for split in SPLITS:
        assert (back / f"{split}.txt").read_text() == (shapes / f"{split}.txt").read_text()
        for label in (shapes / split).glob("*.txt"):
            mine, theirs = label_values(back / split / label.name), label_values(label)
            assert [v[0] for v in mine] == [v[0] for v in theirs]
            assert all(abs(a - b) <= 1e-6 for m, t in zip(mine, theirs, strict=True) for a, b in zip(m, t, strict=True))


@pytest.mark.fast
def test_the_ultralytics_layout_is_written_and_read(shapes, tmp_path):
    ultra = tmp_path / "ultralytics"
    result = convert(shapes, "--to", "yolo", "--layout", "ultralytics", "--out", ultra)
    assert result.returncode == 0, result.stderr
    for split in SPLITS:
        images = sorted(p.name for p in (shapes / split).glob("*.jpg"))
        assert sorted(p.name for p in (ultra / "images" / split).iterdir()) == images
        for label in (shapes / split).glob("*.txt"):
            assert (ultra / "labels" / split / label.name).read_text() == label.read_text()
    data_yaml = yaml.safe_load((ultra / "data.yaml").read_text())
    assert data_yaml == {"train": "images/train", "val": "images/val", "nc": 5, "names": dict(enumerate(CLASSES))}
    assert {"shapes.names", "shapes.data", "shapes.coco-ids.json", "train.txt", "val.txt"} <= {
        p.name for p in ultra.iterdir()}

    # bigbatch's yolo format reads it as a folder and as its .data file, the same records
    for path in (ultra, ultra / "shapes.data"):
        cfg = load_config("shapes-detect", ["data.name=yolo", f"data.path={path}", "data.annotations=null"])
        train, val, names = load_yolo_format(cfg, DataIssues(strict=True))
        assert names == list(CLASSES) and len(val) == len(coco_file(shapes, "val")["images"])

    back = tmp_path / "coco"  # the ids come back through shapes.coco-ids.json
    assert convert(ultra, "--to", "coco", "--out", back).returncode == 0
    for split in SPLITS:
        assert image_entries(coco_file(back, split)) == image_entries(coco_file(shapes, split))
        assert coco_file(back, split)["categories"] == coco_file(shapes, split)["categories"]
        assert largest_box_difference(coco_file(back, split), coco_file(shapes, split)) < 1e-3

    # Ultralytics' own: data.yaml's names only, no ids file, no Darknet files
    own = tmp_path / "own"
    for split in SPLITS:
        shutil.copytree(ultra / "images" / split, own / "images" / split)
        shutil.copytree(ultra / "labels" / split, own / "labels" / split)
    (own / "data.yaml").write_text("path: ../elsewhere\ntrain: images/train\nval: images/val\n"
                                   "names:\n  0: circle\n  1: square\n  2: triangle\n  3: star\n  4: cross\n")
    result = convert(own, "--to", "coco", "--out", tmp_path / "own-coco")
    assert result.returncode == 0, result.stderr
    val = coco_file(tmp_path / "own-coco", "val")
    assert [(c["id"], c["name"]) for c in val["categories"]] == list(enumerate(CLASSES, 1))
    assert [image["id"] for image in val["images"]] == list(range(len(val["images"])))

    # and Ultralytics' layout to Darknet's: the generator's files again
    darknet = tmp_path / "darknet"
    result = convert(ultra, "--to", "yolo", "--out", darknet)
    assert result.returncode == 0, result.stderr
    for label in (shapes / "val").glob("*.txt"):
        assert (darknet / "val" / label.name).read_text() == label.read_text()
    assert json.loads((darknet / "shapes.coco-ids.json").read_text())["categories"] == coco_file(shapes, "val")[
        "categories"]


@pytest.mark.fast
def test_images_are_linked_or_copied_never_moved(shapes, tmp_path):
    before = snapshot(shapes)
    linked, copied = tmp_path / "linked", tmp_path / "copied"
    result = convert(shapes, "--to", "yolo", "--out", linked)
    assert result.returncode == 0 and "linked 12 images" in result.stdout, result.stdout + result.stderr
    result = convert(shapes, "--to", "yolo", "--out", copied, "--copy")
    assert result.returncode == 0 and "copied 12 images" in result.stdout, result.stdout + result.stderr
    for source in [*(shapes / "train").glob("*.jpg"), *(shapes / "val").glob("*.jpg")]:
        relative = source.relative_to(shapes)
        assert os.path.samefile(linked / relative, source)
        assert not os.path.samefile(copied / relative, source)
        assert (copied / relative).read_bytes() == source.read_bytes()
    assert snapshot(shapes) == before


def error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.fast
def test_the_refusals_are_one_line_and_write_nothing(shapes, coco_only, tmp_path):
    before = snapshot(shapes)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("the user's")
    assert f"--out: {busy} is not empty" in error_line(convert(shapes, "--to", "yolo", "--out", busy))
    assert [p.name for p in busy.iterdir()] == ["mine.txt"] and (busy / "mine.txt").read_text() == "the user's"

    out = tmp_path / "out"
    assert "is a COCO set already" in error_line(convert(coco_only, "--to", "coco", "--out", out))
    assert "in Darknet's layout already" in error_line(convert(shapes / "shapes.data", "--to", "yolo", "--out", out))
    assert "--layout: goes with --to yolo" in error_line(convert(shapes, "--to", "coco", "--layout", "darknet",
                                                                 "--out", out))
    assert "not a detection set" in error_line(convert(tmp_path / "busy", "--to", "yolo", "--out", out))
    assert not out.exists()
    assert snapshot(shapes) == before


@pytest.mark.fast
def test_bad_annotations_name_their_file_and_line(shapes, coco_only, tmp_path):
    out = tmp_path / "out"
    coco = Path(shutil.copytree(coco_only, tmp_path / "coco"))
    data = coco_file(coco, "train")
    data["annotations"][2]["bbox"] = [10, 10, -4, 5]
    (coco / "annotations" / "train.json").write_text(json.dumps(data))
    line = error_line(convert(coco, "--to", "yolo", "--out", out))
    assert line.startswith(f"error: data: {coco / 'annotations' / 'train.json'}:annotation #2 (id 3): bbox "), line
    (coco / "annotations" / "train.json").write_text('{"images": [],\n "annotations": [,]}')
    assert f"{coco / 'annotations' / 'train.json'}:2: not valid JSON" in error_line(
        convert(coco, "--to", "yolo", "--out", out))

    for text, says in [("[" * 100_000 + "]" * 100_000, "nested too deeply"), ("[" + "1" * 5000 + "]", "digits")]:
        (coco / "annotations" / "train.json").write_text(text)
        line = error_line(convert(coco, "--to", "yolo", "--out", out))
        assert line.startswith(f"error: SRC: {coco / 'annotations' / 'train.json'}: not a COCO annotation file"), line
        assert says in line

    yolo = Path(shutil.copytree(shapes, tmp_path / "yolo"))
    label = yolo / "train" / "000001.txt"
    label.write_text((label.read_text().splitlines() or [""])[0] + "\n7 0.5 0.5 0.1 0.1\n")
    line = error_line(convert(yolo / "shapes.data", "--to", "coco", "--out", out))
    assert line == f"error: data: {label}:2: class 7 is not a class index 0..4 (5 names)"
    assert not out.exists()


def test_a_box_over_the_edge_is_clipped_as_training_clips_it_not_the_end_of_the_conversion(shapes, tmp_path):
    """``0 0.98 0.5 0.1 0.1`` is a label Darknet and Ultralytics train on (Ultralytics clips it): convert clips it,
    names it in a warning and counts it, where it once stopped in an error line that said "clipped"."""
    yolo = Path(shutil.copytree(shapes, tmp_path / "yolo"))
    label = yolo / "train" / "000001.txt"
    label.write_text("0 0.98 0.5 0.1 0.1\n")
    width, height = Image.open(yolo / "train" / "000001.jpg").size
    result = convert(yolo / "shapes.data", "--to", "coco", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {label}:1: box ") and "; clipped" in warnings[0]
    assert "data: 1 problem in 1 file: 1 box clipped\n" in result.stdout
    data = json.loads((tmp_path / "out" / "annotations" / "train.json").read_text())
    image = next(i for i in data["images"] if i["file_name"] == "000001.jpg")
    (box,) = [a["bbox"] for a in data["annotations"] if a["image_id"] == image["id"]]
    assert box[0] + box[2] == pytest.approx(width) and box[0] == pytest.approx(0.93 * width, abs=0.01)


@pytest.mark.fast
def test_nothing_outside_the_source_folder_is_read(shapes, tmp_path):
    yolo = Path(shutil.copytree(shapes, tmp_path / "yolo"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(shapes / "val" / "000010.jpg", elsewhere / "000010.jpg")
    (yolo / "val.txt").write_text(f"val/000011.jpg\n{elsewhere / '000010.jpg'}\n")
    line = error_line(convert(yolo / "shapes.data", "--to", "coco", "--out", tmp_path / "out"))
    assert f"{elsewhere / '000010.jpg'} leads outside {yolo}" in line
    (yolo / "val.txt").write_text("val/000011.jpg\n")
    (yolo / "val" / "000011.txt").unlink()
    (yolo / "val" / "000011.txt").symlink_to(shapes / "val" / "000011.txt")
    assert "the label file" in error_line(convert(yolo / "shapes.data", "--to", "coco", "--out", tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
def test_crowd_regions_are_left_out_and_images_without_boxes_kept(coco_only, tmp_path):
    coco = Path(shutil.copytree(coco_only, tmp_path / "coco"))
    data = coco_file(coco, "train")
    first, second = data["images"][0]["id"], data["images"][1]["id"]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] != second]  # an image without boxes
    data["annotations"].append({"id": 999, "image_id": first, "category_id": 3, "bbox": [2, 2, 20, 20], "area": 400,
                                "iscrowd": 1})
    (coco / "annotations" / "train.json").write_text(json.dumps(data))
    yolo, back = tmp_path / "yolo", tmp_path / "back"
    result = convert(coco, "--to", "yolo", "--out", yolo)
    assert result.returncode == 0, result.stderr
    assert "left out 1 crowd region (iscrowd: 1): YOLO labels have no crowd flag" in result.stdout
    names = {image["id"]: Path(image["file_name"]).stem for image in data["images"]}
    assert (yolo / "train" / f"{names[second]}.txt").read_text() == ""
    kept = [a for a in data["annotations"] if a["image_id"] == first and not a["iscrowd"]]
    assert len(label_values(yolo / "train" / f"{names[first]}.txt")) == len(kept)
    assert convert(yolo, "--to", "coco", "--out", back).returncode == 0
    converted = coco_file(back, "train")
    assert image_entries(converted) == image_entries(data)  # the image without boxes is still there
    boxes = boxes_by_image(converted)
    assert boxes[second] == [] and len(boxes[first]) == len(kept)
    assert all(a["iscrowd"] == 0 for a in converted["annotations"])
    without_crowd = {**data, "annotations": [a for a in data["annotations"] if not a["iscrowd"]]}
    assert largest_box_difference(converted, without_crowd) < 1e-3


def test_a_checkpoint_scores_the_same_on_both_layouts(tmp_path):
    """A short shapes-detect run evaluated on its COCO set and on that set converted to YOLO: the same detections,
    image for image, and the same metrics."""
    root = tmp_path / "shapes"
    generate_shapes(root, 60, seed=1)
    run = tmp_path / "run"
    result = run_main("train", "shapes-detect", "--out", str(run), "--set", f"data.path={root}", "steps=30",
                      "batch=8", "subdivisions=1", "data.size=64", "eval.every=100", "log.tensorboard=false",
                      "memory.interval=60", "optim.lr=0.01")
    assert result.returncode == 0, result.stderr[-3000:]
    yolo = tmp_path / "yolo"
    assert convert(root, "--to", "yolo", "--out", yolo).returncode == 0
    scores = {}
    as_yolo = ["--set", "data.name=yolo", f"data.path={yolo / 'shapes.data'}"]
    with_file = [*as_yolo, f"data.annotations={root / 'annotations' / 'val.json'}"]
    for layout, overrides in (("coco", []), ("yolo", as_yolo), ("yolo-with-file", with_file)):
        detections = tmp_path / f"{layout}.json"
        result = run_main("eval", str(run), *overrides, "--save-detections", str(detections))
        assert result.returncode == 0, result.stderr[-3000:]
        scores[layout] = (json.loads((run / "eval-last.json").read_text()), json.loads(detections.read_text()))
    (coco_metrics, coco_detections), (yolo_metrics, yolo_detections) = scores["coco"], scores["yolo"]
    # the same detections: the COCO set's ids (1, 2, ...; 1, 3, 5, 7, 9) against the YOLO set's (0, 1, ...; 1..5)
    first_id = coco_file(root, "val")["images"][0]["id"]
    assert [(d["image_id"] - first_id, CATEGORY_IDS.index(d["category_id"]) + 1, d["bbox"], d["score"])
            for d in coco_detections] == [(d["image_id"], d["category_id"], d["bbox"], d["score"])
                                          for d in yolo_detections]
    assert coco_metrics["mAP"] > 0
    print({key: (coco_metrics.get(key), yolo_metrics.get(key)) for key in ("mAP", "mAP50", "mAP75", "mAP_small",
                                                                           "mAP_medium", "mAP_large")})
    for key in ("mAP", "mAP50", "mAP75", "AR100"):  # the area ranges differ: YOLO's areas are the boxes', COCO's the
        assert yolo_metrics[key] == pytest.approx(coco_metrics[key], abs=1e-6), key  # masks'
    # with the COCO file of the validation images (data.annotations), its ids and areas: every number, the same file
    with_file_metrics, with_file_detections = scores["yolo-with-file"]
    assert with_file_detections == coco_detections
    numbers = {key for key, value in coco_metrics.items() if isinstance(value, float)}
    assert {"mAP_small", "AP/circle"} <= numbers
    expected = {key: coco_metrics[key] for key in numbers}
    assert {key: with_file_metrics[key] for key in numbers} == pytest.approx(expected, abs=1e-6)


@pytest.mark.fast
def test_coco_2017_names_are_read(coco_only, tmp_path):
    """COCO's own layout: annotations/instances_{train,val}2017.json with train2017/ and val2017/."""
    coco = tmp_path / "coco2017"
    for split in SPLITS:
        shutil.copytree(coco_only / split, coco / f"{split}2017")
        (coco / "annotations").mkdir(exist_ok=True)
        shutil.copy(coco_only / "annotations" / f"{split}.json", coco / "annotations" / f"instances_{split}2017.json")
    yolo = tmp_path / "yolo"
    result = convert(coco, "--to", "yolo", "--out", yolo)
    assert result.returncode == 0, result.stderr
    assert f"data.path={yolo / 'coco2017.data'}" in result.stdout
    names = sorted(p.name for p in (coco_only / "val").iterdir())
    assert sorted(p.name for p in (yolo / "val").glob("*.jpg")) == names


@pytest.mark.fast
def test_a_refused_hard_link_is_a_copy_and_a_failed_write_leaves_nothing(shapes, tmp_path, monkeypatch):
    import errno

    from bigbatch.darknet import convert as module

    def other_file_system(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(module.os, "link", other_file_system)
    out = tmp_path / "copied"
    result = convert(shapes, "--to", "yolo", "--out", out)
    assert result.returncode == 0 and "copied 12 images" in result.stdout, result.stdout + result.stderr
    assert (out / "val" / "000010.jpg").read_bytes() == (shapes / "val" / "000010.jpg").read_bytes()

    real_text = module.Writer.text

    def full_disk(self, relative, text):
        if relative.endswith(".data"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_text(self, relative, text)

    monkeypatch.setattr(module.Writer, "text", full_disk)
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (tmp_path / "new" / "out", empty):
        line = error_line(convert(shapes, "--to", "yolo", "--out", target))
        assert "No space left on device (what it wrote is removed)" in line
        assert not (tmp_path / "new").exists() and list(empty.iterdir()) == []
