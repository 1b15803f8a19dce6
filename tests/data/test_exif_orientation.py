"""EXIF orientation: the ``yolo`` format trains on the image as shown (its stored pixels turned by the EXIF
Orientation tag, as Darknet and Ultralytics decode it with OpenCV), a COCO file describes the stored pixels.

Oracles: PIL's ``ImageOps.exif_transpose`` of the same JPEG (the pixels, and where a drawn object lands), PIL's plain
decode (the stored pixels and where the object lies in them), and the label boxes written from those.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from bigbatch.darknet.yolo_data import load_yolo, yolo_records
from bigbatch.data.formats.coco import coco_ground_truth, load_coco
from bigbatch.data.formats.coco_ids import take_coco_ids
from bigbatch.data.formats.detection import DetectionDataset, DetectionRecord
from bigbatch.data.pipeline.images import (
    boxes_to_displayed,
    boxes_to_stored,
    inspect_image,
    inspect_oriented,
    orient,
    orientation_of_block,
)
from bigbatch.data.pipeline.loader import eval_batches
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from tests.helpers import run_main

ORIENTATIONS = range(1, 9)
STORED = (100, 50)  # width, height of the stored pixels: a landscape sensor read
OBJECT = (10, 5, 30, 20)  # x1, y1, x2, y2 (exclusive) of the white rectangle drawn on the stored pixels


def photo(path: Path, orientation: int | None, exif: bytes | None = None, seed: int = 0) -> Path:
    """A JPEG of :data:`STORED` size: dark noise with a white rectangle at :data:`OBJECT`, its EXIF Orientation tag
    ``orientation`` (None: no EXIF), or the raw EXIF block ``exif``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = STORED
    pixels = np.random.default_rng(seed).integers(0, 40, (height, width, 3), dtype=np.uint8)
    x1, y1, x2, y2 = OBJECT
    pixels[y1:y2, x1:x2] = 255
    extra = {}
    if orientation is not None:
        tags = Image.Exif()
        tags[0x0112] = orientation
        extra["exif"] = tags
    if exif is not None:
        extra["exif"] = exif
    with warnings.catch_warnings():  # PIL parses a broken block given it, and warns
        warnings.simplefilter("ignore")
        Image.fromarray(pixels).save(path, quality=95, **extra)
    return path


