"""Files that a Darknet ``.cfg`` or ``.data`` file names, as hostile input: a ``.cfg``'s ``tree=`` is read only from
the current folder, beside the cfg or in its parent folder, never outside them (not through ``..`` or a link), and an
error about it names the line, never quotes it; every file a ``.data`` file names (names, image lists, label files)
is read only as a regular file, without blocking, within bounds on its size, lines and boxes; a names file outside
the ``.data`` file's folder becomes class names only with a ``classes =`` line; a ``[yolo]`` layer builds its
prediction-truth IoUs for at most its ``max`` truths an image, however many boxes a label file gave.

Each case goes through ``bigbatch.cli.main``; those where a file is a FIFO or a link to ``/dev/zero`` (which the code
before waited on forever, or read until memory ran out) run in one child process, under a memory limit and the suite's
hang guard, so that a regression fails instead of stopping the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bigbatch.darknet import yolo_delta, yolo_loss
from bigbatch.darknet.cfg import Yolo
from bigbatch.darknet.layers.classify import MAX_TREE_CLASSES
from bigbatch.darknet.yolo_data import (
    DATA_FILE_LIMIT,
    MAX_CLASS_NAMES,
    MAX_LABEL_BOXES,
    MAX_LISTED_IMAGES,
    NAMES_FILE_LIMIT,
)
from bigbatch.data.pipeline.files import LINE_LIMIT, BadLine, read_lines
from tests.helpers import HANG_GUARD_S, ROOT, run_main

SECRET = "password swordfish-SECRET x"
"""The second line of a file of the user's that a hostile cfg or .data file names: it must never be printed."""

CLASSIFIER = """[net]
width=8
height=8
channels=3

[convolutional]
filters=6
size=1
stride=1
pad=1
activation=linear

[avgpool]

[softmax]
tree={tree}
"""


def secret_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"a -1\n{SECRET}\n")
    return path


def classifier(tmp_path: Path, tree: str) -> Path:
    """``tmp_path/proj/cfg/c.cfg`` whose ``[softmax]`` names ``tree``; ``tmp_path/secret.txt`` is outside the three
    folders a cfg's file is looked up in (the current folder is the cfg's in these tests)."""
    secret_file(tmp_path / "secret.txt")
    cfg = tmp_path / "proj" / "cfg" / "c.cfg"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(CLASSIFIER.format(tree=tree))
    return cfg


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, (
        result.returncode, result.stderr)
    assert "swordfish" not in result.stdout + result.stderr
    return result.stderr


# -------------------------------------------------------------------------------------------- the bounded line reader


@pytest.mark.fast
def test_read_lines_bounds_lines_and_their_length_and_never_quotes_them(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\n\nthree")
    assert list(read_lines(path, 4, "a list")) == [(1, "one"), (2, "two"), (3, ""), (4, "three")]
    with pytest.raises(BadLine, match=r"f\.txt:4: more than 3 lines, the most a list may have") as raised:
        list(read_lines(path, 3, "a list"))
    assert raised.value.line == 4
    path.write_bytes(b"ok\n" + b"x" * 11 + b"\n")
    with pytest.raises(BadLine, match=r"f\.txt:2: a line longer than 10 bytes, the longest a list may have"):
        list(read_lines(path, 5, "a list", max_line=10))
    path.write_bytes(b"ok\nswordfish\xff\n")
    with pytest.raises(BadLine) as raised:
        list(read_lines(path, 5, "a list"))
    assert str(raised.value) == f"{path}:2: not UTF-8 text"


# ---------------------------------------------------------------------------------------- kind 1: a file a .cfg names


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "link beside the cfg", "link to a folder"])
def test_a_tree_file_outside_the_cfgs_folders_is_refused_unread(tmp_path, how):
    cfg_folder = tmp_path / "proj" / "cfg"
    cfg_folder.mkdir(parents=True)
    tree = {"absolute": str(tmp_path / "secret.txt"), "dot-dot": "../../secret.txt",
            "link beside the cfg": "t.tree", "link to a folder": "data/secret.txt"}[how]
    if how == "link beside the cfg":
        (cfg_folder / "t.tree").symlink_to(tmp_path / "secret.txt")
    if how == "link to a folder":
        (tmp_path / "proj" / "data").symlink_to(tmp_path)  # proj/data/secret.txt is tmp_path/secret.txt
    cfg = classifier(tmp_path, tree)
    error = one_error_line(run_main("show", str(cfg), cwd=cfg_folder))
    assert f"c.cfg:16: [softmax] tree: {tree} leads outside the folders a cfg's files are read from" in error


