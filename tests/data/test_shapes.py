"""The generated shapes set: valid COCO files, decodable images, tight boxes, determinism."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from bigbatch.data.formats import shapes
from bigbatch.data.formats.shapes import CATEGORY_IDS, CLASSES, render_sample, write_shapes
from bigbatch.errors import UserError


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("shapes")
    return out, write_shapes(out, 40, seed=3)


def test_files_are_valid_coco_with_decodable_images(written: tuple[Path, dict]) -> None:
    out, counts = written
    assert counts["train_images"] == 32 and counts["val_images"] == 8  # val_fraction 0.2
    image_ids: dict[str, set[int]] = {}
    for split in ("train", "val"):
        coco = COCO(str(out / "annotations" / f"{split}.json"))  # pycocotools' own reader and index
        cats = coco.loadCats(coco.getCatIds())
        assert [(c["id"], c["name"]) for c in cats] == list(zip(CATEGORY_IDS, CLASSES, strict=True))
        assert sorted(CATEGORY_IDS) != list(range(len(CLASSES)))  # ids are not labels: remapping is exercised
        assert len(coco.getImgIds()) == counts[f"{split}_images"]
        assert len(coco.getAnnIds()) == counts[f"{split}_boxes"] >= counts[f"{split}_images"]
        image_ids[split] = set(coco.getImgIds())
        for image_id in coco.getImgIds():
            entry = coco.loadImgs(image_id)[0]
            with Image.open(out / split / entry["file_name"]) as im:
                im.load()  # decodes the whole JPEG
                assert im.format == "JPEG" and im.mode == "RGB"
                assert im.size == (entry["width"], entry["height"])
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_id)):
                x, y, w, h = ann["bbox"]
                assert w > 0 and h > 0 and x >= 0 and y >= 0
                assert x + w <= entry["width"] and y + h <= entry["height"]
                assert 0 < ann["area"] <= w * h and ann["iscrowd"] == 0
                assert ann["category_id"] in CATEGORY_IDS
    assert not image_ids["train"] & image_ids["val"]
    assert sorted(image_ids["train"] | image_ids["val"]) == list(range(1, 41))


def test_same_seed_same_bytes_other_seed_other_set(tmp_path: Path, written: tuple[Path, dict]) -> None:
    out, _ = written

    def digests(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    write_shapes(tmp_path / "again", 40, seed=3)
    write_shapes(tmp_path / "other", 40, seed=4)
    assert digests(tmp_path / "again") == digests(out)
    other = digests(tmp_path / "other")
    assert other.keys() == digests(out).keys()
    assert other["annotations/train.json"] != digests(out)["annotations/train.json"]
    assert sum(other[k] != v for k, v in digests(out).items()) == len(other)  # every file differs


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two COCO ``[x, y, w, h]`` boxes intersect."""
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def test_sizes_shapes_and_overlaps_vary() -> None:
    samples = [render_sample(7, i) for i in range(150)]
    areas = [o["area"] for _, objects in samples for o in objects]
    assert min(areas) < 32**2 and any(32**2 <= a < 96**2 for a in areas) and max(areas) >= 96**2  # COCO ranges
    assert {o["label"] for _, objects in samples for o in objects} == set(range(len(CLASSES)))
    image_sizes = {pixels.shape[:2] for pixels, _ in samples}
    assert len(image_sizes) > 10 and any(h != w for h, w in image_sizes)
    assert all(96 <= s <= 160 for size in image_sizes for s in size)  # 128 +- 1/8
    assert len({len(objects) for _, objects in samples}) >= 4
    overlapping = sum(any(overlap(a["bbox"], b["bbox"]) for a in objects for b in objects if a is not b)
                      for _, objects in samples)
    assert 0 < overlapping < len(samples)  # some images have overlapping objects, not all


def flat_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    return np.full((height, width, 3), (90.0, 120.0, 60.0), dtype=np.float32)


