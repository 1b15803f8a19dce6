"""COCO and YOLO detection loaders, bad-data handling and the detection dataset, on small real JPEGs.

Oracles: boxes computed by hand, pycocotools' evaluation of the original COCO file, PIL's decoding of
the same JPEG, and Darknet's reference ``coco.data``/``coco.names``.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from bigbatch.config import load_config
from bigbatch.darknet.yolo_data import (
    darknet_label_path,
    load_yolo,
    read_darknet_data,
    read_names,
    ultralytics_label_path,
    yolo_records,
)
from bigbatch.darknet.yolo_data import load as load_yolo_format
from bigbatch.data.formats.coco import coco_ground_truth, load_coco
from bigbatch.data.formats.detection import DetectionDataset, DetectionRecord
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from bigbatch.tasks.detection import DetectionTask
from tests.helpers import DARKNET_DATA

CATEGORIES = [{"id": 3, "name": "dog"}, {"id": 7, "name": "cat"}, {"id": 1, "name": "bird"}]


def write_jpeg(path: Path, width: int, height: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, quality=95)
    return path


def truncate(path: Path, fraction: float = 0.6) -> None:
    """Keep the first part of a JPEG: the header still reads, the body does not decode."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def write_coco(tmp_path: Path, images: list[dict], annotations: list[dict], categories: list[dict] = CATEGORIES,
               missing: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """JPEGs for ``images`` (except ``missing``) under tmp_path/images and the annotation file."""
    images_dir = tmp_path / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    for k, image in enumerate(images):
        if image["file_name"] not in missing:
            write_jpeg(images_dir / image["file_name"], image["width"], image["height"], seed=k)
    file = tmp_path / "instances.json"
    file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return images_dir, file


def ann(ann_id: int, image_id: int, category_id: int, bbox: list, **extra) -> dict:
    return {"id": ann_id, "image_id": image_id, "category_id": category_id, "bbox": bbox, "iscrowd": 0, **extra}


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


# COCO -----------------------------------------------------------------------------------------------------------


def test_coco_boxes_become_float32_xyxy_with_labels_by_category_id(tmp_path, capsys):
    images_dir, file = write_coco(tmp_path, [{"id": 42, "file_name": "a.jpg", "width": 100, "height": 80}], [
        ann(1, 42, 3, [10, 20, 30, 40], area=1000.0),
        ann(2, 42, 7, [0.5, 1.25, 50, 60.5]),
        ann(3, 42, 1, [90.5, -0.5, 10, 10]),  # overshoots by 0.5 px: clipped silently
    ])
    issues = DataIssues()
    records, names = load_coco(images_dir, file, None, issues, keep_empty=False)

    assert names == ["bird", "dog", "cat"]  # categories sorted by id: 1, 3, 7
    (record,) = records
    assert (record.image_id, record.width, record.height) == (42, 100, 80)
    assert record.path == str(images_dir / "a.jpg")
    assert record.boxes.dtype == np.float32 and record.labels.dtype == np.int64
    np.testing.assert_array_equal(record.boxes, [[10, 20, 40, 60], [0.5, 1.25, 50.5, 61.75], [90.5, 0, 100, 9.5]])
    np.testing.assert_array_equal(record.labels, [1, 2, 0])
    np.testing.assert_array_equal(record.areas, [1000, 50 * 60.5, 9.5 * 9.5])  # the file's area, else the box's
    assert len(issues) == 0 and warnings_in(capsys.readouterr().err) == []


def test_coco_class_subset_by_name_remaps_ids_and_keep_empty(tmp_path):
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 48} for i in (5, 6, 7)]
    annotations = [ann(1, 5, 3, [1, 1, 10, 10]), ann(2, 5, 7, [2, 2, 10, 10]), ann(3, 5, 1, [3, 3, 10, 10]),
                   ann(4, 6, 1, [4, 4, 10, 10])]  # image 6: only a bird; image 7: nothing
    images_dir, file = write_coco(tmp_path, images, annotations)

    records, names = load_coco(images_dir, file, ["cat", "dog"], DataIssues(), keep_empty=False)
    assert names == ["cat", "dog"]
    assert [r.image_id for r in records] == [5]
    np.testing.assert_array_equal(records[0].labels, [1, 0])  # dog -> 1, cat -> 0, bird dropped
    np.testing.assert_array_equal(records[0].boxes, [[1, 1, 11, 11], [2, 2, 12, 12]])

    records, _ = load_coco(images_dir, file, ["cat", "dog"], DataIssues(), keep_empty=True)
    assert [r.image_id for r in records] == [5, 6, 7]
    assert [len(r.boxes) for r in records] == [2, 0, 0]
    assert records[1].boxes.shape == (0, 4)

    with pytest.raises(UserError, match=r"data\.classes: unknown class 'fish'"):
        load_coco(images_dir, file, ["cat", "fish"], DataIssues(), keep_empty=True)


