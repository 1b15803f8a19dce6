"""``bigbatch data anchors``: Darknet's calc_anchors (glibc's rand(), the k-means on 1 - IoU, the sort, the average IoU,
the printed lines), the cfg it writes (anchors, masks, num, filters: read back, shown and trained a step), and its
refusals. Darknet's own binary is compared in benchmarks/anchors_vs_darknet.py (it is not here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bigbatch.darknet.anchors import GlibcRand, average_iou, fit_anchors, head_masks, kmeans, sample
from tests.helpers import DARKNET_DATA, ROOT, run_main

TINY_SHAPES_CFG = ROOT / "bigbatch" / "configs" / "yolov3-tiny-shapes.cfg"
"""Two [yolo] heads (strides 32 and 16), classes=5."""


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("anchors") / "set"
    result = run_main("data", "shapes", "--out", str(root), "--images", "40", "--seed", "2", "--format", "yolo")
    assert result.returncode == 0, result.stderr
    return root


def clusters(rng: np.random.Generator, centres: list[tuple[float, float]], each: int, jitter: float) -> np.ndarray:
    return np.concatenate([np.array(c) * np.exp(rng.normal(0, jitter, (each, 2))) for c in centres]).astype(np.float32)


@pytest.mark.fast
def test_glibc_rand_is_glibcs():
    """srand(1)'s first numbers are the well-known ones; 0 is taken as 1; a time-sized seed as glibc 2.x draws it
    (printed by a C program calling srand and rand)."""
    assert [GlibcRand(1).rand() for _ in range(1)] == [1804289383]
    rng = GlibcRand(1)
    assert [rng.rand() for _ in range(5)] == [1804289383, 846930886, 1681692777, 1714636915, 1957747793]
    zero = GlibcRand(0)
    assert [zero.rand() for _ in range(3)] == [1804289383, 846930886, 1681692777]
    late = GlibcRand(1764934000)
    assert [late.rand() for _ in range(5)] == [701224434, 1605633159, 160018252, 43447243, 365617808]


@pytest.mark.fast
def test_sample_is_darknets_fisher_yates():
    """sample(n): from the last index down, swap with rand() % (i + 1); a permutation of 0..n-1."""
    rng, expected = GlibcRand(7), list(range(10))
    for i in range(9, -1, -1):
        j = rng.rand() % (i + 1)
        expected[i], expected[j] = expected[j], expected[i]
    assert sample(10, GlibcRand(7)) == expected
    assert sorted(sample(1000, GlibcRand(3))) == list(range(1000))


@pytest.mark.fast
def test_kmeans_finds_known_clusters_sorted_by_area():
    """Three tight clusters of box sizes (relative to a 100 x 200 input): the anchors are their centres, smallest
    area first, and nearly every box's IoU with its anchor is high."""
    rng = np.random.default_rng(0)
    centres = [(40.0, 80.0), (10.0, 10.0), (30.0, 15.0)]  # areas 3200, 100, 450
    boxes = clusters(rng, centres, 200, 0.03)
    fitted = fit_anchors(boxes / np.array([100, 200], np.float32), 3, 100, 200, seed=0, tries=5)
    expected = np.array(sorted(centres, key=lambda c: c[0] * c[1]))
    assert np.allclose(fitted.anchors, expected, rtol=0.03)
    assert fitted.avg_iou > 90
    assert fitted.tries[fitted.seed] == fitted.avg_iou == max(fitted.tries)


@pytest.mark.fast
def test_the_same_seed_gives_the_same_anchors_and_another_may_not():
    rng = np.random.default_rng(1)
    relative = np.exp(rng.normal(-2, 0.6, (500, 2))).clip(0.01, 1).astype(np.float32)
    a = fit_anchors(relative, 9, 416, 416, seed=12)
    b = fit_anchors(relative, 9, 416, 416, seed=12)
    assert np.array_equal(a.anchors, b.anchors) and a.avg_iou == b.avg_iou and a.moves == b.moves
    others = {fit_anchors(relative, 9, 416, 416, seed=s).avg_iou for s in range(13, 20)}
    assert len(others | {a.avg_iou}) > 1  # each seed its own local minimum, as Darknet's runs at other times


@pytest.mark.fast
def test_darknets_kmeans_details():
    """A centre left without boxes stays where it was (kmeans_maximization); a box equally near two centres goes to
    the first; the average IoU is each box's best IoU, in percent."""
    boxes = np.array([[10, 10], [10, 10], [12, 12]], np.float32)
    centers, moves = kmeans(boxes, 3, seed=1)  # two centres start on equal boxes: one of them never gets a box
    assert sorted(map(tuple, centers.tolist())) == [(10, 10), (10, 10), (12, 12)] and moves == 1
    anchors = np.array([[10, 10], [20, 5]], np.float32)
    assert average_iou(np.array([[10, 10]], np.float32), anchors) == 100.0
    assert average_iou(np.array([[10, 10], [10, 5]], np.float32), anchors) == pytest.approx(75.0)
    # (10, 5) against (10, 10): 50/100; against (20, 5): 50/100: a tie, the first's IoU, the same value


