"""The same training whatever the layout: real ``torchrun`` processes (Gloo on the CPU) against one process; the
records' means over every process's micro-batches."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from bigbatch.floor.distributed import global_means
from tests.helpers import (
    COMMON,
    assert_same_weights,
    join_gloo,
    run_main,
    run_spawned,
    torchrun,
    train_records,
    weights,
)


@pytest.mark.parametrize(
    ("one_process", "two_processes"),
    [
        (["model.norm=group", "subdivisions=4"], ["model.norm=group", "subdivisions=2"]),
        (["model.norm=batch", "subdivisions=2"], ["model.norm=batch", "subdivisions=1"]),
        (["model.norm=batch", "subdivisions=1"], ["model.norm=batch", "subdivisions=1", "norm.sync=bigbatch"]),
    ],
    ids=["groupnorm-4-vs-2x2", "batchnorm-2-vs-2x1", "cross-device-bn-1-vs-2x1"],
)
def test_layout_does_not_change_the_weights_or_the_logged_loss(tmp_path, one_process, two_processes):
    """The weights, and the loss each step's record logs: the global batch's mean micro-batch loss, not rank 0's."""
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *COMMON, *one_process, "log.every=1")
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", *two_processes, "log.every=1")
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert multi.stdout.count("run written to") == 1, "only rank 0 reports"
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"))
    one, train = train_records(tmp_path / "one"), train_records(tmp_path / "two")
    assert [r["step"] for r in train] == [r["step"] for r in one] == [1, 2, 3]
    assert [r["loss"] for r in train] == pytest.approx([r["loss"] for r in one], rel=1e-5)
    if "subdivisions=2" in two_processes:  # DDP with a synchronising last backward: its wait is t_sync
        phases = ("t_data", "t_forward", "t_backward", "t_sync", "t_update", "t_other")
        assert all(r["t_sync"] >= 0 and sum(r[p] for p in phases) == pytest.approx(r["t_step"], rel=0.05)
                   for r in train)
    if "norm.sync=bigbatch" in two_processes:  # the BN all-reduces: a sub-phase of forward and backward
        assert all(0 < r["t_bn_sync"] <= r["t_forward"] + r["t_backward"] for r in train)
        assert "cross-device BN all-reduce" in multi.stdout
    else:
        assert not any("t_bn_sync" in r for r in train)


@pytest.mark.parametrize("running_stats", ["per_microbatch", "per_step"])
def test_cross_device_bn_running_statistics_match_one_process(tmp_path, running_stats):
    stats = f"norm.running_stats={running_stats}"
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *COMMON, "subdivisions=1", stats)
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", "subdivisions=1", "norm.sync=bigbatch", stats)
    assert multi.returncode == 0, multi.stderr[-3000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    for key in a:
        if key.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-4, msg=key)


ITEMS = (torch.tensor([[2.5, 1.0]], dtype=torch.float64),
         torch.tensor([[1.0, 0.5], [3.0, 0.25], [0.5, 2.0]], dtype=torch.float64))
"""Two processes' items (a loss and one term each): unequal counts, so that a plain mean of the means would differ."""


def _means(items: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"loss": items[:, 0].mean(), "loss_box": items[:, 1].mean()}


def _global_means_worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    join_gloo(rank, len(ITEMS), port)
    try:
        torch.save(global_means(_means(ITEMS[rank]), len(ITEMS[rank])), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_global_means_are_the_means_over_every_process_items(tmp_path):
    """Each value's mean over the items of every process (the concatenation's mean: the oracle), the same on every
    process, each process weighed by its number of items; without a process group, this process's own means."""
    everything = torch.cat(ITEMS)
    expected = {"loss": everything[:, 0].mean().item(), "loss_box": everything[:, 1].mean().item()}
    gathered = run_spawned(_global_means_worker, len(ITEMS), tmp_path)
    assert gathered[0] == gathered[1]
    assert list(gathered[0]) == ["loss", "loss_box"]
    assert gathered[0] == pytest.approx(expected, rel=1e-12)
    alone = global_means(_means(ITEMS[1]), len(ITEMS[1]))
    assert alone == pytest.approx({k: v.item() for k, v in _means(ITEMS[1]).items()}, rel=1e-12)


def test_a_validation_set_smaller_than_the_world_is_evaluated_not_a_hang(tmp_path):
    """One validation image on 2 processes: rank 1 has none to forward. Evaluating through the DDP wrapper hung
    there, since the wrapper's first forward after a step broadcasts the BatchNorm buffers (a collective rank 1
    never joined). The bare model is evaluated, rank 0's buffers shared first; the metric is the one image's, the
    same as one process evaluating the checkpoint."""
    import json

    from tests.helpers import write_photo_folder

    root = write_photo_folder(tmp_path / "set", train=2, val=1)
    for extra in sorted((root / "val").glob("*/*"))[1:]:
        extra.unlink()
    args = ["data.name=folder", f"data.path={root}", "data.size=16", "model.norm=batch", "batch=8", "subdivisions=2",
            "steps=2", "eval.every=2", "eval.batch=1", "data.preprocessing=standard"]
    result = torchrun(tmp_path / "two", *args, common=["model.width=8", "log.tensorboard=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    evals = [r for r in map(json.loads, (tmp_path / "two" / "metrics.jsonl").open()) if r.get("split") == "val"]
    assert evals and evals[-1]["images"] == 1, evals
    alone = run_main("eval", str(tmp_path / "two"))
    assert alone.returncode == 0, alone.stderr
    record = evals[-1]
    assert "evaluating 1 validation image\n" in alone.stdout
    assert f"top1 {record['top1']:.2f}  top5 {record['top5']:.2f}  loss {record['loss']:.2f}" in alone.stdout