@pytest.mark.parametrize("edge", [False, True])
def test_coco_ground_truth_equals_the_original_file_under_pycocotools(tmp_path, edge):
    """Remapped ids, areas and crowd regions: the same numbers as COCO's evaluation of the original file. ``edge``:
    boxes over the image's edge (by 0.8 px, clipped silently for training, and by 6 px) and one of no width, which
    training clips or skips and the file's evaluation takes as given (the ground truth once held the training
    boxes: mAP 1.0 where pycocotools on the file says 0.5)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images = [{"id": 11, "file_name": "a.jpg", "width": 100, "height": 80},
              {"id": 12, "file_name": "b.jpg", "width": 120, "height": 90}]
    annotations = [
        ann(1, 11, 3, [10, 20, 30, 40], area=900.0),  # segment area below the box area
        ann(2, 11, 7, [50, 10, 40, 30], area=1200.0),
        {**ann(3, 11, 3, [0, 50, 60, 30], area=1500.0), "iscrowd": 1},
        ann(4, 12, 1, [5, 5, 20, 20], area=400.0),
        ann(5, 12, 3, [60, 40, 50, 45], area=2000.0),
    ]
    if edge:
        annotations += [ann(6, 12, 7, [90.8, 10, 30, 20], area=600.0), ann(7, 11, 1, [76, 60, 30, 20], area=600.0),
                        ann(8, 12, 7, [30, 60, 0, 10], area=0.0)]
    images_dir, file = write_coco(tmp_path, images, annotations)
    detections = [  # (image, original category id, bbox, score)
        (11, 3, [11, 21, 30, 40], 0.9), (11, 3, [2, 52, 55, 27], 0.8), (11, 7, [52, 12, 40, 30], 0.7),
        (11, 7, [0, 0, 20, 20], 0.6), (12, 1, [5, 5, 20, 20], 0.95), (12, 3, [70, 45, 50, 45], 0.5),
        (12, 1, [80, 0, 20, 20], 0.4),
    ] + ([(12, 7, [90, 10, 30, 20], 0.85), (11, 1, [76, 60, 24, 20], 0.75), (12, 7, [30, 60, 2, 10], 0.3)]
         if edge else [])

    def stats(ground_truth: COCO, category: Callable[[int], int]) -> np.ndarray:
        results = ground_truth.loadRes([{"image_id": i, "category_id": category(c), "bbox": b, "score": s}
                                        for i, c, b, s in detections])
        evaluation = COCOeval(ground_truth, results, "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
        return evaluation.stats

    def coco_of(dataset: dict) -> COCO:
        coco = COCO()
        coco.dataset = dataset
        coco.createIndex()
        return coco

    records, names = load_coco(images_dir, file, None, DataIssues(), keep_empty=True)
    trained = [3, 3] if edge else [2, 2]  # the box of no width: not trained on
    assert [len(r.boxes) for r in records] == trained and len(records[0].crowd_boxes) == 1  # crowd: not trained on
    label_of = {c["id"]: names.index(c["name"]) for c in CATEGORIES}
    ours = stats(coco_of(coco_ground_truth(records, names)), lambda c: label_of[c] + 1)
    np.testing.assert_allclose(ours, stats(COCO(str(file)), lambda c: c))

    for record in records:  # the crowd region matters: without it, the detection on it is a false positive
        record.crowd_boxes, record.crowd_labels, record.crowd_areas = np.zeros((0, 4)), np.zeros(0), np.zeros(0)
    assert not np.allclose(stats(coco_of(coco_ground_truth(records, names)), lambda c: label_of[c] + 1), ours)


def test_coco_many_images_checked_in_parallel_keep_their_order(tmp_path, capsys):
    images = [{"id": 100 + k, "file_name": f"{k}.jpg", "width": 8 + k, "height": 8} for k in range(70)]
    images_dir, file = write_coco(tmp_path, images, [], missing=("33.jpg",))
    (images_dir / "34.jpg").write_bytes(b"not an image")
    records, _ = load_coco(images_dir, file, None, DataIssues(), keep_empty=True)
    assert [(r.image_id, r.width) for r in records] == [(100 + k, 8 + k) for k in range(70) if k not in (33, 34)]
    assert [w.split(": ")[1:3] for w in warnings_in(capsys.readouterr().err)] == [
        [str(images_dir / "33.jpg"), "image not found"], [str(images_dir / "34.jpg"), "unreadable image"]]


def test_coco_whole_float_ids_are_ids_and_a_missing_iscrowd_is_0(tmp_path, capsys):
    images_dir, file = write_coco(tmp_path, [{"id": 2, "file_name": "a.jpg", "width": 64, "height": 48}], [
        {"id": 1, "image_id": 2.0, "category_id": 7.0, "bbox": [1, 1, 10, 10]},  # no iscrowd: a box
        ann(2, 2, 3, [2, 2, 10, 10], iscrowd=1)])
    ((record,), _) = load_coco(images_dir, file, None, DataIssues(strict=True), keep_empty=True)
    assert record.boxes.tolist() == [[1, 1, 11, 11]] and record.labels.tolist() == [2]  # cat: ids 1, 3, 7
    assert record.crowd_boxes.tolist() == [[2, 2, 12, 12]] and record.crowd_labels.tolist() == [1]
    assert warnings_in(capsys.readouterr().err) == []


def test_coco_file_names_inside_the_images_folder_are_read_through_links(tmp_path, capsys):
    """Reads stay inside the folder named: a linked images folder, ``..`` that stays inside and a link inside the
    folder (as the folder format follows one) are read; ``..`` through a link to a folder elsewhere is not."""
    elsewhere = tmp_path / "elsewhere"
    write_jpeg(elsewhere / "linked.jpg", 40, 30, seed=3)
    write_jpeg(elsewhere / "secret.jpg", 40, 30, seed=4)
    images = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
              {"id": 2, "file_name": "sub/../b.jpg", "width": 40, "height": 30},
              {"id": 3, "file_name": "sub/../../real/c.jpg", "width": 40, "height": 30},
              {"id": 4, "file_name": "link.jpg", "width": 40, "height": 30},
              {"id": 5, "file_name": "out/../secret.jpg", "width": 40, "height": 30}]
    real = tmp_path / "real"
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        write_jpeg(real / name, 40, 30)
    (real / "sub").mkdir()
    (real / "link.jpg").symlink_to(elsewhere / "linked.jpg")
    (real / "out").symlink_to(elsewhere / "nested", target_is_directory=True)
    (elsewhere / "nested").mkdir()
    (tmp_path / "images").symlink_to(real, target_is_directory=True)  # the folder named is a link
    file = tmp_path / "instances.json"
    file.write_text(json.dumps({"images": images, "annotations": [ann(k, k, 3, [1, 1, 5, 5]) for k in range(1, 6)],
                                "categories": CATEGORIES}))

    records, _ = load_coco(tmp_path / "images", file, None, DataIssues(), keep_empty=True)
    assert [r.image_id for r in records] == [1, 2, 3, 4]
    (warning,) = warnings_in(capsys.readouterr().err)
    assert warning.startswith(f"warning: {file}:image #4 (id 5): file_name 'out/../secret.jpg' leads outside")
    with pytest.raises(UserError, match=r"image #4 \(id 5\): file_name 'out/\.\./secret\.jpg' leads outside"):
        load_coco(tmp_path / "images", file, None, DataIssues(strict=True), keep_empty=True)


# YOLO -----------------------------------------------------------------------------------------------------------


def write_yolo_folder(root: Path) -> None:
    """root/images/a.jpg (200x100) with two boxes, root/images/sub/b.png (64x48) without a label file."""
    write_jpeg(root / "images" / "a.jpg", 200, 100)
    (root / "images" / "sub").mkdir(parents=True)
    Image.new("RGB", (64, 48), (10, 200, 30)).save(root / "images" / "sub" / "b.png")
    (root / "labels").mkdir()
    (root / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.4\n\n1 0.25 0.75 0.1 0.5\n")
    (root / "classes.txt").write_text("cat\ndog\n")


@pytest.mark.parametrize("layout", ["folder", "images folder"])
def test_yolo_folder_normalised_centres_become_pixel_xyxy(tmp_path, layout):
    root = tmp_path / "set"
    write_yolo_folder(root)
    source = root if layout == "folder" else root / "images"  # names found in the parent folder
    records, names = load_yolo(source, DataIssues(), keep_empty=True)

    assert names == ["cat", "dog"]
    assert [Path(r.path).relative_to(root).as_posix() for r in records] == ["images/a.jpg", "images/sub/b.png"]
    assert [(r.image_id, r.width, r.height) for r in records] == [(0, 200, 100), (1, 64, 48)]
    # (xc, yc, w, h) = (0.5, 0.5, 0.2, 0.4) of 200x100 -> centre (100, 50), size 40x40
    # (0.25, 0.75, 0.1, 0.5) -> centre (50, 75), size 20x50
    np.testing.assert_array_equal(records[0].boxes, [[80, 30, 120, 70], [40, 50, 60, 100]])
    np.testing.assert_array_equal(records[0].labels, [0, 1])
    assert records[1].boxes.shape == (0, 4)  # no label file: no boxes, as in Darknet

    records, _ = load_yolo(source, DataIssues(), keep_empty=False)
    assert [r.image_id for r in records] == [0]  # ids stay the index in the list

    truth = coco_ground_truth(records, names)
    assert truth["categories"] == [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    assert [(a["category_id"], a["bbox"], a["area"]) for a in truth["annotations"]] == [
        (1, [80, 30, 40, 40], 1600), (2, [40, 50, 20, 50], 1000)]


def test_a_yolo_class_subset_leaves_training_images_without_its_classes_out(tmp_path):
    """Training drops images without boxes after ``data.classes`` too (as the ``coco`` format does); a subset with no
    box in the training set is the one-line error of an empty set, not a run on images without boxes."""
    for split in ("train", "val"):
        write_yolo_folder(tmp_path / "set" / split)  # a.jpg: a cat and a dog; sub/b.png: no label file
    (tmp_path / "set" / "train" / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.4\n")  # a cat only
    settings = ["data.name=yolo", f"data.path={tmp_path / 'set'}", "data.annotations=null"]
    train, val, names = load_yolo_format(load_config("shapes-detect", [*settings, "data.classes=[cat]"]), DataIssues())
    assert list(names) == ["cat"] and [Path(r.path).name for r in train] == ["a.jpg"]
    train, val, names = load_yolo_format(load_config("shapes-detect", [*settings, "data.classes=[dog]"]), DataIssues())
    assert train == [] and len(val) == 2  # validation keeps every image: none is dropped from the evaluation
    with pytest.raises(UserError, match="the training set holds no usable image with a box"):
        DetectionTask.from_config(load_config("shapes-detect", [*settings, "data.classes=[dog]"]))


def test_yolo_darknet_data_file_resolves_paths_like_darknet(tmp_path, monkeypatch):
    cfg = tmp_path / "cfg"
    write_jpeg(cfg / "data" / "images" / "a.jpg", 100, 50, seed=1)  # found from the .data file's folder
    (cfg / "data" / "labels").mkdir()
    (cfg / "data" / "labels" / "a.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    work = tmp_path / "work"  # the current folder: tried first
    write_jpeg(work / "shared" / "images" / "c.jpg", 40, 40, seed=2)
    (work / "shared" / "labels").mkdir()
    (work / "shared" / "labels" / "c.txt").write_text("0 0.25 0.25 0.5 0.5\n")
    write_jpeg(cfg / "shared" / "images" / "c.jpg", 80, 80, seed=3)  # the same relative path from cfg/: not used
    (cfg / "lists").mkdir()
    (cfg / "lists" / "train.txt").write_text("data/images/a.jpg\n\nshared/images/c.jpg\n")
    write_yolo_folder(cfg / "val")
    (cfg / "my.names").write_text("cat\ndog\n")
    (cfg / "my.data").write_text("classes= 2\ntrain  = lists/train.txt\nvalid = val\n#valid = nothing\n"
                                 "names = my.names\nbackup = backup/\n")
    monkeypatch.chdir(work)

    records, names = load_yolo(cfg / "my.data", DataIssues(), keep_empty=True)
    assert names == ["cat", "dog"]
    assert [r.path for r in records] == [str(cfg / "data/images/a.jpg"), str(work / "shared/images/c.jpg")]
    assert [(r.width, r.height) for r in records] == [(100, 50), (40, 40)]
    np.testing.assert_array_equal(records[0].boxes, [[25, 12.5, 75, 37.5]])
    np.testing.assert_array_equal(records[1].boxes, [[0, 0, 20, 20]])
    np.testing.assert_array_equal([r.labels[0] for r in records], [1, 0])

    records, _ = load_yolo(cfg / "my.data", DataIssues(), keep_empty=False, split="valid")  # a folder
    np.testing.assert_array_equal(records[0].boxes, [[80, 30, 120, 70], [40, 50, 60, 100]])

    (cfg / "my.data").write_text("classes = 3\ntrain = lists/train.txt\nnames = my.names\n")
    with pytest.raises(UserError, match=r"my\.data: classes = 3, but the names file lists 2 names"):
        load_yolo(cfg / "my.data", DataIssues(), keep_empty=True)


def test_darknet_reference_data_and_names_files():
    options = read_darknet_data(DARKNET_DATA / "coco.data")
    assert options == {"classes": "80", "train": "/home/pjreddie/data/coco/trainvalno5k.txt", "valid": "coco_testdev",
                       "names": "data/coco.names", "backup": "/home/pjreddie/backup/", "eval": "coco"}
    names = read_names(DARKNET_DATA / "coco.names")
    assert len(names) == 80 and names[:3] == ["person", "bicycle", "car"]


@pytest.mark.parametrize(("image", "label"), [
    ("/d/images/train2017/a.jpg", "/d/labels/train2017/a.txt"),
    ("/d/images/x/images/a.JPG", "/d/images/x/labels/a.txt"),  # the last images folder
    ("/d/VOC2007/JPEGImages/000001.jpg", "/d/VOC2007/labels/000001.txt"),
    ("/d/my_images/a.png", "/d/my_images/a.txt"),  # no images folder: beside the image
    ("/d/images/images.jpeg", "/d/labels/images.txt"),  # a file named images stays
    ("rel/images/a.b.jpg", "rel/labels/a.b.txt"),
])
def test_ultralytics_label_path_rule(image, label):
    assert ultralytics_label_path(image) == label


@pytest.mark.parametrize(("image", "label"), [  # AlexeyAB's replace_image_to_label, compiled and run on these paths
    ("/d/images/train2017/a.jpg", "/d/labels/train2017/a.txt"),
    ("/d/images/val2014/a.JPEG", "/d/labels/val2014/a.txt"),
    ("/d/VOC2007/JPEGImages/000001.jpg", "/d/VOC2007/labels/000001.txt"),
    ("/d/images/x.jpg", "/d/images/x.txt"),  # any other images folder: beside the image
    ("images/train/a.png", "images/train/a.txt"),
    ("/home/me/images/proj/obj/0.jpg", "/home/me/images/proj/obj/0.txt"),
    ("/d/obj/a.b.bmp", "/d/obj/a.b.txt"),
])
def test_darknet_label_path_rule(image, label):
    assert darknet_label_path(image) == label


def test_a_label_file_is_darknets_where_it_is_else_ultralytics_and_missing_ones_are_one_warning(tmp_path, capsys):
    """A Darknet set keeps its labels beside the images, in a folder of any name (``images`` too); an Ultralytics
    set in ``labels/`` beside ``images/``. Both are read; the images without either are one warning. Once only
    Ultralytics' rule was followed: a Darknet set in an ``images`` folder (or under one) read as no boxes, silently,
    and a file at the Ultralytics place outside the set was paired with its images."""
    darknet, ultra = tmp_path / "home" / "images" / "proj" / "obj", tmp_path / "u" / "images" / "train"
    (tmp_path / "home" / "labels" / "proj" / "obj").mkdir(parents=True)  # where Ultralytics' rule looks: a decoy
    (tmp_path / "home" / "labels" / "proj" / "obj" / "0.txt").write_text("0 0.1 0.1 0.05 0.05\n")
    for folder in (darknet, ultra, tmp_path / "u" / "labels" / "train"):
        folder.mkdir(parents=True)
    paths = []
    for folder in (darknet, ultra):
        for i in range(3):
            Image.new("RGB", (40, 20), (i * 40, 90, 30)).save(folder / f"{i}.jpg", quality=90)
            paths.append(str(folder / f"{i}.jpg"))
    (darknet / "0.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (darknet / "1.txt").write_text("1 0.25 0.5 0.5 1\n")
    (tmp_path / "u" / "labels" / "train" / "0.txt").write_text("0 0.5 0.5 1 1\n")
    records = yolo_records(paths, 2, DataIssues(), keep_empty=True)
    boxes = {Path(r.path).relative_to(tmp_path).as_posix(): r.boxes.tolist() for r in records}
    assert boxes["home/images/proj/obj/0.jpg"] == [[10.0, 5.0, 30.0, 15.0]]  # beside it, not the decoy
    assert boxes["home/images/proj/obj/1.jpg"] == [[0.0, 0.0, 20.0, 20.0]]
    assert boxes["u/images/train/0.jpg"] == [[0.0, 0.0, 40.0, 20.0]]  # Ultralytics' labels/ folder
    assert boxes["home/images/proj/obj/2.jpg"] == boxes["u/images/train/1.jpg"] == []
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: data: 3 of 6 images have no label file, read as "
                                                       f"images without boxes (the first: {darknet / '2.jpg'}; "
                                                       f"looked for {darknet / '2.txt'} and ")


# Bad data -------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    load: Callable[[DataIssues], list[DetectionRecord]]
    path: Path  # the file the report names
    line: int | str | None
    fragment: str  # part of the message
    summary: str
    check: Callable[[list[DetectionRecord]], None]  # what was skipped (default mode)


ONE_IMAGE = "data: 1 problem in 1 file: 1 image skipped"
ONE_BOX = "data: 1 problem in 1 file: 1 box skipped"
ONE_CLIP = "data: 1 problem in 1 file: 1 box clipped"


def coco_case(tmp_path: Path, bad: dict | None = None, missing: tuple[str, ...] = (), garbage: bool = False,
              width_b: int = 60) -> tuple[Callable, Path, Path]:
    """Images 1 (a.jpg, 100x80) and 2 (b.jpg, 60x50), one good box each; ``bad`` is annotation #2 (id 13)."""
    images = [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 80},
              {"id": 2, "file_name": "b.jpg", "width": width_b, "height": 50}]
    annotations = [ann(11, 1, 3, [10, 10, 20, 20]), ann(12, 2, 7, [5, 5, 10, 10])] + ([bad] if bad else [])
    images_dir, file = write_coco(tmp_path, images, annotations, missing=missing)
    if width_b != 60:
        write_jpeg(images_dir / "b.jpg", 60, 50)
    if garbage:
        (images_dir / "b.jpg").write_bytes(np.random.default_rng(0).bytes(700))
    return (lambda issues: load_coco(images_dir, file, None, issues, keep_empty=True)[0]), file, images_dir / "b.jpg"