def bright_box(pixels: np.ndarray) -> tuple[int, int, int, int]:
    """XYXY (exclusive) of the white pixels of an [H, W, 3] image."""
    ys, xs = np.nonzero(pixels.min(axis=2) > 128)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def shown_by_pil(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


def stored_by_pil(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def yolo_line(box: tuple[float, ...], width: int, height: int, label: int = 0) -> str:
    x1, y1, x2, y2 = box
    return f"{label} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} {(x2 - x1) / width:.6f} " \
           f"{(y2 - y1) / height:.6f}\n"


def labelled_photo(root: Path, name: str, orientation: int) -> tuple[np.ndarray, tuple, tuple]:
    """``root/images/name`` with its label file: the box of the object where PIL shows it. Returns (the image as PIL
    shows it, the object's box there, the object's box on the stored pixels)."""
    path = photo(root / "images" / name, orientation, seed=orientation)
    shown = shown_by_pil(path)
    box = bright_box(shown)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    (root / "labels" / Path(name).with_suffix(".txt")).write_text(yolo_line(box, shown.shape[1], shown.shape[0]))
    return shown, box, bright_box(stored_by_pil(path))


# ----------------------------------------------------------------------------- reading the tag, turning the pixels


@pytest.mark.fast
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_the_pixels_turn_as_pils_exif_transpose_and_the_boxes_with_them(tmp_path, orientation):
    path = photo(tmp_path / "a.jpg", orientation)
    size, found, problem = inspect_oriented(str(path), decode=True)
    shown = shown_by_pil(path)
    assert (found, problem) == (orientation, None)
    assert size == (shown.shape[1], shown.shape[0])  # 5-8: 50 x 100
    assert inspect_image(str(path)) == (STORED, None)  # the stored size where the tag is not read (coco, folders)

    stored = torch.from_numpy(stored_by_pil(path).copy()).permute(2, 0, 1)
    np.testing.assert_array_equal(orient(stored, orientation).permute(1, 2, 0).numpy(), shown)
    stored_box, shown_box = np.array([bright_box(stored_by_pil(path))], float), np.array([bright_box(shown)], float)
    np.testing.assert_array_equal(boxes_to_displayed(stored_box, orientation, STORED), shown_box)
    np.testing.assert_array_equal(boxes_to_stored(shown_box, orientation, size), stored_box)
    as_tensor = boxes_to_stored(torch.tensor(shown_box), orientation, size)
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.tolist() == stored_box.tolist()


@pytest.mark.fast
@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # PIL's, as it opens such a JPEG (its dpi)
@pytest.mark.parametrize("exif", [b"Exif\x00\x00" + b"\x13" * 40, b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff",
                                  b"garbage"], ids=["noise", "truncated-ifd", "no-header"])
def test_a_broken_exif_block_is_orientation_1_not_an_error(tmp_path, exif):
    path = photo(tmp_path / "a.jpg", None, exif=exif)
    assert inspect_oriented(str(path), decode=True) == (STORED, 1, None)


@pytest.mark.fast
@pytest.mark.parametrize("endian", ["<", ">"])
def test_the_tag_is_read_as_pils_exif_reads_it(endian):
    """Both byte orders, the tag among others; an IFD cut before its entry: 1."""
    for value in (*ORIENTATIONS, None):
        tags = Image.Exif()
        tags.endian = endian
        tags[0x010F], tags[0x0110] = "Phone", "Model"  # Make, Model: entries before it
        if value is not None:
            tags[0x0112] = value
        tags[0x0131] = "Software"
        block = tags.tobytes()
        oracle = Image.Exif()
        oracle.load(block)
        assert orientation_of_block(block) == oracle.get(0x0112, 1) == (value or 1)
        assert orientation_of_block(block[6:]) == (value or 1)  # a PNG's or WebP's block: no "Exif" prefix
        if value is not None:
            assert orientation_of_block(block[:6 + 8 + 2 + 12 * 2 + 11]) == 1  # its entry is cut


@pytest.mark.fast
@pytest.mark.parametrize("value", [0, 9, 300])
def test_an_orientation_outside_1_to_8_leaves_the_pixels_as_stored(tmp_path, value):
    """As OpenCV's ApplyExifOrientation and PIL's exif_transpose, which turn nothing for such a value."""
    path = photo(tmp_path / "a.jpg", value)
    assert inspect_oriented(str(path)) == (STORED, 1, None)
    assert shown_by_pil(path).shape[:2] == (STORED[1], STORED[0])


@pytest.mark.fast
def test_png_and_webp_tags_are_read_from_the_header(tmp_path):
    for suffix, options in ((".png", {}), (".webp", {"lossless": True})):
        path = tmp_path / f"a{suffix}"
        tags = Image.Exif()
        tags[0x0112] = 6
        Image.fromarray(np.zeros((50, 100, 3), np.uint8)).save(path, exif=tags, **options)
        assert inspect_oriented(str(path)) == ((50, 100), 6, None)


# ----------------------------------------------------------------------------- the yolo format: the image shown


@pytest.mark.fast
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_a_yolo_box_lands_on_the_drawn_object_and_its_ground_truth_on_the_stored_pixels(tmp_path, orientation):
    shown, box, stored_box = labelled_photo(tmp_path, "a.jpg", orientation)
    records, _ = load_yolo(tmp_path, DataIssues(), keep_empty=True, names=["thing"])
    (record,) = records
    assert (record.orientation, record.width, record.height) == (orientation, shown.shape[1], shown.shape[0])
    assert record.stored_size == STORED

    image, target = DetectionDataset(records)[0]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), shown)  # PIL's exif_transpose, pixel for pixel
    assert target["orig_size"] == shown.shape[:2] and target["orientation"] == orientation
    np.testing.assert_allclose(target["boxes"].numpy(), [box], atol=1e-3)
    x1, y1, x2, y2 = (round(v) for v in target["boxes"][0].tolist())
    assert image[:, y1:y2, x1:x2].float().mean() > 240  # the labelled box holds the white object
    assert image.float().mean() < 80

    truth = coco_ground_truth(records, ["thing"])  # the evaluation's: on the stored pixels, as a COCO file
    x, y, w, h = truth["annotations"][0]["bbox"]
    np.testing.assert_allclose([x, y, x + w, y + h], stored_box, atol=1e-3)
    back = boxes_to_stored(target["boxes"].as_subclass(torch.Tensor), target["orientation"], target["orig_size"][::-1])
    np.testing.assert_allclose(back.numpy(), [stored_box], atol=1e-3)  # a detection on the box, mapped back