def test_a_tree_file_where_darknet_users_keep_it_is_read(tmp_path):
    """From the current folder, beside the cfg, in its parent (also as ``../data/t.tree``, which stays inside it)."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "t.tree").write_text("a -1\nb -1\nc 0\nd 0\ne 1\n")  # 2 + 2 + 1 classes, as the 6 outputs need
    (proj / "cfg").mkdir()
    (proj / "cfg" / "here.tree").write_text("a -1\nb 0\n")
    (proj / "cfg" / "inside.tree").symlink_to(proj / "data" / "t.tree")  # a link that stays inside: followed
    for tree, cwd in (("data/t.tree", proj), ("data/t.tree", proj / "cfg"), ("../data/t.tree", proj / "cfg"),
                      ("here.tree", tmp_path), ("inside.tree", proj / "cfg")):
        cfg = classifier(tmp_path, tree)
        result = run_main("show", str(cfg), cwd=cwd)
        assert result.returncode == 0 and f"tree {tree}" in result.stdout, (tree, result.stderr)


def test_a_mistake_in_a_tree_file_names_its_line_and_never_quotes_it(tmp_path):
    tree = secret_file(tmp_path / "proj" / "cfg" / "bad.tree")
    cfg = classifier(tmp_path, "bad.tree")
    error = one_error_line(run_main("show", str(cfg), cwd=cfg.parent))
    assert error == (f"error: {cfg}:16: [softmax] tree: {tree}:2: expected 'name parent' (a class name, then its "
                     "parent's index or -1)\n")


def test_a_tree_file_of_too_many_lines_is_refused(tmp_path):
    (tmp_path / "proj" / "cfg").mkdir(parents=True)
    (tmp_path / "proj" / "cfg" / "long.tree").write_text("a -1\n" * (MAX_TREE_CLASSES + 1))
    cfg = classifier(tmp_path, "long.tree")
    error = one_error_line(run_main("show", str(cfg), cwd=cfg.parent))
    assert f"long.tree:{MAX_TREE_CLASSES + 1}: more than 65,536 lines, the most a WordTree file may have" in error


# ------------------------------------------------------------------------------- kind 2: the files a .data file names


def yolo_set(root: Path, data: str = "classes = 2\ntrain = train.txt\nvalid = train.txt\nnames = x.names\n") -> Path:
    """``root/set``: two 100x50 images with one box each, their label files, ``x.names`` (2 classes), ``train.txt``
    and ``x.data`` (``data``); the ``.data`` file's path."""
    folder = root / "set"
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir()
    for n, name in enumerate("ab"):
        pixels = np.random.default_rng(n).integers(0, 256, (50, 100, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "images" / f"{name}.jpg", quality=95)
        (folder / "labels" / f"{name}.txt").write_text(f"{n} 0.5 0.5 0.2 0.2\n")
    (folder / "x.names").write_text("circle\nsquare\n")
    (folder / "train.txt").write_text("images/a.jpg\nimages/b.jpg\n")
    (folder / "x.data").write_text(data)
    return folder / "x.data"


def show(data: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``bigbatch show`` of the YOLO recipe on ``data``, which reads the training split (its labels, to count the
    images), from the ``.data`` file's folder."""
    return run_main("show", "yolov3-tiny-shapes", "--set", "data.name=yolo", f"data.path={data}", *overrides,
                    cwd=data.parent)


@pytest.mark.parametrize("how", ["beside", "link inside"])
def test_a_names_file_outside_the_data_folder_without_classes_is_refused(tmp_path, how):
    """Its lines would become the class names that training prints (the evaluation's table, the metrics' keys)."""
    outside = tmp_path / "elsewhere" / "secret.names"
    outside.parent.mkdir()
    outside.write_text(f"{SECRET}\nsquare\n")
    names = "../elsewhere/secret.names" if how == "beside" else "x.names"
    data = yolo_set(tmp_path, f"train = train.txt\nvalid = train.txt\nnames = {names}\n")
    if how == "link inside":
        (data.parent / "x.names").unlink()
        (data.parent / "x.names").symlink_to(outside)
    error = one_error_line(show(data))
    assert error == (f"error: data: {data}: names = {names} is outside the .data file's folder ({data.parent}); such a "
                     "names file is read only with a 'classes =' line giving its number of classes\n")
    # with the count given, as every .data file of Darknet's own gives it: Darknet's layout (data/coco.names) is read
    data.write_text(f"classes = 2\ntrain = train.txt\nvalid = train.txt\nnames = {names}\n")
    result = show(data)
    assert result.returncode == 0 and "(of 2 training images)" in result.stdout, result.stderr
    data.write_text(f"classes = 3\ntrain = train.txt\nvalid = train.txt\nnames = {names}\n")
    assert one_error_line(show(data)).endswith("classes = 3, but the names file lists 2 names\n")


@pytest.mark.parametrize("what", ["names bytes", "names lines", "data bytes", "list lines", "list line length"])
def test_the_files_a_data_file_names_are_bounded_before_they_are_read(tmp_path, what):
    """Each bound is one error line naming the file (and its line), before memory is spent on what is past it: a
    names file of 100 MB (or of many short lines: 2 classes picked from such a file took 3.4 GiB), an image list of
    millions of lines (10^7 took over 4 GiB), a line without end, a .data file that is no .data file."""
    data = yolo_set(tmp_path)
    folder = data.parent
    overrides: list[str] = []
    if what == "names bytes":
        with open(folder / "x.names", "ab") as f:
            f.truncate(100 * 2**20)  # sparse: no disk
        fragment = f"x.names is 104,857,600 bytes, more than the {NAMES_FILE_LIMIT:,} a names file may be"
    elif what == "names lines":
        (folder / "x.names").write_text("circle\nsquare\n" + "x\n" * MAX_CLASS_NAMES)
        data.write_text("train = train.txt\nvalid = train.txt\nnames = x.names\n")
        overrides = ["data.classes=[circle,square]"]
        fragment = f"x.names:{MAX_CLASS_NAMES + 1}: more than 65,536 lines, the most a names file may have"
    elif what == "data bytes":
        with open(data, "ab") as f:
            f.truncate(DATA_FILE_LIMIT + 1)
        fragment = f"is {DATA_FILE_LIMIT + 1:,} bytes, more than the {DATA_FILE_LIMIT:,} a .data file may be"
    elif what == "list lines":
        (folder / "train.txt").write_text("images/a.jpg\n" + "\n" * MAX_LISTED_IMAGES)
        fragment = f"train.txt:{MAX_LISTED_IMAGES + 1}: more than 2,097,152 lines, the most an image list may have"
    else:
        (folder / "train.txt").write_text("images/a.jpg\n" + "a" * (LINE_LIMIT + 1))
        fragment = "train.txt:2: a line longer than 4,096 bytes, the longest an image list may have"
    error = one_error_line(show(data, *overrides))
    assert error.startswith("error: data: ") and fragment in error, error


def test_a_folder_of_more_images_than_a_split_may_have_is_refused(tmp_path, monkeypatch):
    """``valid =`` (or ``train =``) naming a folder: its images are counted as they are listed (2 images against a
    bound of 1 here, where the real one, 2,097,152, would take minutes to write)."""
    from bigbatch.darknet import yolo_data

    data = yolo_set(tmp_path, "classes = 2\ntrain = images\nvalid = images\nnames = x.names\n")
    monkeypatch.setattr(yolo_data, "MAX_LISTED_IMAGES", 1)
    error = one_error_line(show(data))
    assert error == f"error: data: {data.parent / 'images'} holds more than 1 images, the most one split may have\n"


def test_a_name_no_system_can_open_is_not_found_rather_than_a_traceback(tmp_path):
    """A list's entry with a 300-character name (past the 255 a file name may have) and a names file whose name holds
    a NUL: the code before let the system's error through as a traceback."""
    data = yolo_set(tmp_path)
    long_name = "x" * 300 + ".jpg"
    (data.parent / "train.txt").write_text(f"images/a.jpg\n{long_name}\n")
    result = show(data)
    assert result.returncode == 0 and "(of 1 training images)" in result.stdout, result.stderr
    assert f"warning: {data.parent / long_name}: image not found" in result.stderr
    data.write_text("classes = 2\ntrain = train.txt\nnames = x\0.names\n")
    assert "names = x\0.names: no such file (tried from the current folder and from" in one_error_line(show(data))


def test_a_label_file_of_a_million_boxes_gives_its_first_ones_and_a_warning(tmp_path):
    data = yolo_set(tmp_path)
    label = data.parent / "labels" / "b.txt"
    label.write_text("1 0.5 0.5 0.2 0.2\n" * 10**6)
    result = show(data)
    assert result.returncode == 0 and "(of 2 training images)" in result.stdout, result.stderr
    assert (f"warning: {label}:{MAX_LABEL_BOXES + 1}: more than 4,096 lines: the boxes from this line on are skipped "
            "(a label file gives at most 4,096)") in result.stderr
    from bigbatch.darknet.yolo_data import load_yolo
    from bigbatch.data.pipeline.problems import DataIssues

    records, _ = load_yolo(data, DataIssues(), keep_empty=True)
    assert [len(r.boxes) for r in records] == [1, MAX_LABEL_BOXES]


def test_a_label_line_that_is_not_numbers_is_reported_without_its_content(tmp_path):
    data = yolo_set(tmp_path)
    label = data.parent / "labels" / "b.txt"
    label.write_text(f"1 0.5 0.5 0.2 0.2\n{SECRET} 0 0\n")
    result = show(data)
    assert result.returncode == 0, result.stderr
    assert (f"warning: {label}:2: malformed label line: expected numbers '<class> <xc> <yc> <w> <h>', field 1 is not a "
            "number") in result.stderr and "swordfish" not in result.stderr + result.stdout


# ---------------------------------------------------------------------------- FIFOs and /dev/zero, in a child process


CHILD = """
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
from tests.helpers import run_main
results = []
for cwd, args in json.loads(sys.argv[1]):
    result = run_main(*args, cwd=Path(cwd))
    results.append([result.returncode, result.stdout, result.stderr])
print(json.dumps(results))
""".replace("CHILD_MEMORY", str(4 * 2**30))
"""Runs ``bigbatch.cli.main`` on each ``(cwd, args)`` case with its address space limited to 4 GiB (a read of
``/dev/zero`` ends in a MemoryError there, not in the machine's memory running out); its results as JSON."""


def test_fifos_and_links_to_dev_zero_are_refused_unread(tmp_path):
    """A FIFO waits for a writer forever when opened for reading; ``/dev/zero`` never ends. Named by a cfg's ``tree=``
    or a .data file's ``names=`` or ``train=``: one error line; as an image's label file: the image is skipped with a
    warning."""
    cases, expected = [], []
    cfg = classifier(tmp_path / "cfg", "fifo.tree")
    os.mkfifo(cfg.parent / "fifo.tree")
    cases.append([str(cfg.parent), ["show", str(cfg)]])
    expected.append(("error", f"tree: cannot read {cfg.parent / 'fifo.tree'}: {cfg.parent / 'fifo.tree'} is not a "
                              "regular file"))
    for n, (key, kind) in enumerate((("names", "fifo"), ("names", "zero"), ("train", "fifo"), ("label", "fifo"),
                                     ("label", "zero"))):
        data = yolo_set(tmp_path / str(n))
        file = {"names": data.parent / "x.names", "train": data.parent / "train.txt",
                "label": data.parent / "labels" / "b.txt"}[key]
        file.unlink()
        if kind == "fifo":
            os.mkfifo(file)
        else:
            file.symlink_to("/dev/zero")
        cases.append([str(data.parent), ["show", "yolov3-tiny-shapes", "--set", "data.name=yolo",
                                         f"data.path={data}"]])
        what = {"names": "names file", "train": "the image list"}.get(key)
        expected.append(("warning", f"warning: {file}: unreadable label file: {file} is not a regular file")
                        if key == "label" else ("error", f"error: data: cannot read {what} {file}: {file} is not a "
                                                         "regular file"))
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], cwd=ROOT, capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    assert child.returncode == 0, child.stderr[-3000:]
    for (returncode, stdout, stderr), (outcome, fragment) in zip(json.loads(child.stdout), expected, strict=True):
        if outcome == "error":
            assert returncode == 2 and stderr.count("\n") == 1 and fragment in stderr, (fragment, stderr)
        else:
            assert returncode == 0 and fragment in stderr and "(of 1 training images)" in stdout, (fragment, stderr)


# ----------------------------------------------------------------------------------- the [yolo] layer's per-image cap


def yolo_spec(max_boxes: int) -> Yolo:
    return Yolo(index=0, section="yolo", line=1, classes=2, num=3, mask=(0, 1, 2), max_boxes=max_boxes,
                anchors=((4.0, 5.0), (8.0, 6.0), (10.0, 12.0)), lines={"max": 2})


@pytest.mark.fast
@pytest.mark.parametrize("dialect", ["alexeyab", "pjreddie", "gradient"])
def test_a_yolo_layer_builds_its_ious_for_its_max_truths_not_for_every_box(monkeypatch, dialect):
    """An image of 20,000 boxes (a label file's 4,096 lines, or a caller's own targets) under ``max=5``: the IoUs of
    every prediction with every truth are built for 5 truths an image (the code before built them for all, 44 GB for
    10^6 boxes on a large grid), and the loss, its gradient and the delta equal those of the first 5 boxes alone."""
    spec = yolo_spec(5)
    generator = torch.Generator().manual_seed(0)
    n, truths = 2, 20_000
    boxes = torch.rand(n, truths, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.25
    labels = torch.randint(0, 2, (n, truths), generator=generator)
    valid = torch.ones(n, truths, dtype=torch.bool)
    valid[0, 1] = False  # a hole: the first 5 valid ones are boxes 0, 2, 3, 4, 5
    raw = torch.randn(n, 3 * 7, 4, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    sizes: list[int] = []
    module = yolo_loss if dialect == "gradient" else yolo_delta
    real = module._pairwise_iou
    monkeypatch.setattr(module, "_pairwise_iou", lambda a, b: sizes.append(b.shape[1]) or real(a, b))

    def terms(boxes, labels, valid):
        if dialect == "gradient":
            found = yolo_loss.yolo_layer_loss(raw, spec, yolo_loss.Truths(boxes.float(), labels, valid), (32, 32))
        else:
            found = yolo_delta.layer_loss(raw, spec, boxes, labels, valid, (32, 32), dialect, 1.0)
        total = sum(found.values())
        (grad,) = torch.autograd.grad(total, raw)
        return [float(v.detach()) for v in found.values()], grad

    many = terms(boxes, labels, valid)
    assert sizes == [5]
    first = torch.tensor([[0, 2, 3, 4, 5], [0, 1, 2, 3, 4]])
    few = terms(boxes.gather(1, first[..., None].expand(-1, -1, 4)), labels.gather(1, first),
                torch.ones(n, 5, dtype=torch.bool))
    assert many[0] == pytest.approx(few[0], rel=1e-12)
    torch.testing.assert_close(many[1], few[1], rtol=1e-12, atol=1e-12)


def test_training_on_a_label_file_of_a_million_boxes_builds_ious_for_max_truths(tmp_path, monkeypatch):
    """The run the code before ended in a traceback (a 44 GB allocation): the label file gives its first 4,096 boxes,
    with a warning, and each ``[yolo]`` layer builds its prediction-truth IoUs for at most its ``max=`` (200)."""
    data = yolo_set(tmp_path)
    (data.parent / "labels" / "b.txt").write_text("1 0.5 0.5 0.2 0.2\n" * 10**6)
    truths: list[int] = []
    real = yolo_delta._pairwise_iou
    monkeypatch.setattr(yolo_delta, "_pairwise_iou", lambda a, b: truths.append(b.shape[1]) or real(a, b))
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(tmp_path / "run"), "--set", "data.name=yolo",
                      f"data.path={data}", "data.annotations=null", "data.size=64", "batch=2", "steps=1",
                      "eval.every=1", "data.workers=0", "log.tensorboard=false", cwd=data.parent)
    assert result.returncode == 0, result.stderr
    assert "more than 4,096 lines: the boxes from this line on are skipped" in result.stderr
    assert truths and max(truths) == 200