def boxes_of(records: list[DetectionRecord]) -> dict[int, list[list[float]]]:
    return {r.image_id: r.boxes.tolist() for r in records}


GOOD_COCO = {1: [[10, 10, 30, 30]], 2: [[5, 5, 15, 15]]}


def coco_box_case(bad_bbox: list | None = None, fragment: str = "", summary: str = ONE_BOX, kept: list | None = None,
                  **bad_fields) -> Callable[[Path], Case]:
    def make(tmp_path: Path) -> Case:
        bad = {**ann(13, 2, 3, bad_bbox if bad_bbox is not None else [20, 20, 5, 5]), **bad_fields}
        load, file, _ = coco_case(tmp_path, bad)
        expected = {1: GOOD_COCO[1], 2: GOOD_COCO[2] + (kept or [])}

        def check(records: list[DetectionRecord]) -> None:
            assert boxes_of(records) == expected

        return Case(load, file, "annotation #2 (id 13)", fragment, summary, check)
    return make


def coco_image_case(fragment: str, **options) -> Callable[[Path], Case]:
    def make(tmp_path: Path) -> Case:
        load, _, image = coco_case(tmp_path, **options)

        def check(records: list[DetectionRecord]) -> None:
            assert boxes_of(records) == {1: GOOD_COCO[1]}

        return Case(load, image, None, fragment, ONE_IMAGE, check)
    return make


