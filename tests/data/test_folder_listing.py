"""Listing an image folder (``data.name: folder`` and ``bigbatch pack``), issue 23 kind 2: folders and links to
folders are listed as torchvision's ``ImageFolder`` lists them, except that a cycle of links is refused with one line
naming the link and anything that is not a regular file is skipped with a warning; nothing is read without a size
bound. And kind 10: the partial folders of a killed ``pack`` are removed by the next pack to the same ``--out``, only
those of its own naming and with its marker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from bigbatch.data.formats.folder import find_classes, list_samples
from bigbatch.data.formats.pack import PARTIAL_MARK
from bigbatch.data.formats.shard_index import read_index
from bigbatch.data.pipeline.files import IMAGE_FILE_LIMIT, read_regular
from bigbatch.errors import UserError
from tests.helpers import HANG_GUARD_S, run_main, write_photo_folder


@pytest.fixture
def photos(tmp_path) -> Path:
    return write_photo_folder(tmp_path / "set", train=2, val=1)


def listed(split: Path) -> list[tuple[str, int]]:
    return list_samples(split, find_classes(split))


def test_folders_and_links_to_folders_are_listed_as_imagefolder_lists_them(photos, tmp_path):
    train = photos / "train"
    (train / "china" / "deeper" / "deepest").mkdir(parents=True)
    (train / "flower" / "000.jpg").rename(train / "china" / "deeper" / "deepest" / "moved.jpg")
    (tmp_path / "elsewhere").mkdir()
    (train / "flower" / "001.jpg").rename(tmp_path / "elsewhere" / "linked.jpg")
    (train / "flower" / "outside").symlink_to(tmp_path / "elsewhere")  # a link to a folder outside: followed
    (train / "upside_down" / "again").symlink_to(train / "china" / "deeper")  # the same folder twice, no cycle
    (train / "china" / "notes.txt").write_text("not an image")
    expected = make_dataset(str(train), {c: i for i, c in enumerate(find_classes(train))}, IMG_EXTENSIONS)
    assert listed(train) == expected
    assert len(expected) == 9  # 8, two moved away and back, and the moved one again through the link


def test_a_link_leading_outside_the_set_is_refused_unless_follow_links(photos, tmp_path):
    """A folder set is read only inside data.path, as every other user folder is (coco, pack, convert): a link to a
    file or a folder elsewhere is one error naming it and the opt-in, before any image is read. data.follow_links:
    true reads it, as torchvision's ImageFolder does; a link that stays inside the set is read either way."""
    from bigbatch.config import load_config
    from bigbatch.data.formats.folder import load

    (tmp_path / "elsewhere").mkdir()
    secret = tmp_path / "elsewhere" / "secret.jpg"
    (photos / "train" / "flower" / "001.jpg").rename(secret)
    (photos / "train" / "china" / "inside.jpg").symlink_to(photos / "train" / "flower" / "000.jpg")
    base = ["data.name=folder", f"data.path={photos}"]
    assert len(load(load_config("digits", base))[0]) == 8  # the link inside: read

    for link, target, named in (("flower/001.jpg", secret, "flower/001.jpg"),
                                ("flower/shared", tmp_path / "elsewhere", "flower/shared/secret.jpg")):
        for old in (photos / "train" / "flower" / "001.jpg", photos / "train" / "flower" / "shared"):
            if old.is_symlink():
                old.unlink()
        (photos / "train" / link).symlink_to(target)
        with pytest.raises(UserError) as error:
            load(load_config("digits", base))
        assert str(error.value) == (
            f"data.path: {photos / 'train' / named} leads outside {photos} (links and .. followed); a folder set is "
            "read only inside data.path. If the links are yours (a set of links to a shared store), set "
            "data.follow_links=true to read what they lead to")
        train, _, _ = load(load_config("digits", [*base, "data.follow_links=true"]))
        assert str(photos / "train" / named) in [path for path, _ in train.samples]
    # pack refuses it the same way, with no opt-in: shards may be shared
    result = run_main("pack", str(photos), "--out", str(tmp_path / "shards"))
    assert result.returncode == 2 and "flower/shared/secret.jpg leads outside" in result.stderr, result.stderr


