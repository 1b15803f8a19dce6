"""``index.json`` is untrusted input (issue 23, kind 1): every name is a plain file inside ``data.path``, every size
and offset lies inside its shard, the counts agree, labels are classes, and each mistake is one line before any
shard is opened. A hypothesis fuzz of the reader proves the same of random and mutated indexes: a ``UserError`` of
one line or a clean read, never another exception, never a read outside the data folder."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigbatch.data.formats.pack import INDEX, pack
from bigbatch.data.formats.shard_index import read_index
from bigbatch.data.formats.shards import ShardImages
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from tests.helpers import run_main, write_photo_folder


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A small packed set: 8 train images in several shards, 4 val images."""
    photos = write_photo_folder(tmp_path_factory.mktemp("photos") / "set", train=2, val=1)
    out = tmp_path_factory.mktemp("packed") / "shards"
    pack(photos, out, 20_000, seed=0)
    return out


def copy_with(packed: Path, where: Path, change) -> Path:
    """A copy of the packed set whose index is ``change(index)`` (which edits it in place)."""
    data = where / "data"
    shutil.copytree(packed, data)
    index = json.loads((data / INDEX).read_text())
    change(index)
    (data / INDEX).write_text(json.dumps(index))
    return data


# --------------------------------------------------------------------------------------------- reads are recorded
OPENED: list[str] | None = None
"""While not None, every path opened by this process (the ``open`` audit event: ``open()``, ``os.open``, ...)."""


def _audit(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # an audit hook cannot be removed: it does nothing while OPENED is None


@contextmanager
def recording_opens():
    global OPENED
    OPENED = []
    try:
        yield OPENED
    finally:
        OPENED = None


def outside(paths: list[str], folder: Path) -> list[str]:
    """The paths that resolve outside ``folder`` (Python's own imports, under sys.prefix, excepted)."""
    root = os.path.realpath(folder) + os.sep
    prefixes = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, *sys.path) if p})
    return [p for p in paths if not os.path.realpath(p).startswith(root)
            and not os.path.realpath(p).startswith(prefixes)]


def read_everything(data: Path) -> int:
    """Read the index and every image it lists, as training does; -> the images read."""
    index = read_index(data)
    count = 0
    for split in (index.train, index.val):
        images = ShardImages(split, None, DataIssues())
        for i in range(len(images)):
            assert len(images.read(i)) == int(split.size[i])
            count += 1
    return count


def test_the_packed_index_reads_whole_and_only_inside_the_folder(packed):
    with recording_opens() as opened:
        assert read_everything(packed) == 12
    assert opened and not outside(opened, packed), outside(opened, packed)


def test_an_index_too_large_to_read_in_the_memory_available_is_refused_before_it_is_read(packed, monkeypatch):
    """Reading an index takes about 16 times its size (JSON's objects, their checked copy, the arrays): one that
    would not fit the memory available is one line naming it, not the kernel's out-of-memory kill; nothing read."""
    import psutil

    from bigbatch.data.formats import shard_index

    size = (packed / INDEX).stat().st_size
    monkeypatch.setattr(shard_index, "MEMORY_CHECKED_FROM", 0)  # checked from 16 MiB on; this index is smaller
    available = shard_index.PARSE_MEMORY_FACTOR * size - 1
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": available})())
    with recording_opens() as opened, pytest.raises(UserError) as refused:
        read_index(packed)
    assert str(refused.value).startswith(f"data.path: {packed / INDEX} is ")
    assert "reading it takes about 16 times that" in str(refused.value) and "memory available" in str(refused.value)
    assert not any(path.endswith(".tar") for path in opened)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": available + 1})())
    assert len(read_index(packed).train) > 0


def shard(k: int = 0, split: str = "train"):
    return lambda index: index["splits"][split]["shards"][k]


def set_shard(key: str, value, k: int = 0):
    return lambda index: shard(k)(index).__setitem__(key, value)


def set_column(key: str, i: int, value, k: int = 0):
    return lambda index: shard(k)(index)[key].__setitem__(i, value)