def coco_outside_case(name: Callable[[Path], str], fragment: str) -> Callable[[Path], Case]:
    """Image 2's file_name (``name(tmp_path)``) leaves the images folder; a real JPEG of the entry's size lies there."""
    def make(tmp_path: Path) -> Case:
        load, file, _ = coco_case(tmp_path)
        data = json.loads(file.read_text())
        data["images"][1]["file_name"] = name(tmp_path)
        file.write_text(json.dumps(data))
        write_jpeg(tmp_path / "outside.jpg", 60, 50)

        def check(records: list[DetectionRecord]) -> None:
            assert boxes_of(records) == {1: GOOD_COCO[1]}

        return Case(load, file, "image #1 (id 2)", fragment, ONE_IMAGE, check)
    return make


def yolo_case(bad_line: str, fragment: str, summary: str = ONE_BOX, kept: list | None = None
              ) -> Callable[[Path], Case]:
    """images/a.jpg (100x50); its label file: a good line 1, ``bad_line`` as line 2."""
    def make(tmp_path: Path) -> Case:
        write_jpeg(tmp_path / "images" / "a.jpg", 100, 50)
        (tmp_path / "labels").mkdir()
        (tmp_path / "labels" / "a.txt").write_text(f"0 0.5 0.5 0.2 0.2\n{bad_line}\n")
        (tmp_path / "classes.txt").write_text("cat\ndog\n")

        def check(records: list[DetectionRecord]) -> None:
            assert boxes_of(records) == {0: [[40, 20, 60, 30]] + (kept or [])}

        return Case(lambda issues: load_yolo(tmp_path, issues, keep_empty=True)[0], tmp_path / "labels" / "a.txt",
                    2, fragment, summary, check)
    return make


