"""Each rank's own random generators: dropout masks differ between ranks (timm and detectron2 seed ``seed + rank``), a
checkpoint keeps every rank's generator states (a resume on the same world size restores each rank's own, another
world size derives fresh ones from (seed, rank, step)), and the loss scaler's state is resumed only into a scaler of
its kind.

The two-process run is one pair of spawned Gloo workers (``run_spawned``) that train three times in the same group:
uninterrupted, interrupted after the checkpoint of step 2, and resumed from it; its dropout masks are recorded on
each rank."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from bigbatch.engine import checkpoint
from bigbatch.errors import UserError
from bigbatch.largebatch.precision import DynamicLossScaler, LossScaler, UpdateRatioLossScaler, saved_kind
from tests.helpers import COMMON, StopAfter, run_main, run_spawned, train_records

WORLD = 2
SUBDIVISIONS = 2
STEPS = 4
STOP_AFTER = 2  # the interrupted run's last checkpoint
SETTINGS = [*COMMON, f"steps={STEPS}", f"subdivisions={SUBDIVISIONS}", "checkpoint.every=2", "eval.every=1000",
            "model.dropout=0.5"]


def _worker(rank: int, port: int, out_dir: str) -> None:
    from pathlib import Path

    import torch.distributed as dist

    from bigbatch.engine.hooks import Hook
    from bigbatch.engine.preflight import load_checked
    from bigbatch.engine.step import Interrupted
    from bigbatch.engine.trainer import train
    from bigbatch.floor import distributed
    from tests.helpers import join_gloo

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    join_gloo(rank, WORLD, port)
    distributed.teardown = lambda: None  # the three runs share this group; it goes at the end

    class Masks(Hook):
        """Which outputs of the model's dropout were zeroed, at each training forward."""

        stage = "write"

        def __init__(self) -> None:
            self.masks: list[torch.Tensor] = []

        def before_train(self, run) -> None:
            self.handle = run.state.model.dropout.register_forward_hook(self.record)

        def record(self, module, inputs, output) -> None:
            if module.training:
                self.masks.append(output == 0)

        def after_train(self, run) -> None:
            self.handle.remove()

    out = Path(out_dir)
    try:
        cfg = load_checked("digits", SETTINGS)
        uninterrupted, resumed = Masks(), Masks()
        train(cfg, out / "uninterrupted", hooks=[uninterrupted])
        with pytest.raises(Interrupted):
            train(cfg, out / "interrupted", hooks=[StopAfter(STOP_AFTER)])
        dist.barrier()  # rank 0's checkpoint is on disk: as a restarted run would find it
        train(cfg, out / "interrupted", resume=True, hooks=[resumed])
        torch.save({"uninterrupted": uninterrupted.masks, "resumed": resumed.masks}, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("rank_rng")
    return out, run_spawned(_worker, WORLD, out)


def test_dropout_masks_differ_between_ranks(two_ranks):
    _, (rank0, rank1) = two_ranks
    masks0, masks1 = rank0["uninterrupted"], rank1["uninterrupted"]
    assert len(masks0) == len(masks1) == STEPS * SUBDIVISIONS
    same = [bool(torch.equal(a, b)) for a, b in zip(masks0, masks1, strict=True)]
    print(f"micro-batch masks identical on rank 0 and rank 1: {same}")
    assert not any(same), "rank 1 drew rank 0's dropout masks"
    rate = torch.stack([m.float().mean() for m in masks0 + masks1]).mean().item()
    assert 0.4 < rate < 0.6, f"dropout 0.5 zeroed {rate:.2f} of the outputs"


def test_a_resumed_two_process_run_with_dropout_ends_with_the_uninterrupted_weights(two_ranks):
    out, ranks = two_ranks
    for rank, masks in enumerate(ranks):
        after = masks["uninterrupted"][STOP_AFTER * SUBDIVISIONS:]
        assert len(masks["resumed"]) == len(after)
        assert all(torch.equal(a, b) for a, b in zip(masks["resumed"], after, strict=True)), (
            f"rank {rank} drew other masks after the resume")
    expected = torch.load(out / "uninterrupted" / "checkpoints" / "last.pt", weights_only=True)
    actual = torch.load(out / "interrupted" / "checkpoints" / "last.pt", weights_only=True)
    assert actual["step"] == expected["step"] == STEPS
    for key, value in expected["model"].items():
        assert torch.equal(actual["model"][key], value), key
    assert len(actual["rng"]["ranks"]) == WORLD  # every rank's generators, rank 0's also at the top
    assert torch.equal(actual["rng"]["torch"], actual["rng"]["ranks"][0]["torch"])
    assert not torch.equal(actual["rng"]["ranks"][0]["torch"], actual["rng"]["ranks"][1]["torch"])


# --- restoring the generators, by rank and world size --------------------------------------------------------------

def _draws() -> tuple[torch.Tensor, float, float]:
    return torch.rand(4), random.random(), float(np.random.rand())


def _states_of(seeds: list[int]) -> list[dict]:
    states = []
    for seed in seeds:
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        states.append(checkpoint.rng_state())
    return states


def _restored(saved: dict, rank: int, world: int, monkeypatch, seed: int = 7, step: int = 5):
    monkeypatch.setattr(checkpoint, "process_group", lambda: (rank, world))
    torch.manual_seed(999)  # whatever the process drew before
    how = checkpoint.restore_rng(saved, seed, step)
    return how, _draws()


def _same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1:] == b[1:]