@pytest.mark.fast
def test_masks_go_largest_to_the_coarsest_head():
    assert head_masks([32, 16, 8], 9) == [(6, 7, 8), (3, 4, 5), (0, 1, 2)]  # yolov3.cfg's order
    assert head_masks([8, 16, 32], 9) == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]  # yolov4.cfg's order
    assert head_masks([32, 16], 6) == [(3, 4, 5), (0, 1, 2)]  # yolov4-tiny: Darknet's cfg has 3,4,5 / 1,2,3
    assert head_masks([32, 16], 4) == [(2, 3), (0, 1)]


@pytest.mark.fast
def test_the_printed_lines_are_darknets(shapes):
    result = run_main("data", "anchors", str(shapes / "shapes.data"), "--num", "6", "--size", "416x416")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"read \d+ boxes of \d+ images from .*shapes\.data \(train\)", lines[0]), lines[0]
    assert "5 tries, seeds 0 to 4" in lines[1], lines[1]
    assert re.fullmatch(r"avg IoU = \d\d\.\d\d %", lines[2]), lines[2]
    assert re.fullmatch(r"anchors = (?:[ \d]{3},[ \d]{3}, ){5}[ \d]{3},[ \d]{3}", lines[3]), lines[3]
    numbers = [int(v) for v in lines[3].removeprefix("anchors = ").replace(" ", "").split(",")]
    pairs = list(zip(numbers[::2], numbers[1::2], strict=True))
    assert [w * h for w, h in pairs] == sorted(w * h for w, h in pairs)
    again = run_main("data", "anchors", str(shapes), "--num", "6", "--size", "416x416")  # the folder: train/
    assert again.stdout.splitlines()[1:] == lines[1:]
    coco = run_main("data", "anchors", str(shapes / "annotations" / "train.json"), "--num", "6", "--size", "416")
    assert coco.stdout.splitlines()[1:] == lines[1:]  # the same boxes from the COCO file
    one = run_main("data", "anchors", str(shapes / "shapes.data"), "--num", "3", "--size", "32x24", "--tries", "1")
    assert one.returncode == 0, one.stderr
    assert "seed 0, " in one.stdout.splitlines()[1]
    assert re.fullmatch(r"anchors = (?:\d+\.\d{4},\d+\.\d{4}, ){2}\d+\.\d{4},\d+\.\d{4}", one.stdout.splitlines()[3])