def yolo_image_case(kind: str) -> Callable[[Path], Case]:
    """A .data file listing images/a.jpg (good) and images/b.jpg (missing or garbage)."""
    def make(tmp_path: Path) -> Case:
        write_jpeg(tmp_path / "images" / "a.jpg", 100, 50)
        (tmp_path / "images" / "a.txt").write_text("")  # a label file with no box: no "no label file" warning
        if kind == "garbage":
            (tmp_path / "images" / "b.jpg").write_bytes(np.random.default_rng(1).bytes(500))
        (tmp_path / "train.txt").write_text(f"{tmp_path}/images/a.jpg\n{tmp_path}/images/b.jpg\n")
        (tmp_path / "x.names").write_text("cat\n")
        (tmp_path / "x.data").write_text(f"classes = 1\ntrain = {tmp_path}/train.txt\nnames = {tmp_path}/x.names\n")

        def check(records: list[DetectionRecord]) -> None:
            assert [Path(r.path).name for r in records] == ["a.jpg"]

        fragment = "image not found" if kind == "missing" else "unreadable image"
        return Case(lambda issues: load_yolo(tmp_path / "x.data", issues, keep_empty=True)[0],
                    tmp_path / "images" / "b.jpg", None, fragment, ONE_IMAGE, check)
    return make


