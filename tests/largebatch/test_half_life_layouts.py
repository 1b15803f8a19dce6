"""``norm.half_life_images`` gives the same averaging window whatever the layout: with ``norm.sync`` every
running-statistics update averages the whole cross-device micro-batch (or, per step, the global batch), and the
momentum must count those images, not one device's share of them."""

from __future__ import annotations

import pytest
import torch

from bigbatch.batching import BatchPlan
from bigbatch.config import NormConfig
from bigbatch.largebatch.norm import bn_momentum, images_per_update, updates_per_step
from tests.helpers import COMMON, run_main, torchrun, weights

H = 1000.0
BATCH = 256


def step_decay(cfg: NormConfig, world: int, subdivisions: int) -> float:
    """What one optimizer step multiplies the old running statistics by: (1 - m) ** (updates per step)."""
    plan = BatchPlan(batch=BATCH, world=world, subdivisions=subdivisions, steps=1, train_images=None)
    return (1 - bn_momentum(cfg, plan)) ** updates_per_step(cfg, plan)


@pytest.mark.parametrize("sync", ["bigbatch", "torch"])
@pytest.mark.parametrize("running_stats", ["per_microbatch", "per_step"])
def test_synchronised_statistics_decay_by_the_global_batch_on_every_layout(running_stats, sync):
    """1 x 8, 2 x 4, 8 x 1 and 4 x 1 (micro-batches of 32, 32, 32, 64): each step decays the running statistics by
    0.5 ** (batch / H), the global batch being what their updates averaged together."""
    cfg = NormConfig(half_life_images=H, running_stats=running_stats, sync=sync)
    expected = 0.5 ** (BATCH / H)
    for world, subdivisions in ((1, 8), (2, 4), (8, 1), (4, 1)):
        assert step_decay(cfg, world, subdivisions) == pytest.approx(expected, rel=1e-12), (world, subdivisions)


@pytest.mark.parametrize("running_stats", ["per_microbatch", "per_step"])
def test_without_sync_the_half_life_counts_the_images_the_kept_statistics_saw(running_stats):
    """Without ``norm.sync`` each device averages only its own images, and the buffers every process keeps are rank
    0's (DDP broadcasts them): H counts rank 0's images, 1/world of each step's, so a step decays them by
    0.5 ** (batch / (world H))."""
    cfg = NormConfig(half_life_images=H, running_stats=running_stats)
    for world, subdivisions in ((1, 8), (2, 4), (8, 1)):
        plan = BatchPlan(batch=BATCH, world=world, subdivisions=subdivisions, steps=1, train_images=None)
        per_update = plan.micro_batch if running_stats == "per_microbatch" else BATCH // world
        assert images_per_update(cfg, plan) == per_update
        assert step_decay(cfg, world, subdivisions) == pytest.approx(0.5 ** (BATCH / world / H), rel=1e-12)


def test_one_process_and_two_synchronised_processes_keep_the_same_running_mean(tmp_path):
    """A real step of digits (64 images, micro-batches of 8) on 1 process x 8 subdivisions and on 2 Gloo processes x
    4 with ``norm.sync=bigbatch``: the first BN layer's running mean is the same (its inputs are the same images
    through the same initial weights; only the weights of the micro-batches within the step differ, by under 2 %
    here). Counting one device's 8 images per update made the 2-process mean 0.53 times the other (the window of
    2 x H images: 1 - 0.5 ** (64 / H) against 1 - 0.5 ** (32 / H))."""
    run = [*COMMON, "steps=1", "model.norm=batch", f"norm.half_life_images={H}"]
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *run, "subdivisions=8")
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", "steps=1", "model.norm=batch", f"norm.half_life_images={H}",
                     "subdivisions=4", "norm.sync=bigbatch")
    assert multi.returncode == 0, multi.stderr[-3000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    first = next(k for k in a if k.endswith("running_mean"))
    ratio = (b[first].norm() / a[first].norm()).item()
    assert ratio == pytest.approx(1.0, abs=0.02), f"{first}: |2 x 4| / |1 x 8| = {ratio}"
    torch.testing.assert_close(b[first], a[first], rtol=0, atol=0.03 * a[first].abs().max().item())