@pytest.mark.fast
def test_strict_mode_decodes_and_compares_the_turned_size(tmp_path):
    labelled_photo(tmp_path, "a.jpg", 6)
    (record,) = load_yolo(tmp_path, DataIssues(strict=True), keep_empty=True, names=["thing"])[0]
    assert (record.width, record.height) == (50, 100)

    path = record.path  # a record sized as stored, not as shown: the turned pixels do not fit it
    wrong = DetectionRecord(path=path, width=100, height=50, orientation=6)
    _, target = DetectionDataset([wrong, record])[0]
    assert target["substitute_for"] == 0
    assert target["data_problems"] == [(path, "decodes to 50x100 as shown (EXIF orientation 6), expected 100x50; "
                                              "the next readable sample is used instead")]


@pytest.mark.fast
def test_the_coco_format_keeps_the_stored_pixels(tmp_path):
    """A COCO file gives the stored size and boxes, as pycocotools reads them: the tag is not read."""
    photo(tmp_path / "images" / "a.jpg", 6)
    file = tmp_path / "instances.json"
    file.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 50}],
                                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0,
                                                 "bbox": [10, 5, 20, 15]}],
                                "categories": [{"id": 1, "name": "thing"}]}))
    records, _ = load_coco(tmp_path / "images", file, None, DataIssues(strict=True), keep_empty=True)
    assert (records[0].orientation, records[0].width, records[0].height) == (1, 100, 50)
    image, target = DetectionDataset(records)[0]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), stored_by_pil(tmp_path / "images" / "a.jpg"))
    x1, y1, x2, y2 = (int(v) for v in target["boxes"][0].tolist())
    assert image[:, y1:y2, x1:x2].float().mean() > 240


# ----------------------------------------------------------------------------- a COCO file of yolo images


def coco_of(root: Path, names: list[str], sizes: dict[str, tuple[int, int]], boxes: dict[str, list[float]]) -> Path:
    file = root / "val.json"
    file.write_text(json.dumps({
        "images": [{"id": 10 + k, "file_name": name, "width": sizes[name][0], "height": sizes[name][1]}
                   for k, name in enumerate(names)],
        "annotations": [{"id": k + 1, "image_id": 10 + k, "category_id": 5, "iscrowd": 0, "bbox": boxes[name],
                         "area": 123.0} for k, name in enumerate(names)],
        "categories": [{"id": 5, "name": "thing"}]}))
    return file