CASES: dict[str, Callable[[Path], Case]] = {
    "coco missing image": coco_image_case("image not found", missing=("b.jpg",)),
    "coco unreadable image": coco_image_case("unreadable image", garbage=True),
    "coco image size differs": coco_image_case("image is 60x50 but", width_b=64),
    "coco zero-size box": coco_box_case([20, 20, 0, 5], "zero or negative size"),
    "coco negative-size box": coco_box_case([20, 20, 5, -3], "zero or negative size"),
    "coco box outside": coco_box_case([70, 5, 10, 10], "lies outside the 60x50 image"),
    "coco box mostly outside": coco_box_case([52, 5, 20, 10], "lies mostly outside the 60x50 image (40% inside)"),
    "coco box beyond the edge": coco_box_case([40, 5, 25, 10], "extends 5 px beyond the 60x50 image; clipped",
                                              ONE_CLIP, kept=[[40, 5, 60, 15]]),
    "coco unknown category": coco_box_case(fragment="category_id 99 is not in 'categories'", category_id=99),
    "coco unknown image": coco_box_case(fragment="image_id 5 is not in 'images'", image_id=5),
    "coco malformed bbox": coco_box_case([1, 2, 3], "bbox must be 4 numbers"),
    "coco image_id true": coco_box_case(fragment="image_id must be an integer, got True", image_id=True),
    "coco category_id true": coco_box_case(fragment="category_id must be an integer, got True", category_id=True),
    "coco image_id text": coco_box_case(fragment="image_id must be an integer, got '2'", image_id="2"),
    "coco iscrowd text": coco_box_case(fragment="iscrowd must be 0 or 1, got '0'", iscrowd="0"),
    "coco iscrowd 2": coco_box_case(fragment="iscrowd must be 0 or 1, got 2", iscrowd=2),
    "coco iscrowd true": coco_box_case(fragment="iscrowd must be 0 or 1, got True", iscrowd=True),
    "coco file_name with ..": coco_outside_case(lambda _: "../outside.jpg",
                                                "file_name '../outside.jpg' leads outside the images folder"),
    "coco file_name deeper ..": coco_outside_case(lambda _: "sub/../../outside.jpg", "leads outside the images folder"),
    "coco absolute file_name": coco_outside_case(lambda tmp: str(tmp / "outside.jpg"), "is an absolute path"),
    "yolo field count": yolo_case("1 0.5 0.5 0.2", "expected '<class> <xc> <yc> <w> <h>' or a polygon, got 4 fields"),
    "yolo not numbers": yolo_case("dog 0.5 0.5 0.2 0.2", "expected numbers"),
    "yolo class out of range": yolo_case("2 0.5 0.5 0.1 0.1", "class 2 is not a class index 0..1"),
    "yolo value outside [0, 1]": yolo_case("0 1.5 0.5 0.1 0.1", "normalised to [0, 1]"),
    "yolo zero-size box": yolo_case("1 0.5 0.5 0 0.1", "zero or negative size"),
    "yolo box beyond the edge": yolo_case("1 0.95 0.5 0.2 0.2", "extends 5 px beyond the 100x50 image; clipped",
                                          ONE_CLIP, kept=[[85, 20, 100, 30]]),
    "yolo missing image": yolo_image_case("missing"),
    "yolo unreadable image": yolo_image_case("garbage"),
}


def where(case: Case) -> str:
    return str(case.path) if case.line is None else f"{case.path}:{case.line}"


