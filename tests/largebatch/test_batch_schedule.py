"""``schedule.batch``: the global batch grows in phases (Smith et al. 2018), served by more micro-batches of the same
size; the data order, resume and the layout stay exact."""

from __future__ import annotations

import json
import re

import pytest
import torch

from bigbatch.batching import BatchPhase, make_plan
from bigbatch.config import load_config
from bigbatch.data.pipeline.order import GlobalBatchOrder
from bigbatch.errors import UserError
from bigbatch.largebatch.ema import WeightEMA
from bigbatch.largebatch.norm import grown_momentum
from bigbatch.largebatch.schedule import build_schedule
from tests.helpers import (
    COMMON,
    PAUSE_AT,
    assert_same_weights,
    run_main,
    torchrun,
    train_and_kill,
    weights,
)


def plan_of(*overrides: str, world: int = 1, images: int = 1000):
    cfg = load_config("digits", list(overrides))
    return cfg, make_plan(cfg, world, images)


def test_milestones_become_phases_by_steps_taken_and_by_images_seen():
    _, plan = plan_of("batch=100", "subdivisions=2", "steps=40",
                      "schedule.batch=[{at: 5, factor: 2}, {at: 2 epochs, batch: 800}]")
    # step 5 after 500 images; 2 epochs = 2000 images: the first step at or past it starts at 500 + 8 x 200 = 2100
    assert plan.phases == (BatchPhase(5, 500, 200), BatchPhase(13, 2100, 800))
    assert [plan.batch_at(s) for s in (0, 4, 5, 12, 13, 39)] == [100, 100, 200, 200, 800, 800]
    assert [plan.subdivisions_at(s) for s in (0, 5, 13)] == [2, 4, 16]  # the micro-batch stays 50
    assert [plan.images_before(s) for s in (0, 5, 6, 13, 14)] == [0, 500, 700, 2100, 2900]
    assert plan.images == 2100 + 27 * 800
    for images in (0, 250, 500, 1900, 2100, 5000):
        assert plan.images_before(int(plan.steps_for_images(images))) <= images
    assert plan.steps_for_images(700) == 6 and plan.steps_for_images(2900) == 14
    assert plan.at(13).batch == 800 and plan.at(13).subdivisions == 16 and not plan.at(13).phases
    assert "batch from step 13 (epoch 2.10): 800 = 1 x 16 x 50" in plan.describe()


def test_epochs_count_the_images_of_every_phase():
    _, plan = plan_of("batch=100", "subdivisions=1", "epochs=3", "schedule.batch=[{at: 1 epochs, factor: 4}]")
    assert plan.phases == (BatchPhase(10, 1000, 400),)
    assert plan.steps == 15  # 10 steps of 100, then ceil(2000 / 400)
    _, fixed = plan_of("batch=100", "subdivisions=1", "epochs=3")
    assert fixed.steps == 30 and fixed.phases == () and fixed.images_before(7) == 700


@pytest.mark.parametrize(("milestones", "message"), [
    ("[{at: 5, factor: 1.5}]", "schedule.batch[0]: a batch of 150 is not a whole number of micro-batches of 100"),
    ("[{at: 5, factor: 0.333}]", "schedule.batch[0].factor: 100 x 0.333 is not a whole batch"),
    ("[{at: 5, factor: 2}, {at: 3, factor: 2}]", "schedule.batch[1].at: 3 is not after the previous change"),
    ("[{at: 0, batch: 200}]", "schedule.batch[0].at: 0 is not after"),
    ("[{at: 60, batch: 200}]", "schedule.batch[0].at: 60 is at step 60, past the run's last step (39)"),
])
def test_bad_milestones_are_refused_naming_the_entry(milestones, message):
    with pytest.raises(UserError, match=re.escape(message)):
        plan_of("batch=100", "subdivisions=1", "steps=40", f"schedule.batch={milestones}")


def test_a_milestone_needs_a_batch_or_a_factor():
    with pytest.raises(UserError, match=r"schedule.batch.0: each milestone gives batch"):
        load_config("digits", ["schedule.batch=[{at: 5, batch: 200, factor: 2}]"])


def test_an_lr_step_down_at_a_batch_milestone_is_refused_unless_meant():
    overrides = ["batch=100", "subdivisions=1", "steps=40", "schedule.warmup=[]", "schedule.decay.kind=multistep",
                 "schedule.decay.milestones=[20]", "schedule.batch=[{at: 20, factor: 10}]"]
    cfg, plan = plan_of(*overrides)
    with pytest.raises(UserError, match=r"schedule.batch\[0\]: the LR also steps down at step 20"):
        build_schedule(cfg, plan)
    cfg, plan = plan_of(*overrides, "schedule.decay_at_batch_milestones=true")
    lr = build_schedule(cfg, plan)
    assert lr(21) == pytest.approx(lr(19) / 10)
    # the LR is that of the first batch: growing the batch does not rescale it
    cfg, plan = plan_of(*overrides[:-3], "schedule.decay.kind=constant", "optim.ref_batch=50",
                        "schedule.batch=[{at: 20, factor: 10}]")
    lr = build_schedule(cfg, plan)
    assert lr(0) == lr(39) == pytest.approx(cfg.optim.lr * 2)
    # a smooth decay is not a step down, even where the warmup ends at the milestone
    cfg, plan = plan_of("batch=100", "subdivisions=1", "steps=40", "schedule.warmup=[{kind: linear, length: 20}]",
                        "schedule.decay.kind=cosine", "schedule.batch=[{at: 20, factor: 2}]")
    build_schedule(cfg, plan)