@pytest.mark.fast
def test_a_coco_file_of_turned_yolo_images_is_matched_as_shown_and_scored_as_stored(tmp_path):
    names = [f"{n}.jpg" for n in ORIENTATIONS]
    stored_boxes = {name: labelled_photo(tmp_path, name, n)[2] for n, name in zip(ORIENTATIONS, names, strict=True)}
    paths = [str(tmp_path / "images" / name) for name in names]
    records = yolo_records(paths, 1, DataIssues(), keep_empty=True)
    file = coco_of(tmp_path, names, dict.fromkeys(names, STORED),
                   {name: [x1, y1, x2 - x1, y2 - y1] for name, (x1, y1, x2, y2) in stored_boxes.items()})

    taken, category_ids = take_coco_ids(records, ["thing"], file, "data.annotations", DataIssues())
    assert category_ids == [5] and [r.image_id for r in taken] == [10 + k for k in range(8)]
    for before, after in zip(records, taken, strict=True):
        assert (after.orientation, after.width, after.height) == (before.orientation, before.width, before.height)
        np.testing.assert_allclose(after.boxes, before.boxes, atol=1e-3)  # the file's box, turned: the label's
    truth = coco_ground_truth(taken, ["thing"], category_ids)
    assert [a["bbox"] for a in truth["annotations"]] == [[float(v) for v in [x1, y1, x2 - x1, y2 - y1]]
                                                         for x1, y1, x2, y2 in stored_boxes.values()]

    turned = coco_of(tmp_path, names, {name: (50, 100) if n >= 5 else STORED for n, name in zip(ORIENTATIONS, names,
                                                                                               strict=True)},
                     {name: [x1, y1, x2 - x1, y2 - y1] for name, (x1, y1, x2, y2) in stored_boxes.items()})
    with pytest.raises(UserError) as error:  # an entry with the size as shown does not describe the stored pixels
        take_coco_ids(records, ["thing"], turned, "data.annotations", DataIssues())
    assert f"{paths[4]} is 100x50 stored (50x100 as shown, EXIF orientation 5), its entry '5.jpg' (id 14) says " \
           "50x100" in str(error.value)


# ----------------------------------------------------------------------------- data convert


