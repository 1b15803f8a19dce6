"""The same training whatever the layout: real ``torchrun`` processes (Gloo on the CPU) against one process."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import COMMON, assert_same_weights, run_main, torchrun, weights


@pytest.mark.parametrize(
    ("one_process", "two_processes"),
    [
        (["model.norm=group", "subdivisions=4"], ["model.norm=group", "subdivisions=2"]),
        (["model.norm=batch", "subdivisions=2"], ["model.norm=batch", "subdivisions=1"]),
        (["model.norm=batch", "subdivisions=1"], ["model.norm=batch", "subdivisions=1", "norm.sync=bigbatch"]),
    ],
    ids=["groupnorm-4-vs-2x2", "batchnorm-2-vs-2x1", "cross-device-bn-1-vs-2x1"],
)
def test_layout_does_not_change_the_weights(tmp_path, one_process, two_processes):
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *COMMON, *one_process)
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", *two_processes)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert multi.stdout.count("run written to") == 1, "only rank 0 reports"
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"))
    import json

    train = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "lr" in r]
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
