"""Sharded data (``data.name: shards``) resumed on another world size: each process reads its own shards, so the
order is a function of the world size, and a change in mid-epoch would train some images twice and others never
(the oracle below counts them); the resume is refused in one line naming the checkpoint's world size
(``engine/relaunch.py``), where ``data.name: folder`` (one global order) resumes on any."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

import bigbatch.floor.distributed
from bigbatch.config import load_config
from bigbatch.data.formats.pack import pack
from bigbatch.data.formats.shards import ShardOrder
from bigbatch.engine.relaunch import refuse_world_change, relaunch
from bigbatch.errors import UserError
from tests.helpers import run_main, write_photo_folder


def trained_images(changes: list[tuple[int, int]], sizes: list[int], batch: int, steps: int) -> collections.Counter:
    """How many times each image is trained over ``steps`` steps, where ``changes`` says from which step on how many
    processes read the shards (``[(0, 2), (10, 1)]``: 2 processes, then 1 from step 10)."""
    seen: collections.Counter = collections.Counter()
    for step in range(steps):
        world = [w for start, w in changes if start <= step][-1]
        order = ShardOrder(sizes, batch, 0, world)
        for rank in range(world):
            seen.update(torch.cat(order.micro_batches(step, rank, world, 1)).tolist())
    return seen


def test_a_world_change_in_mid_epoch_would_train_images_twice_and_skip_others():
    """The reason for the refusal: 8 shards of 100 images, batch 40 (an epoch is 20 steps), 2 processes then 1 from
    step 10 (docs/distributed.md's numbers); the same world throughout trains each image once."""
    sizes = [100] * 8
    kept = trained_images([(0, 2)], sizes, 40, 20)
    assert len(kept) == 800 and set(kept.values()) == {1}
    changed = trained_images([(0, 2), (10, 1)], sizes, 40, 20)
    assert sum(changed.values()) == 800
    assert (len(changed), sum(1 for c in changed.values() if c > 1), 800 - len(changed)) == (614, 186, 186)


@pytest.fixture(scope="module")
def shards_run(tmp_path_factory) -> Path:
    """A short run on shards, in one process, with its checkpoint of step 2."""
    root = tmp_path_factory.mktemp("shards-elastic")
    pack(write_photo_folder(root / "photos"), root / "shards", 60_000, seed=0)
    out = root / "run"
    result = run_main("train", "digits", "--out", str(out), "--set", "data.name=shards", f"data.path={root / 'shards'}",
                      "batch=8", "subdivisions=2", "steps=2", "data.size=32", "model.width=4",
                      "log.tensorboard=false", "eval.every=2", "checkpoint.every=2")
    assert result.returncode == 0, result.stderr
    return out


def test_a_shards_run_resumed_on_another_world_size_is_refused_in_one_line(shards_run, monkeypatch):
    cfg = load_config(str(shards_run / "config.yaml"), ["steps=4"])
    assert relaunch(cfg, shards_run, 1) is cfg  # the world it was written on: resumed as it is
    with pytest.raises(UserError) as caught:
        relaunch(cfg, shards_run, 2)
    message = str(caught.value)
    last = shards_run / "checkpoints" / "last.pt"
    assert message.startswith(f"data.name: shards: the checkpoint {last} was written on 1 process and this resume "
                              "runs on 2; ")
    assert "Resume it on 1 process" in message and "\n" not in message
    # the CLI, as a torchrun worker of a world of 2 would run it: one line, before any process group is joined
    monkeypatch.setattr(bigbatch.floor.distributed, "world_size_from_env", lambda: 2)
    refused = run_main("train", "--resume", str(shards_run), "--set", "steps=4")
    assert refused.returncode == 2
    assert refused.stderr == f"error: {message}\n", refused.stderr


def test_a_layout_free_order_is_not_refused():
    cfg = load_config("digits", [])  # data.name: digits, one global order cut among the processes (layout-free)
    assert refuse_world_change(cfg, Path("last.pt"), 2, 1) is None
