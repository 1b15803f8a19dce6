"""Shards (``bigbatch pack``, ``data.name: shards``): a folder of real JPEGs packed into WebDataset tars that plain
``tarfile`` reads, byte for byte; training from them, resumed bit-identically, and in two processes; the order (each
sample of a rank's shards once per epoch, a pure function of seed, epoch and world size); pack's refusals; a corrupt
member reported and replaced."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.data.formats.folder import find_classes, list_samples
from bigbatch.data.formats.pack import pack
from bigbatch.data.formats.shards import ShardOrder, interleave, shuffle_buffer
from bigbatch.errors import UserError
from bigbatch.registry import HOOKS
from tests.helpers import StopAfter, run_main, torchrun, weights, write_photo_folder

SHARD_SIZE = 60_000
"""Bytes: about six training shards of the 32 training images (and one shard holding a single large PNG)."""


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return write_photo_folder(tmp_path_factory.mktemp("photos") / "set")


@pytest.fixture(scope="module")
def shards(tmp_path_factory, photos) -> Path:
    out = tmp_path_factory.mktemp("packed") / "shards"
    pack(photos, out, SHARD_SIZE, seed=0)
    return out


def train(out: Path, data: Path, *settings: str):
    return run_main("train", "digits", "--out", str(out), "--set", "data.name=shards", f"data.path={data}", "batch=8",
                    "subdivisions=2", "steps=4", "data.size=32", "model.width=4", "log.tensorboard=false",
                    "eval.every=2", "checkpoint.every=2", *settings)


# ----------------------------------------------------------------------------- pack


def test_plain_tarfile_reads_the_shards_and_they_hold_the_source_files_byte_for_byte(photos, shards):
    index = json.loads((shards / "index.json").read_text())
    classes = find_classes(photos / "train")
    assert index["classes"] == classes and index["version"] == 1
    for split in ("train", "val"):
        source = list_samples(photos / split, classes)
        entries = index["splits"][split]["shards"]
        assert sorted(p.name for p in shards.glob(f"{split}-*.tar")) == [s["name"] for s in entries]
        assert index["splits"][split]["samples"] == sum(s["samples"] for s in entries) == len(source)
        packed = []  # (source path, label) in the order written
        for entry in entries:
            raw = (shards / entry["name"]).read_bytes()
            assert len(raw) == entry["bytes"] and (len(raw) <= SHARD_SIZE or entry["samples"] == 1)
            with tarfile.open(shards / entry["name"]) as tar:
                members = tar.getmembers()
                assert len(members) == 2 * entry["samples"]
                for i, key in enumerate(entry["keys"]):
                    image, cls = members[2 * i], members[2 * i + 1]
                    assert (image.name, cls.name) == (f"{key}.{entry['image_ext'][i]}", f"{key}.cls")
                    path = photos / split / entry["sources"][i]
                    label = entry["labels"][i]
                    assert tar.extractfile(image).read() == path.read_bytes()
                    assert tar.extractfile(cls).read() == str(label).encode("ascii")
                    assert label == classes.index(Path(entry["sources"][i]).parts[0])
                    assert entry["image_ext"][i] == ("png" if path.suffix.lower() == ".png" else "jpg")
                    # The index points at each member's data: a reader seeks there.
                    assert (entry["image_offset"][i], entry["image_size"][i]) == (image.offset_data, image.size)
                    assert (entry["cls_offset"][i], entry["cls_size"][i]) == (cls.offset_data, cls.size)
                    offset, size = entry["image_offset"][i], entry["image_size"][i]
                    assert raw[offset : offset + size] == path.read_bytes()
                    packed.append((str(path), label))
        keys = [int(k) for entry in entries for k in entry["keys"]]
        assert keys == list(range(len(source)))  # unique: the position in the split
        if split == "val":
            assert packed == source  # in order
        else:
            assert sorted(packed) == sorted(source) and packed != source  # every file once, shuffled
    assert len(index["splits"]["train"]["shards"]) >= 4


def test_pack_refuses_a_non_empty_out_and_a_source_without_train(tmp_path, photos):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me\n")
    with pytest.raises(UserError, match="is not empty"):
        pack(photos, taken, SHARD_SIZE)
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        pack(photos, tmp_path / "a-file", SHARD_SIZE)
    only_val = tmp_path / "only-val"
    shutil.copytree(photos / "val", only_val / "val")
    with pytest.raises(UserError, match="has no train/ folder"):
        pack(only_val, tmp_path / "out", SHARD_SIZE)
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="shard-size"):
        pack(photos, tmp_path / "out", 0)
    empty = tmp_path / "empty"  # an empty folder of the user's is written in place
    empty.mkdir()
    counts = pack(photos, empty, 10**9)
    assert counts["train"] == {"samples": 32, "shards": 1, "bytes": (empty / "train-000000.tar").stat().st_size}
    assert counts["val"]["samples"] == 12 and counts["classes"] == 3
    assert sorted(p.name for p in empty.iterdir()) == ["index.json", "train-000000.tar", "val-000000.tar"]
    assert not list(tmp_path.glob("*.partial*"))


# ----------------------------------------------------------------------------- the order


def naive_interleave(shards: list[list[int]], cycle_length: int) -> list[int]:
    """The interleave, simulated sample by sample."""
    pending = [list(s) for s in shards]
    slots = [pending.pop(0) for _ in range(min(cycle_length, len(pending)))]
    out: list[int] = []
    while any(slots):
        for j, slot in enumerate(slots):
            if slot:
                out.append(slot.pop(0))
                if not slot:
                    slots[j] = pending.pop(0) if pending else []
    return out


def test_the_interleave_is_round_robin_over_cycle_length_shards():
    rng = np.random.default_rng(0)
    for cycle_length in (1, 2, 3, 4, 8):
        sizes = rng.integers(1, 9, size=7)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        shards = [list(range(s, s + n)) for s, n in zip(starts, sizes, strict=True)]
        expected = naive_interleave(shards, cycle_length)
        assert interleave([np.array(s) for s in shards], cycle_length).tolist() == expected
    stream = np.arange(50)
    shuffled = shuffle_buffer(stream, 8, np.random.default_rng(1))
    assert sorted(shuffled.tolist()) == stream.tolist() and shuffled.tolist() != stream.tolist()
    assert shuffled.max() == 49 and shuffled[0] < 8  # the first pick is from the first 8 samples


@pytest.mark.parametrize("world", [1, 2])
def test_each_sample_of_a_rank_s_shards_comes_once_per_epoch(world):
    sizes = [5, 9, 3, 7, 11, 2, 6, 4]
    total = sum(sizes)
    order = ShardOrder(sizes, batch=4 * world, seed=3, world=world, cycle_length=3, buffer=8)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for epoch in range(3):
        seen = []
        for rank in range(world):
            mine = order.shards_of(epoch, rank)
            expected = sorted(i for s in mine for i in range(starts[s], starts[s] + sizes[s]))
            stream = order.stream(epoch, rank).tolist()
            assert sorted(stream) == expected
            seen += stream
        assert sorted(seen) == list(range(total))  # the ranks' shares of an epoch: the whole set, once
    for rank in range(world):
        # The steps read each rank's stream, its epochs one after the other, and always have batch / world samples.
        steps = [order.micro_batches(step, rank, world, 2) for step in range(40)]
        assert all(len(m) == 2 and all(len(part) == 2 for part in m) for m in steps)
        read = torch.cat([part for m in steps for part in m]).tolist()
        epochs, length = [], 0
        while length < len(read):
            epochs.append(order.stream(len(epochs), rank).tolist())
            length += len(epochs[-1])
        assert read == sum(epochs, [])[: len(read)]
        assert epochs[0] != epochs[1]  # each epoch has its own order


def test_the_order_is_a_pure_function_of_seed_epoch_and_world_size():
    sizes = [5, 9, 3, 7, 11, 2, 6, 4]
    a = ShardOrder(sizes, batch=8, seed=3, world=2)
    late = [ShardOrder(sizes, batch=8, seed=3, world=2).micro_batches(37, rank, 2, 4) for rank in range(2)]
    for step in range(38):  # another object, walked there from step 0, agrees with one asked for step 37 first
        got = [a.micro_batches(step, rank, 2, 4) for rank in range(2)]
    assert all(torch.equal(x, y) for g, w in zip(got, late, strict=True) for x, y in zip(g, w, strict=True))
    other_seed = ShardOrder(sizes, batch=8, seed=4, world=2)
    assert not torch.equal(other_seed.samples(0, 0, 20), a.samples(0, 0, 20))
    with pytest.raises(UserError, match="training shard"):
        ShardOrder([5], batch=8, seed=0, world=2)


# ----------------------------------------------------------------------------- training


def test_training_on_shards_resumes_bit_identically(tmp_path, shards):
    settings = ["steps=6", "model.dropout=0.2"]  # 48 images: the run crosses into the second epoch
    reference = train(tmp_path / "reference", shards, *settings)
    assert reference.returncode == 0, reference.stderr
    assert "epochs          1.50 (of 32 training images)" in reference.stdout and "top1" in reference.stdout
    HOOKS.register("stop_after_5", lambda run: StopAfter(5))
    try:  # workers in the interrupted run: each opens the shards anew after the fork
        stopped = train(tmp_path / "stopped", shards, *settings, "data.workers=2")
    finally:
        HOOKS.unregister("stop_after_5")
    assert stopped.returncode == 130
    resumed = run_main("train", "--resume", str(tmp_path / "stopped"))
    assert resumed.returncode == 0, resumed.stderr
    expected, actual = weights(tmp_path / "reference"), weights(tmp_path / "stopped")
    assert all(torch.equal(expected[k], actual[k]) for k in expected)


def test_a_corrupt_member_is_reported_once_and_replaced(tmp_path, photos):
    damaged = tmp_path / "damaged"
    shutil.copytree(photos, damaged)
    truncated = damaged / "train" / "china" / "000.jpg"
    truncated.write_bytes(truncated.read_bytes()[:300])
    pack(damaged, tmp_path / "shards", SHARD_SIZE)
    result = train(tmp_path / "run", tmp_path / "shards")  # 32 images: every one is read
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("unreadable image") == 1, result.stderr
    assert f"packed from {truncated})" in result.stderr and ".tar:" in result.stderr
    assert "data: 1 problem in 1 file: 1 image replaced" in result.stdout
    strict = train(tmp_path / "strict", tmp_path / "shards", "data.strict=true")
    assert strict.returncode == 2 and strict.stderr.startswith("error: data: "), strict.stderr
    assert f"packed from {truncated}" in strict.stderr


def test_two_processes_train_on_their_own_shares_of_the_shards(tmp_path, shards):
    result = torchrun(tmp_path / "two", "data.name=shards", f"data.path={shards}", "batch=8", "subdivisions=2",
                      "data.size=32", "model.width=4", "model.norm=group", "steps=6", "eval.every=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world size      2" in result.stdout and "images 12" in result.stdout


def test_bigbatch_pack_writes_shards_that_train(tmp_path, photos):
    out = tmp_path / "packed"
    result = run_main("pack", str(photos), "--out", str(out), "--shard-size", "64KB")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"shards written to {out}: 32 train images in ")
    index = json.loads((out / "index.json").read_text())
    assert sum(s["samples"] for s in index["splits"]["train"]["shards"]) == 32
    refused = run_main("pack", str(photos), "--out", str(tmp_path / "other"), "--shard-size", "big")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --shard-size: expected a size")
    assert train(tmp_path / "run", out).returncode == 0


def test_the_printed_settings_paste_into_a_shell_for_any_folder_name(tmp_path, photos):
    """``pack`` ends with the ``--set`` words to train with: one shell word a setting, read back as the folder
    whatever its name holds (a space, ``ü``, a quote, a YAML word such as ``off``). They were printed unquoted."""
    import shlex

    from bigbatch.config import load_config

    for name in ("spaced dir ü", "it's", "off"):
        out = tmp_path / name / "shards"
        result = run_main("pack", str(photos), "--out", str(out), "--shard-size", "64KB")
        assert result.returncode == 0, result.stderr
        words = shlex.split(result.stdout.strip().splitlines()[-1].partition("train with --set ")[2])
        assert words[0] == "data.name=shards" and len(words) == 2
        assert load_config("digits", words).data.path == str(out)
