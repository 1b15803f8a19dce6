"""``bigbatch pack SRC`` reads only inside SRC: a link (to a file or to a folder) whose real path lies outside it is
refused before any shard is written, in one line naming the file, as ``data convert`` refuses one; links that stay
inside SRC are packed as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigbatch.data.formats.pack import pack
from bigbatch.data.formats.shard_index import read_index
from bigbatch.errors import UserError
from tests.helpers import run_main, write_photo_folder


@pytest.fixture
def photos(tmp_path) -> Path:
    return write_photo_folder(tmp_path / "set", train=2, val=1)


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "secret.jpg"
    path.parent.mkdir()
    path.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    return path


def refused(photos: Path, out: Path, link: Path) -> None:
    result = run_main("pack", str(photos), "--out", str(out))
    assert result.returncode != 0
    assert result.stderr.strip() == (f"error: SRC: {link} leads outside {photos} (links and .. followed); pack reads "
                                     "only inside the folder it is given"), result.stderr
    assert not out.exists() and not list(out.parent.glob(f"{out.name}.partial-*"))


def test_a_link_to_a_file_outside_src_is_refused_naming_it(photos, tmp_path):
    link = photos / "train" / "china" / "evil.jpg"
    link.symlink_to(secret(tmp_path))
    refused(photos, tmp_path / "shards", link)


def test_a_link_to_a_folder_outside_src_is_refused_naming_the_file_below_it(photos, tmp_path):
    secret(tmp_path)
    link = photos / "val" / "flower" / "more"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    refused(photos, tmp_path / "shards", link / "secret.jpg")


def test_a_class_folder_that_is_a_link_outside_src_is_refused(photos, tmp_path):
    outside = tmp_path / "outside_class"
    (photos / "train" / "china").rename(outside)
    (photos / "train" / "china").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UserError, match=r"^SRC: .*/train/china/\S+ leads outside "):
        pack(photos, tmp_path / "shards", 2**20)


def test_links_inside_src_are_packed(photos, tmp_path):
    train = photos / "train"
    upside_down = len(list((train / "upside_down").iterdir()))
    before = sum(len(list(folder.iterdir())) for folder in train.iterdir())
    (train / "china" / "twin.jpg").symlink_to(train / "flower" / "000.jpg")  # another image of SRC
    (train / "flower" / "again").symlink_to("../upside_down", target_is_directory=True)
    result = run_main("pack", str(photos), "--out", str(tmp_path / "shards"))
    assert result.returncode == 0, result.stderr
    assert len(read_index(tmp_path / "shards").train) == before + 1 + upside_down