@pytest.mark.parametrize("name", CASES)
def test_bad_data_default_reports_once_and_skips(name, tmp_path, capsys):
    case = CASES[name](tmp_path)
    issues = DataIssues()
    records = case.load(issues)
    case.load(issues)  # the same problem again: not reported twice
    (warning,) = warnings_in(capsys.readouterr().err)
    assert warning.startswith(f"warning: {where(case)}: ") and case.fragment in warning
    assert issues.summary() == case.summary
    case.check(records)


@pytest.mark.parametrize("name", CASES)
def test_bad_data_strict_stops_naming_file_and_line(name, tmp_path):
    case = CASES[name](tmp_path)
    with pytest.raises(UserError) as raised:
        case.load(DataIssues(strict=True))
    assert str(raised.value).startswith(f"data: {where(case)}: ") and case.fragment in str(raised.value)


def test_summary_counts_problems_files_and_outcomes(capsys):
    issues = DataIssues()
    issues.report("b.txt", 3, "bad line", unit="box")
    issues.report("a.jpg", None, "image not found")
    issues.report("b.txt", 4, "box beyond", unit="box", action="clipped")
    issues.report("b.txt", 7, "other line", unit="box")
    issues.report("b.txt", 3, "bad line", unit="box")  # again: once
    assert warnings_in(capsys.readouterr().err) == ["warning: b.txt:3: bad line", "warning: a.jpg: image not found",
                                                   "warning: b.txt:4: box beyond", "warning: b.txt:7: other line"]
    assert issues.summary() == "data: 4 problems in 2 files: 1 image and 2 boxes skipped; 1 box clipped"
    assert DataIssues().summary() == "data: no problems"


def three_images(tmp_path: Path, corrupt: str = "b.jpg") -> tuple[list[DetectionRecord], DataIssues, Path]:
    images = [{"id": 20 + k, "file_name": name, "width": 40 + 8 * k, "height": 30} for k, name in enumerate("abc")]
    for image in images:
        image["file_name"] += ".jpg"
    images_dir, file = write_coco(tmp_path, images, [ann(k + 1, 20 + k, 3, [1, 1, 5, 5]) for k in range(3)])
    truncate(images_dir / corrupt)
    issues = DataIssues()
    return load_coco(images_dir, file, None, issues, keep_empty=True)[0], issues, images_dir / corrupt


def test_corrupt_jpeg_is_replaced_by_the_next_readable_sample_when_read(tmp_path, capsys):
    records, issues, corrupt = three_images(tmp_path)
    assert [r.image_id for r in records] == [20, 21, 22]  # the header reads: found only when decoded
    assert warnings_in(capsys.readouterr().err) == []

    dataset = DetectionDataset(records, issues=issues)
    image, target = dataset[1]
    assert target["image_id"] == 22 and target["substitute_for"] == 21
    assert torch.equal(image, dataset[2][0]) and "substitute_for" not in dataset[2][1]
    dataset[1]
    (warning,) = warnings_in(capsys.readouterr().err)  # once
    assert warning.startswith(f"warning: {corrupt}: corrupt image")
    assert issues.summary() == "data: 1 problem in 1 file: 1 image replaced"

    wrapped = DetectionDataset([records[0], records[2], records[1]])  # the last one: wraps around to the first
    assert wrapped[2][1]["image_id"] == 20

    only_bad = DetectionDataset([records[1]], issues=DataIssues(), name="the bad set")
    capsys.readouterr()
    with pytest.raises(UserError, match="none of the 1 images of the bad set can be decoded"):
        only_bad[0]
    assert warnings_in(capsys.readouterr().err) == []  # one error, no warning for each image before it


@pytest.mark.parametrize("loader", ["coco", "yolo"])
def test_corrupt_jpeg_stops_a_strict_load(tmp_path, loader):
    if loader == "coco":
        images_dir, file = write_coco(tmp_path, [{"id": 1, "file_name": "a.jpg", "width": 50, "height": 40}], [])
        truncate(images_dir / "a.jpg")
        load = lambda issues: load_coco(images_dir, file, None, issues, keep_empty=True)  # noqa: E731
    else:
        write_yolo_folder(tmp_path)
        truncate(tmp_path / "images" / "a.jpg")
        load = lambda issues: load_yolo(tmp_path, issues, keep_empty=True)  # noqa: E731
    assert len(load(DataIssues())[0]) == (1 if loader == "coco" else 2)  # default: headers only
    with pytest.raises(UserError, match=rf"^data: {tmp_path / 'images' / 'a.jpg'}: corrupt image"):
        load(DataIssues(strict=True))


# Dataset --------------------------------------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path) -> DetectionDataset:
    root = tmp_path / "set"
    write_yolo_folder(root)
    records, _ = load_yolo(root, DataIssues(), keep_empty=True)
    return DetectionDataset(records)


def test_sample_is_the_decoded_jpeg_with_boxes_on_its_canvas(dataset):
    image, target = dataset[0]
    assert type(image) is tv_tensors.Image and image.dtype == torch.uint8 and image.shape == (3, 100, 200)
    reference = torch.from_numpy(np.array(Image.open(dataset.records[0].path).convert("RGB"))).permute(2, 0, 1)
    assert (image.int() - reference.int()).abs().float().mean() < 1.0  # PIL decodes the same JPEG
    boxes = target["boxes"]
    assert isinstance(boxes, tv_tensors.BoundingBoxes) and boxes.format == tv_tensors.BoundingBoxFormat.XYXY
    assert tuple(boxes.canvas_size) == (100, 200) and boxes.dtype == torch.float32
    assert boxes.tolist() == [[80, 30, 120, 70], [40, 50, 60, 100]]
    assert target["labels"].dtype == torch.int64 and target["labels"].tolist() == [0, 1]
    assert target["image_id"] == 0 and target["orig_size"] == (100, 200)
    assert dataset[1][1]["boxes"].shape == (0, 4)