def coco_set(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """A COCO set of one photo of each orientation a split, boxed on its stored pixels; returns each file's box."""
    boxes = {}
    for split in ("train", "val"):
        images, annotations = [], []
        for n in ORIENTATIONS:
            path = photo(root / split / f"{n}.jpg", n, seed=n)
            x1, y1, x2, y2 = boxes[f"{split}/{n}.jpg"] = bright_box(stored_by_pil(path))
            images.append({"id": n, "file_name": f"{n}.jpg", "width": STORED[0], "height": STORED[1]})
            annotations.append({"id": n, "image_id": n, "category_id": 1, "iscrowd": 0,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": float((x2 - x1) * (y2 - y1))})
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        (root / "annotations" / f"{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}))
    return boxes


def test_convert_turns_the_boxes_between_the_stored_pixels_and_the_image_shown(tmp_path):
    source, yolo, back = tmp_path / "photos", tmp_path / "yolo", tmp_path / "back"
    boxes = coco_set(source)
    result = run_main("data", "convert", str(source), "--to", "yolo", "--out", str(yolo))
    assert result.returncode == 0, result.stderr
    for name in boxes:  # each label: the object where PIL shows it, of the size shown
        shown = shown_by_pil(yolo / name)
        assert (yolo / name).read_bytes() == (source / name).read_bytes()  # the image file unchanged
        assert (yolo / name).with_suffix(".txt").read_text() == yolo_line(bright_box(shown), shown.shape[1],
                                                                          shown.shape[0])
    records, _ = load_yolo(yolo / "photos.data", DataIssues(), keep_empty=True, split="valid")
    for record, (image, target) in zip(records, DetectionDataset(records), strict=True):
        x1, y1, x2, y2 = (round(v) for v in target["boxes"][0].tolist())
        assert image[:, y1:y2, x1:x2].float().mean() > 240, record.path  # the same object trained on

    result = run_main("data", "convert", str(yolo), "--to", "coco", "--out", str(back))
    assert result.returncode == 0, result.stderr
    for split in ("train", "val"):
        data = json.loads((back / "annotations" / f"{split}.json").read_text())
        original = json.loads((source / "annotations" / f"{split}.json").read_text())
        assert [(i["id"], i["file_name"], i["width"], i["height"]) for i in data["images"]] == \
               [(i["id"], i["file_name"], i["width"], i["height"]) for i in original["images"]]
        np.testing.assert_allclose([a["bbox"] for a in data["annotations"]],
                                   [a["bbox"] for a in original["annotations"]], atol=1e-3)


# ----------------------------------------------------------------------------- evaluation against the COCO file


def test_a_results_file_of_turned_yolo_images_scores_against_the_coco_file_as_bigbatch_scores_it(tmp_path):
    from bigbatch.config import load_config
    from bigbatch.tasks.detection import DetectionTask

    source, yolo = tmp_path / "photos", tmp_path / "yolo"
    coco_set(source)
    assert run_main("data", "convert", str(source), "--to", "yolo", "--out", str(yolo)).returncode == 0
    file = source / "annotations" / "val.json"
    task = DetectionTask.from_config(load_config("shapes-detect", [
        "data.name=yolo", f"data.path={yolo / 'photos.data'}", f"data.annotations={file}"]))
    truth = [a["bbox"] for a in task.ground_truth["annotations"]]
    np.testing.assert_allclose(truth, [a["bbox"] for a in json.loads(file.read_text())["annotations"]])

    metrics, detections = task.predict(LabelledBoxDetector(task), 4)
    task.save_predictions(tmp_path / "d.json", detections)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools on the file, quietly
        ground_truth = COCO(str(file))
        evaluator = COCOeval(ground_truth, ground_truth.loadRes(str(tmp_path / "d.json")), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    assert metrics["mAP"] == pytest.approx(evaluator.stats[0], abs=1e-6)
    assert evaluator.stats[0] == pytest.approx(1.0)


class LabelledBoxDetector(torch.nn.Module):
    """Answers each validation image, in the order ``detect`` reads them (batches of 4), with its labelled boxes in
    the model's input pixels, as a detector's output is."""

    def __init__(self, task):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))  # ``detect`` asks the parameters for the device
        self.answers = [target for _, targets in eval_batches(task.val_set, 4) for target in targets]

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        targets, self.answers = self.answers[:len(images)], self.answers[len(images):]
        return [{"boxes": torch.as_tensor(t["boxes"]).float(), "labels": torch.as_tensor(t["labels"]),
                 "scores": torch.ones(len(t["labels"]))} for t in targets]


# ----------------------------------------------------------------------------- predict: an image as it is shown


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_a_detector_predicts_on_a_photo_as_it_is_shown(tmp_path, orientation):
    """``predict`` reads a detector's image as Ultralytics and Darknet's OpenCV build read it, its EXIF orientation
    applied (``decode_shown``): a phone photo is not detected sideways, and its boxes are in the shown image's
    pixels. It once read the stored pixels for every run, while a YOLO run's evaluation turns them."""
    from bigbatch.data.pipeline.images import decode_shown
    from bigbatch.data.transforms.det_transforms import eval_transform
    from bigbatch.inference.pipelines import EvalDetection

    path = photo(tmp_path / "p.jpg", orientation)
    shown = decode_shown(str(path))
    np.testing.assert_array_equal(shown.permute(1, 2, 0).numpy(), shown_by_pil(path))
    pipeline = EvalDetection(eval_transform("letterbox", 64))
    image, geometry = pipeline.prepare_file(str(path))
    expected, _ = pipeline.prepare(torch.from_numpy(shown_by_pil(path).copy()).permute(2, 0, 1))
    assert torch.equal(image, expected) and tuple(geometry["orig_size"]) == shown.shape[1:]


def test_a_bitmap_is_read_by_pil_as_darknet_and_ultralytics_read_it(tmp_path):
    """A BMP, which ``predict`` lists among images and Darknet's and Ultralytics' sets may hold, is decoded by PIL
    (torchvision reads none): it was refused as an unsupported format, in a set and in ``predict``."""
    from bigbatch.data.pipeline.images import decode_rgb, decode_shown, inspect_image

    pixels = np.random.default_rng(4).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    path = tmp_path / "a.bmp"
    Image.fromarray(pixels).save(path)
    assert inspect_image(str(path)) == ((50, 30), None)
    for decode in (decode_rgb, decode_shown):
        np.testing.assert_array_equal(decode(str(path)).permute(1, 2, 0).numpy(), pixels)
    broken = tmp_path / "b.bmp"
    broken.write_bytes(path.read_bytes()[:40])
    with pytest.raises(RuntimeError):
        decode_rgb(str(broken))