def test_box_is_the_extent_of_the_shape_s_visible_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a flat background, the pixels that show a shape are those of its colour: their extent is the box
    and their count the area, also where later shapes hide part of it."""
    monkeypatch.setattr(shapes, "background", flat_background)
    checked = overlapping = hidden = 0
    for index in range(120):
        pixels, objects = render_sample(11, index)
        colours = [o["shape"].colour for o in objects]
        assert len(set(colours)) == len(colours) and (90, 120, 60) not in colours  # the oracle's premise
        for obj in objects:
            ys, xs = np.nonzero((pixels == obj["shape"].colour).all(axis=2))
            extent = [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()]
            assert obj["bbox"] == [float(v) for v in extent], (index, obj)
            assert obj["area"] == len(xs)
            whole = shapes.shape_mask(obj["shape"], *pixels.shape[:2]).sum()  # before others hid part of it
            assert (1 - shapes.MAX_HIDDEN) * whole <= len(xs) <= whole
            hidden += len(xs) < whole
            checked += 1
        shown = (pixels != np.array([90, 120, 60])).any(axis=2).sum()
        assert shown == sum(o["area"] for o in objects)  # the visible parts partition the non-background
        overlapping += any(overlap(a["bbox"], b["bbox"]) for a in objects for b in objects if a is not b)
    assert checked > 200 and overlapping > 10 and hidden > 10


def test_single_shape_box_on_flat_background(monkeypatch: pytest.MonkeyPatch) -> None:
    """One shape alone: its box is the extent of every pixel that differs from the background."""
    monkeypatch.setattr(shapes, "background", flat_background)
    monkeypatch.setattr(shapes, "MAX_SHAPES", 1)
    for index in range(60):
        pixels, objects = render_sample(5, index)
        assert len(objects) == 1
        ys, xs = np.nonzero((pixels != np.array([90, 120, 60])).any(axis=2))
        x, y, w, h = objects[0]["bbox"]
        assert (x, y, x + w, y + h) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)


def test_bad_arguments_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--images: expected a positive number of images, got 0"):
        write_shapes(tmp_path, 0)
    with pytest.raises(UserError, match="val_fraction"):
        write_shapes(tmp_path, 10, val_fraction=1.0)


# --- nothing of the user's is deleted or overwritten (issue 11, case 1) -----------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _train_shapes(data_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    from bigbatch.cli import main

    rc = main(["train", "shapes-detect", "--out", str(data_path.parent / "run"), "--set", f"data.path={data_path}",
               "data.shapes_images=6", "steps=1"])
    return rc, capsys.readouterr().err


def test_a_folder_of_the_users_is_never_taken_for_a_set_to_regenerate(tmp_path: Path, capsys) -> None:
    users = tmp_path / "mine"
    (users / "annotations").mkdir(parents=True)
    (users / "notes.txt").write_text("my notes")
    (users / "annotations" / "train.json").write_text("{}")  # no val.json: looks like an incomplete set
    before = _tree(users)
    rc, err = _train_shapes(users, capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"error: data.path: {users} exists and is not a shapes set")
    assert _tree(users) == before
    assert not (tmp_path / "run").exists()  # stopped before the run directory was made

    from bigbatch.cli import main

    assert main(["data", "shapes", "--out", str(users), "--images", "4"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out: {users} exists and is not a shapes set")
    assert _tree(users) == before


def test_a_generated_set_holding_a_file_of_the_users_is_not_replaced(tmp_path: Path, capsys) -> None:
    root = tmp_path / "shapes"
    write_shapes(root, 6)
    (root / "annotations" / "val.json").unlink()  # as if interrupted: the set is regenerated ...
    (root / "train" / "my-photo.jpg").write_bytes(b"mine")  # ... but a file of the user's is in it
    before = _tree(root)
    rc, err = _train_shapes(root, capsys)
    assert rc == 2 and "my-photo.jpg" in err and err.count("\n") == 1
    assert _tree(root) == before


def test_an_incomplete_generated_set_and_stale_partials_are_replaced(tmp_path: Path) -> None:
    from bigbatch.data.formats.shapes import MARKER, generate_shapes

    root = tmp_path / "shapes"
    write_shapes(root, 6, seed=1)
    (root / "annotations" / "val.json").unlink()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"shapes.partial-{finished.stdout.strip()}"  # a generation killed in its process
    write_shapes(stale, 3)
    live = tmp_path / f"shapes.partial-{os.getpid()}x"  # not of our naming: kept
    live.mkdir()
    counts = generate_shapes(root, 6, seed=2, key="data.path")
    assert counts["train_images"] + counts["val_images"] == 6
    assert json.loads((root / MARKER).read_text())["seed"] == 2
    assert (root / "annotations" / "val.json").is_file()
    assert not stale.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["shapes", live.name])


def test_data_shapes_writes_into_an_empty_folder_and_refuses_a_file(tmp_path: Path, capsys) -> None:
    from bigbatch.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["data", "shapes", "--out", str(empty), "--images", "4"]) == 0
    assert (empty / "annotations" / "val.json").is_file()
    assert main(["data", "shapes", "--out", str(empty), "--images", "5"]) == 0  # its own set: replaced
    assert len(list((empty / "train").iterdir()) + list((empty / "val").iterdir())) == 5
    a_file = tmp_path / "file"
    a_file.write_text("x")
    capsys.readouterr()
    assert main(["data", "shapes", "--out", str(a_file)]) == 2
    assert capsys.readouterr().err == f"error: --out: {a_file} is a file, not a folder\n"
    assert a_file.read_text() == "x"


def test_a_link_to_a_folder_and_an_empty_folder_of_the_users_are_written_in_place(tmp_path: Path, capsys) -> None:
    from bigbatch.cli import main

    real = tmp_path / "on-another-disk"
    real.mkdir()
    real.chmod(0o2770)
    before = real.stat()
    link = tmp_path / "shapes"
    link.symlink_to(real)
    assert main(["data", "shapes", "--out", str(link), "--images", "4"]) == 0
    assert main(["data", "shapes", "--out", str(link), "--images", "5"]) == 0  # its own set, replaced in place
    assert link.is_symlink() and (real / "annotations" / "val.json").is_file()
    assert (real.stat().st_ino, real.stat().st_mode) == (before.st_ino, before.st_mode), "the user's folder stays"
    assert len(list((real / "train").iterdir()) + list((real / "val").iterdir())) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["on-another-disk", "shapes"], "no partial folder left"


@pytest.mark.parametrize("where", ["/proc/bigbatch-shapes", "a-file/under"])
def test_a_place_that_cannot_be_written_is_one_error_line(where: str, tmp_path: Path, capsys) -> None:
    from bigbatch.cli import main

    (tmp_path / "a-file").write_text("x")
    out = where if where.startswith("/") else str(tmp_path / where)
    assert main(["data", "shapes", "--out", out, "--images", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --out: cannot ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_yolo_layout_holds_the_same_boxes_as_the_coco_files(tmp_path):
    """``bigbatch data shapes --format yolo``: read through the ``yolo`` format (the ``.data`` file, Darknet's
    label-beside-image rule), every split has the COCO files' images, labels and boxes (to the 6 decimals)."""
    import numpy as np

    from bigbatch.cli import main
    from bigbatch.config import load_config
    from bigbatch.data.pipeline.problems import DataIssues
    from bigbatch.registry import DATASETS

    out = tmp_path / "set"
    assert main(["data", "shapes", "--out", str(out), "--images", "30", "--format", "yolo"]) == 0
    assert (out / "shapes.names").read_text().split() == list(CLASSES)
    coco = load_config("shapes-detect", [f"data.path={out}"])
    yolo = load_config("shapes-detect", ["data.name=yolo", f"data.path={out / 'shapes.data'}"])
    from_coco = DATASETS.get("shapes").obj(coco, DataIssues(), 0)
    from_yolo = DATASETS.get("yolo").obj(yolo, DataIssues(), 0)
    assert from_yolo[2] == from_coco[2] == list(CLASSES)
    for split in (0, 1):
        a = sorted(from_coco[split], key=lambda r: r.path)
        b = sorted(from_yolo[split], key=lambda r: r.path)
        assert [Path(r.path).resolve() for r in a] == [Path(r.path).resolve() for r in b]
        for ra, rb in zip(a, b, strict=True):
            assert np.array_equal(ra.labels, rb.labels)
            np.testing.assert_allclose(ra.boxes, rb.boxes, atol=1e-6 * 200)
    # the set, YOLO files included, is the generator's own: generating again replaces it
    assert main(["data", "shapes", "--out", str(out), "--images", "10"]) == 0
    assert not (out / "shapes.data").exists() and len(list((out / "train").iterdir())) == 8


