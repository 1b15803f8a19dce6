"""bigbatch replaces a single output file only when it proves it wrote that file (``floor/written.py``): the path,
device, inode, size and modification time match a record made as the file was written, and so does its SHA-256.

The oracle of ownership is who made the file in the test: a file the test wrote (another tool's results file, a CSV
starting ``step,lr``, a recipe whose comment names ``bigbatch scale``, a byte-identical copy of bigbatch's own
output) is never overwritten; a file a bigbatch command wrote is replaced by the next one, and no longer once it has
been changed. Every record goes to the test's own cache folder (``BIGBATCH_CACHE_DIR``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from bigbatch.cli import main
from bigbatch.config import load_config
from bigbatch.floor import files, written
from tests.helpers import one_error

pytestmark = pytest.mark.fast

NOT_OURS = "bigbatch did not write it, or it changed since: remove it or choose another path"
DETECTRON2 = b'[{"image_id": 42, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.9}]'
"""The head of a COCO results file detectron2's ``COCOEvaluator`` (or Ultralytics' ``save_json``) writes."""


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """The records of this test, in its own folder (never the user's cache)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(written.CACHE_ENV, str(folder))
    return folder


# ------------------------------------------------------------------------------------------ eval --save-detections
class FakeDetection:
    """A detection task whose model and detections are fixed, so that ``eval`` reaches its output fast; the file is
    written by the real task's writer (``DetectionTask.save_predictions``, an atomic write)."""

    prediction_format = "COCO results"
    predictions_note = ""
    val_set = [0, 1]

    def build_model(self, cfg):
        return nn.Linear(1, 1)

    def predict(self, model, batch, progress=False):
        return {"mAP": 0.5}, [{"image_id": 1, "category_id": 1, "bbox": [0.0, 0.0, 2.0, 2.0], "score": 0.5}]

    def save_predictions(self, path, predictions):
        from bigbatch.tasks.detection import DetectionTask

        DetectionTask.save_predictions(path, predictions)

    def report(self, metrics):
        return f"mAP {metrics['mAP']}"


@pytest.fixture
def detector(tmp_path, monkeypatch) -> Path:
    """A checkpoint of a (fake) detector."""
    import bigbatch.tasks

    monkeypatch.setattr(bigbatch.tasks, "build_task", lambda cfg: FakeDetection())
    path = tmp_path / "detector.pt"
    torch.save({"step": 3, "model": nn.Linear(1, 1).state_dict(),
                "config": load_config("digits").model_dump(mode="json")}, path)
    return path


def test_another_tools_results_file_is_never_overwritten_by_eval(detector, tmp_path, capsys):
    theirs = tmp_path / "coco_instances_results.json"
    theirs.write_bytes(DETECTRON2)
    assert main(["eval", str(detector), "--save-detections", str(theirs)]) == 2
    one_error(capsys, f"--save-detections: {theirs} exists; {NOT_OURS}")
    assert theirs.read_bytes() == DETECTRON2
    assert not (tmp_path / "detector.eval.json").exists(), "refused before any work"


def test_eval_replaces_its_own_results_file_until_it_is_changed(detector, tmp_path, capsys):
    saved = tmp_path / "detections.json"
    assert main(["eval", str(detector), "--save-detections", str(saved)]) == 0, capsys.readouterr().err
    first = saved.read_bytes()
    assert json.loads(first)[0]["image_id"] == 1
    assert main(["eval", str(detector), "--save-detections", str(saved)]) == 0, capsys.readouterr().err
    assert saved.read_bytes() == first and written.is_ours(saved)  # its own: replaced, and recorded again
    capsys.readouterr()

    copy = tmp_path / "copy.json"  # the same bytes at another path: content proves nothing
    shutil.copyfile(saved, copy)
    assert main(["eval", str(detector), "--save-detections", str(copy)]) == 2
    one_error(capsys, f"{copy} exists; {NOT_OURS}")

    with open(saved, "ab") as f:  # the user's edit makes it the user's
        f.write(b"\n")
    assert main(["eval", str(detector), "--save-detections", str(saved)]) == 2
    one_error(capsys, f"{saved} exists; {NOT_OURS}")
    assert saved.read_bytes() == first + b"\n"


# ------------------------------------------------------------------------------------- schedule --csv, --png; scale
def test_schedule_never_overwrites_a_users_csv_or_png_and_replaces_its_own(tmp_path, capsys):
    csv, png = tmp_path / "lr.csv", tmp_path / "lr.png"
    csv.write_bytes(b"step,lr\n0,0.1\n# my notes\n")  # the user's own schedule, in bigbatch's columns
    assert main(["schedule", "digits", "--lines", "1", "--csv", str(csv)]) == 2
    one_error(capsys, f"--csv: {csv} exists")
    assert csv.read_bytes() == b"step,lr\n0,0.1\n# my notes\n"
    csv.unlink()

    assert main(["schedule", "digits", "--lines", "1", "--csv", str(csv), "--png", str(png)]) == 0
    capsys.readouterr()
    rows, image = csv.read_text().splitlines(), png.read_bytes()
    assert rows[0] == "step,lr" and image.startswith(b"\x89PNG") and b"bigbatch schedule" in image
    assert main(["schedule", "digits", "--lines", "1", "--csv", str(csv), "--png", str(png),
                 "--set", "steps=7"]) == 0, capsys.readouterr().err  # its own files: replaced
    assert len(csv.read_text().splitlines()) == 1 + 7
    capsys.readouterr()

    mine = tmp_path / "mine.png"  # a PNG carrying bigbatch's Software text, made by someone else (a copy)
    shutil.copyfile(png, mine)
    assert main(["schedule", "digits", "--lines", "1", "--png", str(mine)]) == 2
    one_error(capsys, f"--png: {mine} exists")
    assert mine.read_bytes() == png.read_bytes()


def test_scale_never_overwrites_a_recipe_that_names_it_and_replaces_its_own(tmp_path, capsys):
    tuned = tmp_path / "tuned.yaml"
    text = "# hand-tuned; started from a file made by bigbatch scale\nbatch: 99\n"
    tuned.write_text(text)
    assert main(["scale", "digits", "--batch", "512", "--out", str(tuned)]) == 2
    one_error(capsys, f"--out: {tuned} exists; {NOT_OURS}")
    assert tuned.read_text() == text

    out = tmp_path / "digits-512.yaml"
    assert main(["scale", "digits", "--batch", "512", "--out", str(out)]) == 0
    assert main(["scale", "digits", "--batch", "1024", "--out", str(out)]) == 0  # its own: replaced
    capsys.readouterr()
    assert "batch: 1024" in out.read_text()
    out.write_text(out.read_text().replace("batch: 1024", "batch: 1000"))  # edited by the user
    assert main(["scale", "digits", "--batch", "512", "--out", str(out)]) == 2
    one_error(capsys, f"--out: {out} exists; {NOT_OURS}")
    assert "batch: 1000" in out.read_text()


# --------------------------------------------------------------------------------------------- the proof itself
def write_recorded(path: Path, data: bytes) -> None:
    files.atomic_write(path, lambda f: f.write(data), record=True)


def test_a_record_proves_one_file_at_one_path_unchanged(tmp_path):
    ours = tmp_path / "out.csv"
    write_recorded(ours, b"step,lr\n0,1\n")
    assert written.is_ours(ours)
    assert written.is_ours(tmp_path / "." / ".." / tmp_path.name / "out.csv")  # another spelling of the path
    st = os.stat(ours)

    # The same bytes, size and modification time in a new file (another inode) put in its place: not ours.
    other = tmp_path / "other"
    other.write_bytes(b"step,lr\n0,1\n")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, ours)
    assert not written.is_ours(ours)

    # Changed in place, its size and modification time put back: the same inode, but the hash differs.
    write_recorded(ours, b"step,lr\n0,1\n")
    st = os.stat(ours)
    with open(ours, "r+b") as f:
        f.write(b"STEP")
    os.utime(ours, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(ours).st_ino, os.stat(ours).st_size, os.stat(ours).st_mtime_ns) == (
        st.st_ino, st.st_size, st.st_mtime_ns)
    assert not written.is_ours(ours)

    # A link at the path to a file bigbatch wrote is not a file bigbatch wrote there.
    write_recorded(ours, b"x")
    link = tmp_path / "link.csv"
    link.symlink_to(ours)
    assert written.is_ours(ours) and not written.is_ours(link)
    assert not written.is_ours(tmp_path / "missing") and not written.is_ours(tmp_path)