CASES = {
    "a name leading up and out": (set_shard("name", "../../outside.tar"), "train.shards[0].name: '../../outside.tar' "
                                                                          "is not a plain file name inside data.path"),
    "an absolute name": (set_shard("name", "/etc/passwd"), "is not a plain file name inside data.path"),
    "a name with a separator": (set_shard("name", "sub/x.tar"), "is not a plain file name"),
    "the name '..'": (set_shard("name", ".."), "is not a plain file name"),
    "a name with NUL": (set_shard("name", "a\0b"), "is not a plain file name"),
    "a shard named twice": (lambda i: shard(1)(i).__setitem__("name", shard(0)(i)["name"]), "is listed twice"),
    "an image of 2**40 bytes": (set_column("image_size", 0, 2**40), "image_size[0]: more than 1,073,741,824 bytes"),
    "an image past the shard's end": (set_column("image_offset", 0, 10**9), "image_offset[0]: the image would end "
                                                                            "past the end of the shard"),
    "an image larger than its shard": (set_column("image_size", 0, 10**7), "image_size[0]: larger than the shard"),
    "a negative offset": (set_column("image_offset", 0, -1), "image_offset[0]: input should be greater than or "
                                                             "equal to 0"),
    "samples against the shards": (lambda i: i["splits"]["train"].__setitem__("samples", 999),
                                   "splits.train.samples: 999, but its shards hold"),
    "a shard's samples against its keys": (lambda i: shard(0)(i).__setitem__("samples", shard(0)(i)["samples"] + 1),
                                           "splits.train.samples"),
    "labels against the keys": (lambda i: shard(0)(i)["labels"].pop(), "labels: "),
    "a key not its position": (set_column("keys", 0, "000007"), "keys[0]: '000007' is not the sample's position in "
                                                                "the split (000000)"),
    "no splits": (lambda i: i.pop("splits"), "splits: field required"),
    "no val split": (lambda i: i["splits"].pop("val"), "splits.val: field required"),
    "classes as a number": (lambda i: i.__setitem__("classes", 3), "classes: input should be a valid list"),
    "no class": (lambda i: i.__setitem__("classes", []), "classes: list should have at least 1 item"),
    "a class named twice": (lambda i: i["classes"].__setitem__(1, i["classes"][0]), "classes: a class is named twice"),
    "samples as text": (lambda i: i["splits"]["train"].__setitem__("samples", "many"),
                        "splits.train.samples: input should be a valid integer"),
    "a label as a boolean": (set_column("labels", 0, True), "labels[0]: input should be a valid integer"),
    "a label outside the classes": (set_column("labels", 0, 3), "labels[0]: 3 is not a class (the index names 3: "
                                                                "0 .. 2)"),
    "a size past 64 bits": (set_column("image_size", 0, 2**64), "image_size[0]: input should be less than"),
    "an unknown image type": (set_column("image_ext", 0, "exe"), "image_ext[0]: input should be 'jpg' or 'png'"),
    "another format": (lambda i: i.__setitem__("format", "webdataset"), "is not the index of shards"),
    "a version from the future": (lambda i: i.__setitem__("version", 99), "is of version 99"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_index_is_one_line_naming_the_key_before_any_shard_is_opened(case, packed, tmp_path):
    change, expected = CASES[case]
    (tmp_path / "outside.tar").write_bytes((packed / shard(0)(json.loads((packed / INDEX).read_text()))["name"])
                                           .read_bytes())  # what "../../outside.tar" would name from data/
    data = copy_with(packed, tmp_path, change)
    with recording_opens() as opened, pytest.raises(UserError) as error:
        read_index(data)
    message = str(error.value)
    assert "\n" not in message and expected.lower() in message.lower(), message
    assert message.startswith(f"data.path: {data / INDEX}"), message
    assert opened == [str(data / INDEX)], "nothing but the index is opened before the index is whole"


def test_a_shard_that_is_a_link_leading_out_is_refused(packed, tmp_path):
    data = copy_with(packed, tmp_path, lambda index: None)
    name = shard(0)(json.loads((data / INDEX).read_text()))["name"]
    (data / name).rename(tmp_path / "elsewhere.tar")
    (data / name).symlink_to(tmp_path / "elsewhere.tar")
    with pytest.raises(UserError, match=r"is a link leading out of .*; shards are read inside data.path only"):
        read_index(data)
    inside = copy_with(packed, tmp_path / "inside", lambda index: None)  # a link that stays inside is followed
    (inside / name).rename(inside / "moved.tar")
    (inside / name).symlink_to("moved.tar")
    assert read_everything(inside) == 12


@pytest.mark.parametrize("kind", ["fifo", "link out", "folder", "not json", "not utf-8", "a list"])
def test_an_index_json_that_is_no_index_is_one_line(kind, packed, tmp_path):
    data = copy_with(packed, tmp_path, lambda index: None)
    index = data / INDEX
    index.unlink()
    if kind == "fifo":
        os.mkfifo(index)  # opening it for reading would block
    elif kind == "link out":
        (tmp_path / "elsewhere.json").write_bytes((packed / INDEX).read_bytes())
        index.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "folder":
        index.mkdir()
    else:
        index.write_bytes({"not json": b"{", "not utf-8": b'{"a": "\xff"}', "a list": b"[1, 2]"}[kind])
    expected = {"fifo": "is not a regular file", "link out": "is a link leading out of", "folder": "is not a regular",
                "not json": "is not valid JSON", "not utf-8": "is not UTF-8 text", "a list": "is not the index of"}
    with pytest.raises(UserError, match=expected[kind]):
        read_index(data)


def test_the_cli_says_a_bad_index_in_one_line_with_exit_2(packed, tmp_path):
    data = copy_with(packed, tmp_path, set_shard("name", "/etc/passwd"))
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", "data.name=shards",
                      f"data.path={data}", "data.size=32", "steps=1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: data.path: {data / INDEX}: "), \
        result.stderr
    assert not (tmp_path / "run").exists()


def test_a_file_name_that_is_not_utf8_packs_and_trains(tmp_path):
    """A name Python decodes with surrogates (bytes 0xff 0xfe) in the source and in a class: packed, listed in the
    index with its bytes escaped, trained on."""
    photos = write_photo_folder(tmp_path / "set", train=2, val=1)
    odd = os.fsdecode(b"photo-\xff\xfe.jpg")
    for split in ("train", "val"):
        (photos / split / "china" / "000.jpg").rename(photos / split / "china" / odd)
        (photos / split / "flower").rename(photos / split / os.fsdecode(b"flower-\xff"))
    result = run_main("pack", str(photos), "--out", str(tmp_path / "shards"), "--shard-size", "20000")
    assert result.returncode == 0, result.stderr
    index = read_index(tmp_path / "shards")
    assert os.fsdecode(b"flower-\xff") in index.classes
    assert any(b"photo-\\udcff\\udcfe.jpg" in source for source in index.train.source)
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", "data.name=shards",
                      f"data.path={tmp_path / 'shards'}", "batch=4", "subdivisions=1", "steps=2", "data.size=32",
                      "model.width=4", "eval.every=2", "checkpoint.every=2", "log.tensorboard=false")
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------------------ the fuzz
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([0, 1, -1, 2**31, 2**40, 2**63, 2**64])
    | st.floats(allow_nan=True) | st.text(max_size=12)
    | st.sampled_from(["..", "../../outside.tar", "/etc/passwd", "/dev/zero", "index.json", ".", "a/b", "jpg", "png"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8)


def _paths(value, at=()):
    """Every location in a JSON value: key paths to each dict entry and list item."""
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*at, i))