def test_a_data_file_or_a_yolo_folder_given_to_the_shapes_format_names_data_name_yolo(tmp_path: Path, capsys,
                                                                                      no_training) -> None:
    """A Darknet cfg run's data default to the shapes set: ``data.path=obj.data`` without ``data.name=yolo`` is one
    line, before any work, saying which format reads it (it was "is a file, not a folder", with no hint)."""
    from bigbatch.cli import main

    data_file = tmp_path / "obj.data"
    data_file.write_text("classes=1\ntrain=train.txt\nvalid=val.txt\nnames=obj.names\n")
    yolo = tmp_path / "yolo"
    (yolo / "images" / "train").mkdir(parents=True)
    for path in (data_file, yolo):
        assert main(["train", "yolov3-tiny-shapes", "--out", str(tmp_path / "run"), "--set", f"data.path={path}"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("error: data.path: "), err
        assert "--set data.name=yolo" in err, err
    assert sorted(p.name for p in yolo.rglob("*")) == ["images", "train"]  # nothing written into it


def test_a_set_of_another_size_already_there_is_used_and_said(tmp_path: Path, capsys) -> None:
    """``data.shapes_images`` sizes a set generated where there is none; a set generated earlier with another size
    is trained on as it is (it may be the one ``data shapes --images N`` made), and the run says so: a small trial
    left a set that every later run took silently, the demo's 2,000 images never generated."""
    root = tmp_path / "shapes"
    shapes.ensure_shapes(root, 20, seed=0)
    assert "generating the shapes set (20 images)" in capsys.readouterr().out
    shapes.ensure_shapes(root, 20, seed=0)
    assert capsys.readouterr().out == ""
    shapes.ensure_shapes(root, 2000, seed=0)
    out = capsys.readouterr().out
    assert out.startswith(f"note: {root} holds a shapes set generated earlier, of 20 images; data.shapes_images "
                          "(2000) is the size of a set generated where there is none"), out
    assert len(list((root / "train").iterdir())) + len(list((root / "val").iterdir())) == 20  # used as it is