def written_cfg(shapes: Path, tmp_path: Path, num: int) -> tuple[Path, list[str]]:
    out = tmp_path / "mine.cfg"
    result = run_main("data", "anchors", str(shapes / "shapes.data"), "--num", str(num), "--cfg",
                      str(TINY_SHAPES_CFG), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result.stdout.splitlines()


@pytest.mark.fast
def test_the_cfg_written_has_the_anchors_masks_num_and_filters_and_is_shown(shapes, tmp_path):
    from bigbatch.darknet import read_darknet_cfg

    out, lines = written_cfg(shapes, tmp_path, 4)  # --size: the cfg's [net], 128x128
    assert "at 128x128" in lines[1] and lines[-1].startswith(f"written to {out}") and "masks 2,3 / 0,1" in lines[-1]
    numbers = [int(v) for v in lines[3].removeprefix("anchors = ").replace(" ", "").split(",")]
    network = read_darknet_cfg(out)
    heads = network.yolo_layers
    assert [yolo.mask for yolo in heads] == [(2, 3), (0, 1)]
    assert all(yolo.num == 4 and [v for a in yolo.anchors for v in a] == numbers for yolo in heads)
    assert [network.layers[yolo.index - 1].filters for yolo in heads] == [2 * (5 + 5)] * 2
    original = TINY_SHAPES_CFG.read_text().split("\n")
    written = out.read_text().split("\n")
    assert written[0].startswith("# anchors by bigbatch data anchors: 4 fitted to")
    assert len(written) == len(original) + 1
    changed = {b.split("=")[0].strip() for a, b in zip(original, written[1:], strict=True) if a != b}
    assert changed == {"mask", "anchors", "num", "filters"}
    shown = run_main("show", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "mask 2,3" in shown.stdout and "mask 0,1" in shown.stdout


@pytest.mark.fast
def test_cfg_takes_a_cfg_bigbatch_ships_by_name_as_the_docs_show(shapes, tmp_path):
    """docs/detection.md's command names the bundled cfg, ``--cfg yolov3-tiny-shapes.cfg``, as ``model.cfg`` may; it
    failed with "cannot read yolov3-tiny.cfg" from any folder but the one holding such a file."""
    by_name = run_main("data", "anchors", str(shapes / "shapes.data"), "--num", "4", "--cfg",
                       TINY_SHAPES_CFG.name, "--out", str(tmp_path / "named.cfg"), cwd=tmp_path)
    assert by_name.returncode == 0, by_name.stderr
    by_path, _ = written_cfg(shapes, tmp_path, 4)
    assert (tmp_path / "named.cfg").read_text().split("\n")[1:] == by_path.read_text().split("\n")[1:]


def test_the_cfg_written_trains_a_step(shapes, tmp_path):
    out, _ = written_cfg(shapes, tmp_path, 4)
    run = tmp_path / "run"
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(run), "--set", f"model.cfg={out}",
                      f"data.path={shapes}", "log.tensorboard=false", "data.workers=0", "batch=8", "data.size=64",
                      "data.multiscale.sizes=null", "steps=1", "eval.every=100", "eval.batch=50")
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(np.isfinite(r.get("loss", np.nan)) for r in records)


@pytest.mark.fast
def test_yolov3s_three_heads_get_darknets_masks(shapes, tmp_path):
    from bigbatch.darknet import read_darknet_cfg

    out = tmp_path / "yolov3-shapes.cfg"
    result = run_main("data", "anchors", str(shapes / "shapes.data"), "--num", "9", "--size", "416x416", "--cfg",
                      str(DARKNET_DATA / "yolov3.cfg"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    heads = read_darknet_cfg(out).yolo_layers
    assert [yolo.mask for yolo in heads] == [(6, 7, 8), (3, 4, 5), (0, 1, 2)]
    assert all(yolo.num == 9 for yolo in heads)


def one_error(result) -> str:
    assert result.returncode == 2 and result.stdout == "", (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.fast
def test_an_existing_out_is_never_written_over(shapes, tmp_path):
    out = tmp_path / "taken.cfg"
    out.write_text("mine\n")
    error = one_error(run_main("data", "anchors", str(shapes / "shapes.data"), "--num", "6", "--cfg",
                               str(TINY_SHAPES_CFG), "--out", str(out)))
    assert error.startswith("error: --out:") and "exists" in error
    assert out.read_text() == "mine\n"


@pytest.mark.fast
def test_a_set_without_boxes_is_refused(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": 10, "height": 10}],
                                 "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    error = one_error(run_main("data", "anchors", str(empty), "--num", "6", "--size", "416x416"))
    assert error.startswith("error: DATA:") and "no boxes" in error
    folder = tmp_path / "yolo"  # a folder of images and labels whose only box is malformed: one line, no warning
    folder.mkdir()
    Image.new("RGB", (20, 10)).save(folder / "a.png")
    (folder / "a.txt").write_text("0 0.5 0.5 3 3\n")
    (folder / "classes.txt").write_text("thing\n")
    error = one_error(run_main("data", "anchors", str(folder), "--num", "1", "--size", "64"))
    assert error.startswith("error: DATA:") and "no boxes (1 problem in the data, the first: " in error, error


@pytest.mark.fast
@pytest.mark.parametrize("num", ["5", "1"])
def test_an_anchor_count_the_heads_cannot_share_is_refused_before_any_work(shapes, tmp_path, num):
    out = tmp_path / "new.cfg"
    error = one_error(run_main("data", "anchors", str(tmp_path / "not-read.data"), "--num", num, "--cfg",
                               str(TINY_SHAPES_CFG), "--out", str(out)))
    assert error.startswith(f"error: --num: {num} anchors cannot be shared equally by the 2 [yolo] heads"), error
    assert not out.exists()


@pytest.mark.fast
@pytest.mark.parametrize(("args", "key"), [
    (["--num", "6"], "--size"),  # neither --size nor --cfg
    (["--num", "6", "--size", "416x"], "--size"),
    (["--num", "0", "--size", "416"], "--num"),
    (["--num", "6", "--size", "416", "--out", "x.cfg"], "--out"),  # --out without --cfg
    (["--num", "6", "--size", "416", "--tries", "0"], "--tries"),
    (["--num", "100000", "--size", "416"], "--num"),  # more anchors than boxes
    (["--num", "257", "--size", "416"], "--num"),  # past any detector's (256 at most), before any work
])
def test_argument_mistakes_are_one_line_naming_the_key(shapes, args, key):
    error = one_error(run_main("data", "anchors", str(shapes / "shapes.data"), *args))
    assert error.startswith(f"error: {key}:"), error


@pytest.mark.fast
def test_a_bad_set_is_named_as_the_commands_data_argument(tmp_path):
    """The readers shared with training name the set ``data:`` (its config key); ``data anchors`` said ``data:`` for
    a YOLO set and ``DATA:`` for a missing one. Both are its DATA argument."""
    bad = tmp_path / "mine.data"
    bad.write_text("x y\n")
    error = one_error(run_main("data", "anchors", str(bad), "--num", "3", "--size", "64"))
    assert error.startswith(f"error: DATA: {bad}:1: expected 'key = value'"), error
    error = one_error(run_main("data", "anchors", str(tmp_path / "absent.json"), "--num", "3", "--size", "64"))
    assert error.startswith("error: DATA: "), error