def _mutate(index: dict, data: st.DataObject) -> dict:
    index = copy.deepcopy(index)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        places = [p for p in _paths(index) if p]
        place = data.draw(st.sampled_from(places), label="where")
        parent = index
        for part in place[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete", "number", "grow"]), label="action")
        value = parent[place[-1]]
        if action == "delete":
            del parent[place[-1]]
        elif action == "number" and isinstance(value, int) and not isinstance(value, bool):
            parent[place[-1]] = value + data.draw(st.sampled_from([-1, 1, 2**32, -2**32, 2**62]), label="delta")
        elif action == "grow" and isinstance(value, list) and value:
            value.append(copy.deepcopy(value[-1]))
        else:
            parent[place[-1]] = data.draw(JSON_VALUES, label="value")
    return index


@pytest.fixture(scope="module")
def fuzz_folder(packed, tmp_path_factory) -> Path:
    """A copy of the packed set, with a copy of a shard just outside it (what an escaping name would read)."""
    where = tmp_path_factory.mktemp("fuzz")
    data = where / "deep" / "data"
    shutil.copytree(packed, data)
    index = json.loads((packed / INDEX).read_text())
    shutil.copy(packed / index["splits"]["train"]["shards"][0]["name"], where / "outside.tar")
    return data


def check_one(data: Path, raw: bytes) -> None:
    (data / INDEX).write_bytes(raw)
    with recording_opens() as opened:
        try:
            read_everything(data)
        except UserError as error:
            assert "\n" not in str(error), str(error)
    assert not outside(opened, data), outside(opened, data)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_indexes_give_one_line_or_a_clean_read_and_never_read_outside(fuzz_folder, packed, data):
    index = json.loads((packed / INDEX).read_text())
    check_one(fuzz_folder, json.dumps(_mutate(index, data)).encode())


@FUZZ
@given(raw=st.binary(max_size=300) | st.builds(lambda v: json.dumps(v).encode(), JSON_VALUES))
def test_fuzz_random_files_give_one_line(fuzz_folder, raw):
    check_one(fuzz_folder, raw)
