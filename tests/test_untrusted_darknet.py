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

import subprocess
from pathlib import Path

import pytest

from bigbatch.darknet.layers.classify import MAX_TREE_CLASSES
from bigbatch.data.files import BadLine, read_lines
from tests.helpers import run_main

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