def test_the_data_order_takes_each_image_once_across_a_change_of_batch():
    _, plan = plan_of("batch=40", "subdivisions=2", "steps=30",
                      "schedule.batch=[{at: 3, factor: 2}, {at: 7, factor: 3}]", images=100)
    order = GlobalBatchOrder(100, plan, seed=3)
    stream = torch.cat([order.global_batch(step) for step in range(plan.steps)])
    fixed = GlobalBatchOrder(100, 20, seed=3)  # the same stream, 20 at a time
    assert torch.equal(stream, torch.cat([fixed.global_batch(k) for k in range(len(stream) // 20)]))
    assert len(stream) == plan.images
    for epoch in range(len(stream) // 100):  # every epoch is a permutation: nothing repeated, nothing skipped
        assert sorted(stream[epoch * 100:(epoch + 1) * 100].tolist()) == list(range(100))
    micro = order.micro_batches(7, rank=1, world=2, subdivisions=plan.subdivisions_at(7) // 2)
    assert [len(m) for m in micro] == [20] * 6


def test_per_step_quantities_follow_the_batch_in_effect():
    ema = WeightEMA(torch.nn.Linear(2, 2), decay=0.9)
    ema.per_step_power = 4.0
    assert ema.current_decay() == pytest.approx(0.9**4)
    assert grown_momentum(0.1, 4.0) == pytest.approx(1 - 0.9**4)
    assert grown_momentum(0.1, 1.0) == pytest.approx(0.1)


def records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r and "split" not in r]


ARGS = ["digits", "--set", "steps=20", "batch=64", "subdivisions=4", "data.size=16", "model.width=8",
        "checkpoint.every=5", "eval.every=1 epochs", "log.every=1", "log.tensorboard=false", "optim.name=momentum",
        "schedule.warmup=[{kind: linear, length: 300 images}]", "schedule.decay.kind=cosine", "ema.decay=0.9",
        "norm.running_stats=per_step", "model.dropout=0.3",
        "schedule.batch=[{at: 7, factor: 4}, {at: 10, factor: 0.5}, {at: 14, batch: 64}]"]
"""64 images a step, 256 from step 7, 128 from step 10 (where the killed run's last checkpoint is), 64 from 14."""


def test_a_run_killed_at_a_change_of_batch_resumes_bit_identically_across_the_next(tmp_path):
    reference = run_main("train", *ARGS, "--out", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr
    train = records(tmp_path / "reference")
    assert [r["batch"] for r in train] == [64] * 7 + [256] * 3 + [128] * 4 + [64] * 6
    assert [r["images"] for r in train][5:11] == [384, 448, 704, 960, 1216, 1344]
    assert "batch from step 14 (epoch" in reference.stdout and "steps           20 optimizer steps" in reference.stdout
    report = run_main("report", str(tmp_path / "reference"), "--out", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr
    assert "global batch vs steps" in (tmp_path / "report.html").read_text()  # the batch in effect, charted

    run_dir = tmp_path / "killed"  # paused after step 12, its last checkpoint at step 10, where the batch halves
    train_and_kill(ARGS, run_dir, PAUSE_AT, tmp_path / "killed.stderr")
    assert PAUSE_AT == 12 and torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 10
    resumed = run_main("train", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr

    expected = torch.load(tmp_path / "reference" / "checkpoints" / "last.pt", weights_only=True)
    actual = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    for part in ("model", "ema"):
        want, got = (expected[part], actual[part]) if part == "model" else (expected[part]["module"],
                                                                             actual[part]["module"])
        for key, value in want.items():
            assert torch.equal(value, got[key]), (part, key)
    assert [r["batch"] for r in records(run_dir)] == [r["batch"] for r in train]


def test_one_process_and_two_grow_the_batch_alike(tmp_path):
    overrides = ["model.norm=group", "steps=4", "log.every=1", "schedule.batch=[{at: 2, factor: 2}]"]
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *COMMON, *overrides,
                      "subdivisions=4")
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", *overrides, "subdivisions=2")
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"))
    assert [r["batch"] for r in records(tmp_path / "two")] == [64, 64, 128, 128]
    logged = [[r["loss"] for r in records(tmp_path / name)] for name in ("one", "two")]
    assert logged[1] == pytest.approx(logged[0], rel=1e-5), "the global batch's loss, before and after it grows"


def test_schedule_prints_and_writes_the_batch_beside_the_lr(tmp_path):
    done = run_main("schedule", "digits", "--lines", "4", "--csv", str(tmp_path / "s.csv"), "--set", "batch=256",
                    "subdivisions=8", "schedule.batch=[{at: 10, factor: 2}]")
    assert done.returncode == 0, done.stderr
    assert "global batch 256 to 512" in done.stdout
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert rows[0] == "step,lr,batch"
    assert rows[10].endswith(",256") and rows[11].endswith(",512")
    again = run_main("schedule", "digits", "--csv", str(tmp_path / "s.csv"))  # its own file: replaced
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "s.csv").read_text().startswith("step,lr\n")