def augment(image: tv_tensors.Image, target: dict, size: int | None) -> tuple:
    pipeline = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4), v2.Resize((size, size))])
    return pipeline(image, target)


def test_seeded_key_is_reproducible_and_leaves_the_global_rng_alone(dataset):
    dataset.transform = augment
    torch.manual_seed(1)
    first = dataset[(0, 32, 7)]
    torch.manual_seed(2)  # a different worker, another point of the run
    state = torch.get_rng_state()
    again = dataset[(0, 32, 7)]
    assert torch.equal(torch.get_rng_state(), state)
    assert first[0].shape == (3, 32, 32)  # the size reached the transform
    assert torch.equal(first[0], again[0]) and torch.equal(first[1]["boxes"], again[1]["boxes"])
    others = [dataset[(0, 32, seed)][0] for seed in (8, 9)]
    assert not all(torch.equal(first[0], other) for other in others)


def test_collate_keeps_samples_of_different_sizes_apart(dataset):
    images, targets = DetectionDataset.collate([dataset[0], dataset[1]])
    assert [tuple(i.shape) for i in images] == [(3, 100, 200), (3, 48, 64)]
    assert [t["image_id"] for t in targets] == [0, 1]


def test_records_and_dataset_pickle(dataset):
    copy = pickle.loads(pickle.dumps(dataset))  # DataLoader workers under spawn
    assert copy.records[0].path == dataset.records[0].path and os.path.isfile(copy.records[0].path)
    assert torch.equal(copy[0][0], dataset[0][0]) and torch.equal(copy[0][1]["boxes"], dataset[0][1]["boxes"])


def test_a_phone_cameras_multi_picture_jpeg_is_read_as_its_first_picture(tmp_path):
    """PIL names a JPEG with more pictures after the first (MPO: a phone's depth map or preview) ``MPO``; every
    decoder reads its first picture, the photo. It was refused as an unsupported format, and the image skipped."""
    photo = np.random.default_rng(3).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    root = tmp_path / "set"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    Image.fromarray(photo).save(root / "images" / "a.jpg", format="MPO", save_all=True,
                                append_images=[Image.new("RGB", (64, 48))])
    (root / "labels" / "a.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (root / "classes.txt").write_text("thing\n")
    with Image.open(root / "images" / "a.jpg") as opened:
        assert opened.format == "MPO"
        first = np.asarray(opened.convert("RGB"))
    issues = DataIssues(strict=True)
    records, _ = load_yolo(root, issues, keep_empty=False)
    assert [(r.width, r.height) for r in records] == [(64, 48)] and not issues.problems
    image, _ = DetectionDataset(records, issues=issues)[0]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), first)


def test_a_polygon_label_line_is_its_bounding_box_as_ultralytics_reads_it(tmp_path, capsys):
    """Ultralytics' segmentation labels (``<class> x1 y1 x2 y2 x3 y3 ...``) train a detector there
    (``segments2boxes``): each polygon is its points' bounding box. A box line beside it stays a box; an even count of
    fields (no whole point) is malformed. The polygon lines were once refused as malformed."""
    folder = tmp_path / "obj"
    folder.mkdir()
    Image.new("RGB", (100, 50), (20, 90, 30)).save(folder / "a.jpg", quality=90)
    (folder / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n"
                                  "1 0.1 0.1 0.3 0.1 0.3 0.3 0.1 0.3\n"
                                  "1 0.1 0.2 0.3 0.4 0.5 0.6 0.7\n")
    (record,) = yolo_records([str(folder / "a.jpg")], 2, DataIssues(), keep_empty=True)
    np.testing.assert_allclose(record.boxes, [[40, 20, 60, 30], [10, 5, 30, 15]], rtol=0, atol=1e-4)
    assert record.labels.tolist() == [0, 1]
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warning == (f"warning: {folder / 'a.txt'}:3: malformed label line: expected '<class> <xc> <yc> <w> <h>' "
                       "or a polygon, got 8 fields")


def test_an_ultralytics_folder_takes_its_class_names_from_data_yaml(tmp_path):
    """Ultralytics' layout carries the names in data.yaml only (``names``: a list or a mapping of indices); training
    read only classes.txt or a .names file, and refused such a folder (``data convert`` read it)."""
    images, labels = tmp_path / "set" / "images" / "train", tmp_path / "set" / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    Image.new("RGB", (40, 20), (20, 90, 30)).save(images / "a.jpg", quality=90)
    (labels / "a.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    (tmp_path / "set" / "data.yaml").write_text("train: images/train\nval: images/train\nnames: {0: cat, 1: dog}\n")
    records, names = load_yolo(images, DataIssues(), keep_empty=True)
    assert names == ["cat", "dog"] and records[0].labels.tolist() == [1]
    for bad in ("names: 7\n", "names: {0: cat, x: dog}\n"):  # the second: keys that do not sort
        (tmp_path / "set" / "data.yaml").write_text(bad)
        with pytest.raises(UserError, match=r"^data: .*data.yaml: expected 'names': a list of class names"):
            load_yolo(images, DataIssues(), keep_empty=True)
