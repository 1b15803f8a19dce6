"""``bigbatch scale``: a recipe moved to a new global batch keeps its images, half-lives and LR rule."""

from __future__ import annotations

import pytest
import yaml

from bigbatch.batching import make_plan
from bigbatch.config import load_config, parse_length
from bigbatch.largebatch.rescale import rescale
from bigbatch.largebatch.schedule import build_schedule, scaled_lr
from tests.helpers import DARKNET_DATA, run_main

RECIPE = [
    "steps=200", "optim.ref_batch=null",
    "schedule.warmup=[{kind: linear, length: 40}, {kind: constant, length: 2 epochs}]",
    "schedule.decay.kind=multistep", "schedule.decay.milestones=[120, '40960 images']", "eval.every=50",
    "checkpoint.every=100", "clip.max_norm=3.0", "clip.start_step=30", "ema.decay=0.999", "norm.momentum=0.1",
]


def images(length, batch: int) -> float:
    number, unit = parse_length(length)
    return number * batch if unit == "steps" else number if unit == "images" else ("epochs", number)


def test_each_scaled_value_256_to_1024():
    cfg = load_config("digits", RECIPE)
    new, changes = rescale(cfg, 1024)
    assert new.batch == 1024
    assert new.subdivisions == 32  # micro-batch 32 kept
    assert scaled_lr(new.optim, 1024) == pytest.approx(4 * scaled_lr(cfg.optim, 256))  # linear rule from 256
    assert new.optim.ref_batch == 256
    assert new.steps == 50
    assert new.schedule.warmup[0].length == 10
    assert new.schedule.warmup[1].length == "2 epochs"
    assert new.schedule.decay.milestones == [30, "40960 images"]
    assert new.eval.every == "12800 images"  # 12.5 steps is no whole number of steps
    assert new.checkpoint.every == 25
    assert new.clip.start_step == 8  # 7.5 rounded: an integer field
    assert new.ema.decay == pytest.approx(0.999**4)
    assert 1 - new.norm.momentum == pytest.approx(0.9**4)
    changed = {key for key, _, _ in changes}
    assert {"batch", "subdivisions", "steps", "ema.decay", "norm.momentum", "eval.every"} <= changed
    assert "schedule.warmup.1.length" not in changed


def test_round_trip_256_to_1024_and_back_reproduces_the_recipe():
    cfg = load_config("digits", RECIPE)
    there, _ = rescale(cfg, 1024)
    back, _ = rescale(there, 256)
    original, returned = cfg.model_dump(mode="json"), back.model_dump(mode="json")
    # Lengths may come back in images rather than steps: compare what they mean.
    for section, key in [("eval", "every"), ("checkpoint", "every")]:
        assert images(returned[section].pop(key), 256) == images(original[section].pop(key), 256)
    assert returned.pop("optim")["ref_batch"] == 256 and original.pop("optim")["ref_batch"] is None
    assert returned.pop("ema")["decay"] == pytest.approx(original.pop("ema")["decay"], rel=1e-12)
    assert returned.pop("norm")["momentum"] == pytest.approx(original.pop("norm")["momentum"], rel=1e-12)
    returned["clip"].pop("start_step"), original["clip"].pop("start_step")  # rounded on the way
    assert returned == original


def test_darknet_cfg_rescaled():
    cfg = load_config(str(DARKNET_DATA / "yolov3.cfg"))
    new, _ = rescale(cfg, 256)
    d = new.schedule.darknet
    assert (new.steps, d.burn_in, d.steps, d.max_batches) == (125_050, 250, [100_000, 112_500], 125_050)
    assert scaled_lr(new.optim, 256) == pytest.approx(0.004)