def test_follow_links_is_a_key_of_the_folder_format_only(photos):
    from bigbatch.config import load_config

    with pytest.raises(UserError, match="follow_links"):
        load_config("digits", ["data.follow_links=true"])


@pytest.mark.parametrize("loops", [["china/loop -> ."], ["china/up -> ..", "flower/a/b -> ../.."],
                                   ["china/l1 -> .", "china/sub/l2 -> .."]])
def test_a_cycle_of_links_is_one_line_naming_the_link(photos, tmp_path, loops):
    train = photos / "train"
    for loop in loops:
        link, target = loop.split(" -> ")
        (train / link).parent.mkdir(parents=True, exist_ok=True)
        (train / link).symlink_to(target)
    with pytest.raises(UserError, match=r"leads back to .*: a cycle of links, which no listing ends; remove the link"):
        listed(train)
    # the same through both commands: one error line, exit 2, nothing written
    result = run_main("pack", str(photos), "--out", str(tmp_path / "shards"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "leads back to" in result.stderr and "cycle of links" in result.stderr
    assert not (tmp_path / "shards").exists()
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", "data.name=folder",
                      f"data.path={photos}", "data.size=32", "steps=1")
    assert result.returncode == 2 and result.stderr.startswith("error: data.path: "), result.stderr
    assert result.stderr.count("\n") == 1 and "cycle of links" in result.stderr


def test_what_is_not_a_regular_file_is_skipped_with_a_warning_and_never_read(photos, tmp_path, capsys):
    china = photos / "train" / "china"
    os.mkfifo(china / "fifo.jpg")  # reading it would wait for a writer forever
    (china / "zero.jpg").symlink_to("/dev/zero")  # reading it would never end
    (china / "nothing.png").symlink_to(tmp_path / "absent")
    (china / "folder.jpg").mkdir()  # a folder with an image's name: walked, holds nothing
    samples = listed(photos / "train")
    names = [Path(path).name for path, _ in samples]
    assert not {"fifo.jpg", "zero.jpg", "nothing.png"} & set(names) and len(samples) == 8
    err = capsys.readouterr().err
    for name, kind in (("fifo.jpg", "a FIFO"), ("zero.jpg", "a character device"),
                       ("nothing.png", "a link to nothing")):
        assert f"warning: {china / name}: {kind}, not an image file: skipped" in err, err
    result = run_main("pack", str(photos), "--out", str(tmp_path / "shards"), "--shard-size", "20000")
    assert result.returncode == 0, result.stderr
    assert len(read_index(tmp_path / "shards").train) == 8
    assert "fifo.jpg: a FIFO, not an image file: skipped" in result.stderr


def test_an_image_file_past_the_bound_is_refused_unread(tmp_path):
    big = tmp_path / "big.jpg"
    with open(big, "wb") as f:
        f.truncate(IMAGE_FILE_LIMIT + 1)  # sparse: no disk, and a read would allocate 1 GiB
    with pytest.raises(OSError, match="more than the 1,073,741,824 an image may be"):
        read_regular(big)
    os.mkfifo(tmp_path / "fifo.jpg")
    with pytest.raises(OSError, match="is not a regular file"):
        read_regular(tmp_path / "fifo.jpg")


def test_an_image_replaced_by_a_fifo_after_listing_is_a_bad_image_not_a_hang(photos, tmp_path):
    """Between listing and reading (a long run), a file may change: the read itself refuses a non-regular file."""
    from bigbatch.config import load_config
    from bigbatch.data.formats.folder import load

    cfg = load_config("digits", ["data.name=folder", f"data.path={photos}", "data.size=32"])
    train, _, _ = load(cfg)
    first = Path(train.samples[0][0])
    first.unlink()
    os.mkfifo(first)
    with pytest.raises(OSError, match="is not a regular file"):
        train.source(0)


# ------------------------------------------------------------------------------------------- kind 10: pack's leftovers
KILLED_PACK = """
import os, signal, sys
from pathlib import Path
from bigbatch.data.formats import pack as packing

real_add = packing._ShardWriter.add
def add_then_die(self, *args):
    real_add(self, *args)
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or Ctrl-\\ would, mid-way
packing._ShardWriter.add = add_then_die
packing.pack(Path(sys.argv[1]), Path(sys.argv[2]), 20000)
"""


def killed_pack(photos: Path, out: Path) -> Path:
    """The ``OUT.partial-PID`` folder a pack killed mid-way leaves."""
    process = subprocess.run([sys.executable, "-c", KILLED_PACK, str(photos), str(out)], timeout=HANG_GUARD_S)
    assert process.returncode == -signal.SIGKILL
    left = [p for p in out.parent.iterdir() if p.name.startswith(f"{out.name}.partial-")]
    assert len(left) == 1 and (left[0] / PARTIAL_MARK).is_file()
    return left[0]


def test_the_next_pack_removes_what_a_killed_pack_left_and_only_that(photos, tmp_path):
    out = tmp_path / "shards"
    stale = killed_pack(photos, out)
    # Folders of the same naming that are not a dead pack's leftovers, all kept:
    users = tmp_path / "shards.partial-1"  # no marker: a user's folder of that name
    users.mkdir()
    (users / "train-000000.tar").write_bytes(b"the user's")
    mark = json.loads((stale / PARTIAL_MARK).read_text())

    def copy_of_stale(pid: int, out_named: Path) -> Path:
        copy = tmp_path / f"shards.partial-{pid}"
        shutil.copytree(stale, copy)
        (copy / PARTIAL_MARK).write_text(json.dumps({**mark, "pid": pid, "out": str(out_named)}) + "\n")
        return copy

    other = copy_of_stale(999_991, tmp_path / "other")  # a dead pack to another --out: not this pack's to tidy
    added_for_out = copy_of_stale(999_992, out)
    (added_for_out / "my-notes.txt").write_text("the user put this here")  # not a name pack writes: kept
    removable = copy_of_stale(999_993, out)  # a second dead pack to this --out: removed
    running = tmp_path / "shards.partial-running"  # renamed below to the PID of a pack still running
    running.mkdir()
    (running / PARTIAL_MARK).touch()
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(running / PARTIAL_MARK), json.dumps(mark), str(out)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:  # a pack still running (it holds its marker's lock): kept
        assert locker.stdout.readline().strip() == "locked"
        running = running.rename(tmp_path / f"shards.partial-{locker.pid}")
        result = run_main("pack", str(photos), "--out", str(out), "--shard-size", "20000")
        assert result.returncode == 0, result.stderr
        for gone in (stale, removable):
            assert f"removed {gone}, the unfinished output of a pack to {out} that was killed" in result.stdout
        assert result.stdout.count("removed ") == 2
        assert not stale.exists() and not removable.exists()
        assert len(read_index(out).train) == 8 and not (out / PARTIAL_MARK).exists()
        assert (users / "train-000000.tar").read_bytes() == b"the user's"
        assert other.is_dir() and (added_for_out / "my-notes.txt").is_file() and running.is_dir()
    finally:
        locker.kill()
        locker.wait(HANG_GUARD_S)


LOCKER = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.write(fd, json.dumps({**json.loads(sys.argv[2]), "pid": os.getpid(), "out": sys.argv[3]}).encode())
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_pack_that_fails_leaves_nothing(photos, tmp_path):
    with open(photos / "train" / "china" / "big.jpg", "wb") as f:
        f.truncate(IMAGE_FILE_LIMIT + 1)  # sparse; past the bound, so never read
    result = run_main("pack", str(photos), "--out", str(tmp_path / "shards"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "big.jpg: cannot be read (" in result.stderr and "more than the 1,073,741,824" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]
