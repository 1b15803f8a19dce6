"""A YOLO set takes the ids of a COCO file of the same images (``data.annotations``, ``data/formats/coco_ids.py``):
images by file name, categories by name, objects by box; every mismatch is one error naming the key and the file; the
file is read as an untrusted one; ``auto`` takes only the val.json that ``data shapes`` wrote inside a set it generated.

The oracle is the generated set itself: its val.json (written from the same drawn shapes as its YOLO labels) is the
file whose ids, boxes and areas the validation records must hold; edited copies of it make each mismatch.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bigbatch.config import load_config
from bigbatch.darknet.yolo_data import load
from bigbatch.data.formats import coco
from bigbatch.data.formats.shapes import CATEGORY_IDS, CLASSES, MARKER, generate_shapes
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from tests.helpers import run_main

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("yolo-ids") / "set"
    generate_shapes(root, 12, seed=3, yolo=True)
    return root


@pytest.fixture
def copy(generated, tmp_path) -> Path:
    """The generated set, copied to be edited."""
    return Path(shutil.copytree(generated, tmp_path / "set"))


def val_json(root: Path) -> dict:
    return json.loads((root / "annotations" / "val.json").read_text())


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def load_yolo_set(root: Path, *overrides: str, path: str = "shapes.data"):
    """``(train records, val records, class names)`` of the ``yolo`` format on ``root``."""
    cfg = load_config("shapes-detect", ["data.name=yolo", f"data.path={root / path}", *overrides])
    return load(cfg, DataIssues())


def message(root: Path, *overrides: str) -> str:
    with pytest.raises(UserError) as raised:
        load_yolo_set(root, *overrides)
    return str(raised.value)


def test_the_validation_records_take_the_files_ids_boxes_and_areas(generated):
    train, val, names = load_yolo_set(generated)
    data = val_json(generated)
    assert names == list(CLASSES) and names.category_ids == list(CATEGORY_IDS)
    assert names.ids_from == str(generated / "annotations" / "val.json")
    by_name = {image["file_name"]: image["id"] for image in data["images"]}
    assert [r.image_id for r in val] == [by_name[Path(r.path).name] for r in val] == sorted(by_name.values())
    for record in val:
        mine = sorted((CATEGORY_IDS[label], *np.round(box, 3), round(float(area), 3))
                      for label, box, area in zip(record.labels, record.boxes, record.areas, strict=True))
        theirs = sorted((a["category_id"], *np.round([a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                                                      a["bbox"][1] + a["bbox"][3]], 3), round(a["area"], 3))
                        for a in data["annotations"] if a["image_id"] == record.image_id)
        assert mine == theirs
    assert [r.image_id for r in train] == [r.image_id for r in load_yolo_set(generated, "data.annotations=null")[0]]


def test_file_names_match_the_end_of_the_images_path(copy):
    """``val/000010.jpg`` names ``.../set/val/000010.jpg`` as ``000010.jpg`` does; ``train/...`` does not."""
    data = val_json(copy)
    for image in data["images"]:
        image["file_name"] = f"val/{image['file_name']}"
    given = write(copy / "with-folder.json", data)
    assert load_yolo_set(copy, f"data.annotations={given}")[2].category_ids == list(CATEGORY_IDS)
    for image in data["images"]:
        image["file_name"] = image["file_name"].replace("val/", "train/")
    wrong = write(copy / "wrong-folder.json", data)
    text = message(copy, f"data.annotations={wrong}")
    assert text.startswith(f"data.annotations: {wrong} does not describe the same images and objects (2 mismatches: ")
    assert f"{copy / 'val' / '000010.jpg'} has no image entry (none whose file_name ends its path)" in text
    assert "or set data.annotations=null: the images are then numbered by their place in the list" in text


@pytest.mark.parametrize("case", ["image missing", "another size", "two entries", "box without annotation",
                                  "box moved"])
def test_each_mismatch_is_one_error_naming_the_key_the_file_and_the_object(copy, case):
    data = val_json(copy)
    image, first = data["images"][0], data["annotations"][0]
    assert image["file_name"] == "000010.jpg" and first["image_id"] == 11
    path, entry = copy / "val" / "000010.jpg", "entry '000010.jpg' (id 11)"
    width, height = image["width"], image["height"]
    name = CLASSES[CATEGORY_IDS.index(first["category_id"])]
    x, y, w, h = first["bbox"]
    box = f"its {name} box [{x:g}, {y:g}, {x + w:g}, {y + h:g}] (x1, y1, x2, y2) has no annotation in {entry}"
    if case == "image missing":
        data["images"].pop(0)
        expected = f"1 mismatch: {path} has no image entry (none whose file_name ends its path))"
    elif case == "another size":
        image["width"] += 1
        expected = f"1 mismatch: {path} is {width}x{height}, its {entry} says {width + 1}x{height})"
    elif case == "two entries":
        data["images"].append({**image, "id": 99})
        expected = f"1 mismatch: {path} matches several image entries: '000010.jpg' (id 11), '000010.jpg' (id 99))"
    elif case == "box without annotation":
        data["annotations"].pop(0)
        expected = f"1 mismatch: {path}: {box})"
    else:  # 1.5 px to the right: farther than the 1 px a box may lie from its annotation
        first["bbox"][0] += 1.5
        expected = (f"2 mismatches: {path}: {box}; {path}: the {name} annotation [{x + 1.5:g}, {y:g}, {w:g}, {h:g}] "
                    f"(x, y, w, h) of {entry} has no labelled box)")
    given = write(copy / "edited.json", data)
    text = message(copy, f"data.annotations={given}")
    assert text.startswith(f"data.annotations: {given} does not describe the same images and objects ({expected}; each "
                           f"image must have its entry (by file name) and each box its annotation (same class, same "
                           f"box within 1 px); or set data.annotations=null"), text


def test_a_box_within_a_pixel_of_its_annotation_is_that_annotation(copy):
    data = val_json(copy)
    data["annotations"][0]["bbox"][0] += 0.9
    given = write(copy / "edited.json", data)
    _, val, _ = load_yolo_set(copy, f"data.annotations={given}")
    assert any(np.isclose(r.boxes[:, 0], data["annotations"][0]["bbox"][0]).any() for r in val if r.image_id == 11)


def test_a_class_the_file_does_not_name_is_one_error(copy):
    data = val_json(copy)
    data["categories"] = [c for c in data["categories"] if c["name"] != "star"]
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] != 7]
    given = write(copy / "no-star.json", data)
    text = message(copy, f"data.annotations={given}")
    assert text == (f"data.annotations: {given} has no category named 'star' (classes are matched by name; its "
                    f"categories: circle, square, triangle, cross)")
    # a subset without the star is scored against the same file
    assert load_yolo_set(copy, f"data.annotations={given}", "data.classes=[cross, circle]")[2].category_ids == [9, 1]


def test_a_crowd_region_of_the_file_joins_the_ground_truth_and_a_box_on_one_is_that_region(copy):
    data = val_json(copy)
    first = data["annotations"][0]
    first["iscrowd"] = 1  # its labelled box lies on a crowd region now
    extra = {"id": 999, "image_id": 12, "category_id": 3, "bbox": [1, 1, 9, 9], "area": 50.0, "iscrowd": 1}
    data["annotations"].append(extra)
    given = write(copy / "crowd.json", data)
    _, val, _ = load_yolo_set(copy, f"data.annotations={given}")
    by_id = {r.image_id: r for r in val}
    x, y, w, h = first["bbox"]
    np.testing.assert_allclose(by_id[11].crowd_boxes, [[x, y, x + w, y + h]])
    assert len(by_id[11].boxes) == sum(a["image_id"] == 11 and not a.get("iscrowd") for a in data["annotations"])
    np.testing.assert_allclose(by_id[12].crowd_boxes, [[1, 1, 10, 10]])
    assert by_id[12].crowd_areas.tolist() == [50.0] and by_id[12].crowd_labels.tolist() == [1]


# --- auto: only the generator's own file, inside the set --------------------------------------------------------------

def test_auto_takes_the_generated_sets_val_json_from_a_data_file_or_the_folder(generated):
    for path in ("shapes.data", "."):
        assert load_yolo_set(generated, path=path)[2].ids_from == str(generated / "annotations" / "val.json")
    assert load_yolo_set(generated, "data.annotations=null")[2].category_ids is None


@pytest.mark.parametrize("change", ["no marker", "marker of another writer", "val.json a link", "annotations a link",
                                    "marker a fifo"])
def test_auto_takes_nothing_unless_the_set_is_the_generators_as_written(copy, tmp_path, change):
    annotations = copy / "annotations"
    if change == "no marker":
        (copy / MARKER).unlink()
    elif change == "marker of another writer":
        (copy / MARKER).write_text(json.dumps({"written_by": "someone"}))
    elif change == "val.json a link":
        outside = shutil.copy(annotations / "val.json", tmp_path / "outside.json")
        (annotations / "val.json").unlink()
        (annotations / "val.json").symlink_to(outside)
    elif change == "annotations a link":
        moved = shutil.move(annotations, tmp_path / "elsewhere")
        annotations.symlink_to(moved)
    else:
        (copy / MARKER).unlink()
        os.mkfifo(copy / MARKER)  # reading it would wait for a writer forever
    _, val, names = load_yolo_set(copy)
    assert names.category_ids is None and [r.image_id for r in val] == list(range(len(val)))


def test_auto_with_an_edited_image_list_is_one_error_that_says_how_to_go_without(copy):
    (copy / "val.txt").write_text("train/000000.jpg\n" + (copy / "val.txt").read_text())
    text = message(copy)
    assert text.startswith(f"data.annotations: {copy / 'annotations' / 'val.json'} does not describe the same images "
                           f"and objects (1 mismatch: {copy / 'train' / '000000.jpg'} has no image entry")
    assert text.endswith("this is the file `bigbatch data shapes` wrote beside the set, taken by default "
                         "(data.annotations: auto); set data.annotations=null to use none: the images are then "
                         "numbered by their place in the list, the categories class index + 1")
    assert load_yolo_set(copy, "data.annotations=null")[2].category_ids is None


# --- the file is untrusted --------------------------------------------------------------------------------------------

def test_a_fifo_or_a_file_too_large_is_refused_without_reading_it(copy, monkeypatch):
    fifo = copy / "fifo.json"
    os.mkfifo(fifo)
    assert message(copy, f"data.annotations={fifo}") == (
        f"data.annotations: cannot read annotation file {fifo}: {fifo} is not a regular file")
    monkeypatch.setattr(coco, "ANNOTATION_FILE_LIMIT", 100)
    given = copy / "annotations" / "val.json"
    size = given.stat().st_size
    assert message(copy, f"data.annotations={given}") == (
        f"data.annotations: cannot read annotation file {given}: {given} is {size:,} bytes, more than the 100 an "
        f"annotation file may be")


def test_a_missing_file_stops_train_before_any_work_in_one_line(generated, tmp_path):
    missing = tmp_path / "missing.json"
    result = run_main("train", "shapes-detect", "--out", str(tmp_path / "run"), "--set", "data.name=yolo",
                      f"data.path={generated / 'shapes.data'}", f"data.annotations={missing}", "steps=1")
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    assert result.stderr == (f"error: data.annotations: {missing} does not exist; expected a COCO annotation file of "
                             f"the validation images, auto (the one `bigbatch data shapes` wrote, if any) or null "
                             f"(none)\n")
    assert message(generated, f"data.annotations={missing}") == (
        f"data.annotations: annotation file {missing} not found")  # the loader's own check, when called alone