def test_scale_cli_writes_a_recipe_that_loads(tmp_path):
    out = tmp_path / "digits-1024.yaml"
    result = run_main("scale", "digits", "--batch", "1024", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "LR for the global batch" in result.stdout and "0.4" in result.stdout
    written = yaml.safe_load(out.read_text())
    assert written["batch"] == 1024 and written["subdivisions"] == 32
    shown = run_main("show", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "micro-batch     32 images (= 1024 / (1 x 32))" in shown.stdout


@pytest.mark.parametrize("batch, sets, world", [(2000, [], 1), (100, [], 1), (1024, [], 1), (96, [], 2),
                                               (3000, ["schedule.batch=[{at: 100, batch: 512}]"], 1),
                                               (2**12 * 3**5, ["subdivisions=1"], 1)])
def test_scale_never_raises_the_micro_batch(batch, sets, world):
    """The new micro-batch is the largest at most the old one (digits: 256 / 8 = 32) that cuts every batch of the
    new recipe into whole micro-batches per process: brute force over 1..old as the oracle. It once kept the old
    subdivisions where the new batch was no multiple of the micro-batch: 2000 / 8 = 250 images a micro-batch,
    7.8 x the memory, without a word."""
    cfg = load_config("digits", sets)
    old_micro = cfg.batch // (world * cfg.subdivisions)
    new, changes = rescale(cfg, batch, world)
    reached = [batch] + [m.batch for m in new.schedule.batch]
    expected = max(m for m in range(1, old_micro + 1) if all(b % (world * m) == 0 for b in reached))
    assert new.batch // (world * new.subdivisions) == expected
    assert new.batch % (world * new.subdivisions) == 0
    assert ("subdivisions", cfg.subdivisions, new.subdivisions) in changes or new.subdivisions == cfg.subdivisions


def test_scale_to_a_batch_the_processes_cannot_share_is_one_line_naming_batch():
    from bigbatch.errors import UserError

    with pytest.raises(UserError, match=r"^--batch: the new recipe's batches \(101\) cannot be cut for 2 processes"):
        rescale(load_config("digits"), 101, 2)


def test_scale_to_a_batch_past_this_machine_is_refused_naming_batch_before_the_layout_is_worked_out():
    """The new batch is bounded as ``show`` bounds a batch (8 bytes an image of data order) before its micro-batch is
    searched among its divisors."""
    result = run_main("scale", "digits", "--batch", str(2**61 - 1))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --batch: at batch {2**61 - 1}, {2**61 - 1} images per step need 16.0 EiB for the "
                           "data order alone (8 bytes an image), more than this machine's ")


@pytest.mark.parametrize("per_device", [1, 2, 97, 360, 1000, 4096, 2**12 * 3**5])
@pytest.mark.parametrize("largest", [1, 7, 32, 100, 5000])
def test_the_micro_batch_within_is_the_largest_divisor_at_most_the_old_one(per_device, largest):
    from bigbatch.largebatch.rescale import micro_batch_within

    assert micro_batch_within(per_device, largest) == max(m for m in range(1, min(per_device, largest) + 1)
                                                          if per_device % m == 0)


def test_scale_to_a_smaller_batch_keeps_the_micro_batch_below_it():
    result = run_main("scale", "digits", "--batch", "100")  # digits: 256 = 8 x 32; 100 = 4 x 25
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(result.stdout[result.stdout.index("\n\n"):])
    assert (written["batch"], written["subdivisions"]) == (100, 4)


def test_scale_of_subdivisions_auto_keeps_auto_in_the_recipe(monkeypatch, tmp_path):
    """``subdivisions: auto`` is planned where the recipe trains: the rescaled recipe keeps ``auto`` (it once wrote
    the number this machine planned), and the change table lists no subdivisions. The new layout is still checked
    with the micro-batch measured here (a stand-in for the measuring processes)."""
    from bigbatch.engine import planner
    from bigbatch.engine.planner import Measurement

    monkeypatch.setattr(planner, "measure", lambda cfg, m, per_device: Measurement(m, (100 + m) * 2**20, 1.0))
    out = tmp_path / "auto.yaml"
    result = run_main("scale", "digits", "--set", "subdivisions=auto", "memory.limit=120MiB", "--batch", "512",
                      "--out", str(out))
    assert result.returncode == 0, result.stderr
    # planned: (100 + 4) x 1.15 = 119.6 MiB fits 120 MiB, (100 + 8) x 1.15 = 124.2 does not
    assert "subdivisions: auto -> 64 (micro-batch 4)" in result.stdout
    assert yaml.safe_load(out.read_text())["subdivisions"] == "auto"
    table = result.stdout[result.stdout.index("key "):]
    assert not any(line.startswith("subdivisions") for line in table.splitlines())
    assert load_config(str(out), []).subdivisions == "auto"


@pytest.mark.parametrize(("policy", "gamma"), [("exp", 0.999**4), ("sig", 0.1 * 4)])
def test_per_step_rates_keep_their_effect_per_image(policy, gamma):
    base = 0.999 if policy == "exp" else 0.1
    cfg = load_config("digits", ["schedule.preset=darknet", f"schedule.darknet.policy={policy}",
                                 f"schedule.darknet.gamma={base}", "schedule.darknet.step=400", "steps=800"])
    new, _ = rescale(cfg, 1024)
    assert new.schedule.darknet.gamma == pytest.approx(gamma)
    old_lr = build_schedule(cfg, make_plan(cfg, 1, 1437))
    new_lr = build_schedule(new, make_plan(new, 1, 1437))
    for new_step in (0, 50, 99, 150):  # the same images seen -> the same fraction of the peak LR
        old_step = 4 * (new_step + 1) - 1
        assert new_lr(new_step) / scaled_lr(new.optim, 1024) == pytest.approx(old_lr(old_step) / 0.1, rel=1e-9)


@pytest.mark.parametrize("steps, old, new", [(450_001, 64, 96), (1_234_567, 256, 1024), (3, 10, 4), (7.5, 2, 3)])
def test_a_rescaled_length_keeps_every_digit_of_its_images(steps, old, new):
    """A length that is no whole number of steps at the new batch is written in images: every digit of them, so the
    milestone falls on the step the images give (``:g`` kept 6 digits: 450,001 steps of 64 became 2.88001e+07 images,
    a decay one step late at batch 96)."""
    from bigbatch.largebatch.rescale import scale_length

    written = scale_length(steps, old, new)
    number, unit = parse_length(written)
    assert unit in ("steps", "images")
    assert (number if unit == "images" else number * new) == pytest.approx(steps * old, rel=1e-15, abs=0)
