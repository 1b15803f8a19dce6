"""``predict --out DIR`` again (``inference/outputs.py``): an earlier predict's files are replaced only while each is
still exactly what it wrote (its identity in ``.bigbatch-predict``, a list recorded as bigbatch's as it is closed);
a file edited since, a list edited, copied or left by a predict cut short, or a list that is no regular file is one
``UserError`` naming it, before anything is removed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bigbatch.errors import UserError
from bigbatch.inference.outputs import MARKER, Outputs, check_out_dir


def _predict(out: Path, *names: str, finish: bool = True) -> Outputs:
    outputs = Outputs(out, ["a"], "detection", txt=True)
    outputs.open()
    for name in names:
        outputs.add({"file": f"images/{name}.png", "frame": None, "width": 10, "height": 10,
                     "detections": [{"box": [1.0, 1.0, 5.0, 5.0], "class_id": 0, "class_name": "a",
                                     "score": 0.9}]}, None)
    if finish:
        outputs.close()
    return outputs


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_earlier_predicts_unchanged_files_are_replaced_and_an_edited_one_is_refused(tmp_path):
    out = tmp_path / "pred"
    _predict(out, "0", "1")
    assert sorted(p.name for p in (out / "labels").iterdir()) == ["0.txt", "1.txt"]
    _predict(out, "1")  # unchanged: replaced, 0.txt removed
    assert sorted(p.name for p in (out / "labels").iterdir()) == ["1.txt"]
    edited = out / "labels" / "1.txt"
    edited.write_text("0 0.5 0.5 0.2 0.2\n")  # corrected by hand
    before = _contents(out)
    with pytest.raises(UserError) as refused:
        _predict(out, "2")
    assert str(refused.value) == (f"--out: {edited} is not a file an earlier bigbatch predict wrote there, unchanged "
                                  "since (edited since, or put there by anything else); nothing removed: choose a new "
                                  "or empty folder, or move the file away")
    assert _contents(out) == before


def test_a_list_that_is_not_a_finished_predicts_own_is_refused_and_nothing_removed(tmp_path):
    out = tmp_path / "pred"
    _predict(out, "0")
    marker = out / MARKER
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # a folder handed over: the same list and files, not recorded as they are there
    with open(marker, "ab") as edited:  # a line added by hand, naming a file of the user's
        edited.write(b'{"name": "notes.txt", "device": 0, "inode": 0, "size": 0, "mtime_ns": 0, "sha256": ""}\n')
    cut = tmp_path / "cut"
    _predict(cut, "0", finish=False)  # a predict cut short: its list never closed
    for folder in (out, copy, cut):
        before = _contents(folder)
        with pytest.raises(UserError, match=f"^--out: {folder / MARKER} is not the list of files a finished "):
            check_out_dir(folder)
        assert _contents(folder) == before


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "folder"])
def test_a_list_that_is_no_regular_file_is_refused_without_reading_it(tmp_path, kind):
    out = tmp_path / "pred"
    out.mkdir()
    (out / "predictions.jsonl").write_text("mine\n")
    marker = out / MARKER
    if kind == "fifo":
        os.mkfifo(marker)
    elif kind == "folder":
        marker.mkdir()
        (marker / "x").write_text("mine\n")
    else:
        marker.symlink_to("/dev/zero")
    with pytest.raises(UserError, match=f"^--out: {marker} is not the list"):
        check_out_dir(out)
    assert (out / "predictions.jsonl").read_text() == "mine\n"