def test_records_stay_in_the_cache_folder_chosen_and_a_replaced_files_record_goes_with_it(tmp_path, cache, monkeypatch):
    ours = tmp_path / "a.csv"
    write_recorded(ours, b"1")
    made = sorted(cache.rglob("*.json"))
    assert len(made) == 1 and json.loads(made[0].read_text())["path"] == str(ours)
    before = made[0].read_bytes(), os.stat(made[0]).st_mtime_ns
    assert written.is_ours(ours)
    assert (made[0].read_bytes(), os.stat(made[0]).st_mtime_ns) == before  # a check only reads
    write_recorded(ours, b"2")
    now = sorted(cache.rglob("*.json"))  # a new record, in a new file; the replaced file's record removed
    assert len(now) == 1 and now != made and json.loads(now[0].read_text())["size"] == 1 and written.is_ours(ours)
    other = tmp_path / "b.csv"
    write_recorded(other, b"3")
    for _ in range(3):
        write_recorded(ours, b"4")
    assert len(list(cache.rglob("*.json"))) == 2, "rewriting one output keeps one record; another file's stays"
    assert written.is_ours(ours) and written.is_ours(other)

    monkeypatch.setenv(written.CACHE_ENV, str(tmp_path / "elsewhere"))  # another cache: no record of it there
    assert not written.is_ours(ours)
    monkeypatch.delenv(written.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert written.cache_dir() == tmp_path / "xdg" / "bigbatch"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/not/xdg")  # the XDG rule: only an absolute path counts
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert written.cache_dir() == tmp_path / "home" / ".cache" / "bigbatch"


def test_a_record_that_is_not_one_proves_nothing(tmp_path, cache):
    ours = tmp_path / "a.csv"
    write_recorded(ours, b"1")
    (record,) = cache.rglob("*.json")
    record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": "0" * 64}))
    assert not written.is_ours(ours)
    record.write_bytes(b" " * (written.MAX_RECORD + 1))  # over the bound: not read as a record
    assert not written.is_ours(ours)


def test_a_cache_that_cannot_be_written_is_one_warning_and_the_file_stays_the_users(tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv(written.CACHE_ENV, str(blocked))
    ours = tmp_path / "a.csv"
    write_recorded(ours, b"1")
    assert ours.read_bytes() == b"1"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {ours}: could not record it"), err
    assert not written.is_ours(ours)  # unproven: a later command refuses it (nothing of the user's at risk)


def test_concurrent_writers_each_leave_a_record_that_proves_their_file(tmp_path):
    def writer(n: int) -> None:
        for i in range(20):
            write_recorded(tmp_path / f"w{n}-{i}.csv", f"{n},{i}\n".encode())

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(written.is_ours(tmp_path / f"w{n}-{i}.csv") for n in range(4) for i in range(20))


def test_a_write_is_recorded_only_when_asked(tmp_path, cache):
    plain, asked = tmp_path / "plain.bin", tmp_path / "asked.bin"
    files.atomic_write(plain, lambda f: f.write(b"1"))  # a checkpoint's write: no hash, no record
    with written.recorded(asked):
        files.atomic_write(asked, lambda f: f.write(b"2"))
        files.atomic_write(plain, lambda f: f.write(b"3"))
    files.atomic_write(asked, lambda f: f.write(b"4"))  # after the block: not recorded
    assert not written.is_ours(plain) and not written.is_ours(asked)
    assert len(list(cache.rglob("*.json"))) == 1