@pytest.mark.fast
def test_each_rank_restores_its_own_states_on_the_same_world_size(monkeypatch):
    states = _states_of([10, 11])
    expected = []
    for seed in (10, 11):
        _states_of([seed])
        expected.append(_draws())
    saved = checkpoint.rng_part(states)
    for rank in range(2):
        how, draws = _restored(saved, rank, 2, monkeypatch)
        assert how == "restored" and _same(draws, expected[rank])


@pytest.mark.fast
def test_another_world_size_derives_each_ranks_states_from_seed_rank_and_step(monkeypatch):
    saved = checkpoint.rng_part(_states_of([10, 11]))
    derived = [_restored(saved, rank, 3, monkeypatch) for rank in range(3)]
    assert all(how == "derived" for how, _ in derived)
    assert not _same(derived[0][1], derived[1][1]) and not _same(derived[1][1], derived[2][1])
    assert _same(_restored(saved, 1, 3, monkeypatch)[1], derived[1][1]), "the same resume draws the same again"
    assert not _same(_restored(saved, 1, 3, monkeypatch, step=6)[1], derived[1][1])
    assert not _same(_restored(saved, 1, 3, monkeypatch, seed=8)[1], derived[1][1])


@pytest.mark.fast
def test_an_older_checkpoints_single_state_is_rank_0s_and_the_other_ranks_derive_theirs(monkeypatch):
    old = {key: value for key, value in _states_of([10])[0].items()}  # before ``ranks``: rank 0's states alone
    _states_of([10])
    expected = _draws()
    how, draws = _restored(old, 0, 2, monkeypatch)
    assert how == "restored" and _same(draws, expected)
    how, draws = _restored(old, 1, 2, monkeypatch)
    assert how == "derived" and not _same(draws, expected)
    how, draws = _restored(old, 0, 1, monkeypatch)
    assert how == "restored" and _same(draws, expected)


@pytest.mark.fast
@pytest.mark.parametrize(("ranks", "says"), [("x", "not a list"), ([], "not a list"), ([{"torch": 1}], "rank 0 lacks")])
def test_a_malformed_ranks_part_is_one_line(tmp_path, ranks, says):
    path = tmp_path / "c.pt"
    torch.save({"model": {}, "rng": {**_states_of([1])[0], "ranks": ranks}}, path)
    with pytest.raises(UserError, match=says):
        checkpoint.load(path, ("model", "rng"))


# --- the loss scaler's kind ------------------------------------------------------------------------------------------

@pytest.mark.fast
def test_a_scaler_state_keeps_its_kind_and_an_older_ones_is_read_from_its_keys():
    dynamic = DynamicLossScaler(init_scale=1024.0)
    dynamic.update(True)
    assert dynamic.state_dict()["kind"] == "dynamic"
    assert LossScaler(1.0).state_dict()["kind"] == "none" and LossScaler(128.0).state_dict()["kind"] == "static"
    assert UpdateRatioLossScaler().state_dict()["kind"] == "update_ratio"
    assert saved_kind({"scale": 1.0}) == "none" and saved_kind({"scale": 8.0}) == "static"
    assert saved_kind({"scale": 8.0, "clean_steps": 3, "overflows": 0}) == "dynamic"
    assert saved_kind({"scale": 8.0, "clean_steps": 3, "overflows": 0, "base": 1.0, "applied": 2, "peak": 0.5}) == (
        "update_ratio")
    again = DynamicLossScaler()
    assert again.resume({k: v for k, v in dynamic.state_dict().items() if k != "kind"}) is None  # an older state
    assert again.state_dict() == dynamic.state_dict()
    fixed = LossScaler(1.0)
    assert "starts fresh at scale 1" in fixed.resume(dynamic.state_dict()) and fixed.scale == 1.0
    assert "static (scale 128)" in LossScaler(256.0).resume(LossScaler(128.0).state_dict())


def _logged_scales(out) -> dict[int, float]:
    """The loss scale of each step's training record (logged where a scale other than 1 is used)."""
    return {r["step"]: r["loss_scale"] for r in train_records(out) if "loss_scale" in r}


def test_resuming_with_another_loss_scaler_starts_it_fresh_and_says_so(tmp_path):
    out = tmp_path / "run"
    base = [*COMMON, "checkpoint.every=1", "log.every=1", "eval.every=1000"]
    first = run_main("train", "digits", "--out", str(out), "--set", *base, "steps=2")  # loss_scale auto: none
    assert first.returncode == 0, first.stderr

    dynamic = run_main("train", "--resume", str(out), "--set", "steps=3", "precision.loss_scale=dynamic")
    assert dynamic.returncode == 0 and "Traceback" not in dynamic.stderr, dynamic.stderr
    said = [line for line in dynamic.stdout.splitlines() if line.startswith("precision.loss_scale:")]
    assert said == ["precision.loss_scale: the checkpoint's loss scaler is none, this run's dynamic: it starts fresh "
                    "at scale 65536"]
    assert _logged_scales(out)[3] == 65536.0

    none = run_main("train", "--resume", str(out), "--set", "steps=4", "precision.loss_scale=none")
    assert none.returncode == 0, none.stderr
    assert [line for line in none.stdout.splitlines() if line.startswith("precision.loss_scale:")] == [
        "precision.loss_scale: the checkpoint's loss scaler is dynamic (scale 65536), this run's none: it starts "
        "fresh at scale 1"]
    step4 = [r for r in train_records(out) if r["step"] == 4]
    assert len(step4) == 1 and "loss_scale" not in step4[0], "none asked: the dynamic scale was kept"
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["scaler"] == {"kind": "none", "scale": 1.0}
