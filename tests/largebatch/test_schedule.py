"""The LR schedule against independent re-derivations of each source formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bigbatch.batching import make_plan
from bigbatch.config import load_config
from bigbatch.errors import UserError
from bigbatch.largebatch.schedule import build_schedule, scaled_lr
from tests.helpers import DARKNET_DATA, run_cli, run_main

TRAIN_IMAGES = 1437  # the digits training split


def schedule_of(source: str, *overrides: str, train_images: int = TRAIN_IMAGES):
    if source == "digits":  # the components alone, without the recipe's own warmup and decay
        overrides = ("schedule.warmup=[]", "schedule.decay.kind=constant", *overrides)
    cfg = load_config(source, list(overrides))
    plan = make_plan(cfg, 1, train_images)
    return cfg, plan, build_schedule(cfg, plan)


# ----------------------------------------------------------------------------- scaling


@pytest.mark.parametrize(("scaling", "expected"), [("linear", 0.4), ("sqrt", 0.2), ("none", 0.1)])
def test_lr_scaling_rules(scaling, expected):
    cfg = load_config("digits", ["batch=1024", f"optim.scaling={scaling}", "optim.ref_batch=256"])
    assert scaled_lr(cfg.optim, cfg.batch) == pytest.approx(expected)


def test_lr_without_reference_batch_is_used_as_given():
    cfg = load_config("digits", ["batch=1024", "optim.ref_batch=null"])
    assert scaled_lr(cfg.optim, cfg.batch) == 0.1


# ----------------------------------------------------------------------------- presets


def inception_tf_oracle(steps: np.ndarray, lr_flag: float, batch: int, warmup: bool) -> np.ndarray:
    """The guide's TF code, vectorised, with TF's float32 arithmetic where the graph has it."""
    decay, decay_epochs, cold, warm, n_images = 0.94, 3, 2, 7, 1_281_167
    initial = lr_flag * batch / 256
    final = 0.0001 * initial
    bpe = n_images / batch
    current_epoch = (steps.astype(np.float32) / np.float32(bpe)).astype(np.int32)
    lr = initial * decay ** np.floor(steps / int(decay_epochs * bpe))
    if warmup:
        adj = initial * decay ** ((warm + cold) / decay_epochs)
        wlr = 0.1 * adj
        height = np.float32(0.9 * adj / (warm + decay_epochs - 1))
        lin = np.float32(wlr) + (current_epoch - np.int32(cold - 1)).astype(np.float32) * height
        lr = np.where(current_epoch >= cold, np.where(current_epoch >= warm + cold + decay_epochs, lr, lin), wlr)
    return np.maximum(lr, final)


@pytest.mark.parametrize("warmup", [True, False])
def test_inception_tpu_preset_matches_the_guide(warmup):
    cfg, plan, lr = schedule_of("inception-v3-tpu", f"schedule.inception_tpu.warmup={str(warmup).lower()}",
                                "data.path=/data/imagenet")
    assert plan.batch == 1024 and cfg.optim.lr == 0.165
    steps = np.unique(np.concatenate([np.arange(0, plan.steps, 37), np.arange(0, 20_000)]))
    expected = inception_tf_oracle(steps, 0.165, 1024, warmup)
    actual = np.array([lr(int(s)) for s in steps])
    np.testing.assert_allclose(actual, expected, rtol=1e-6)
    if warmup:  # the cold epochs hold 10 % of the adjusted LR; the ramp then overshoots it a little
        adj = 0.165 * 4 * 0.94 ** 3
        assert lr(0) == pytest.approx(0.1 * adj)
        assert max(actual) > adj


def darknet_oracle(batch: int, subdivisions: int, updates: int, lr0: float, burn_in: int, power: float,
                   steps: list[int], scales: list[float]) -> list[float]:
    """Simulate Darknet's training loop: ``seen`` grows by net->batch per datum, the update runs
    when a batch completes, and ``get_current_rate`` reads batch_num = seen / (batch * subdivisions)."""
    micro = batch // subdivisions
    seen, rates = 0, []
    while len(rates) < updates:
        seen += micro
        if (seen // micro) % subdivisions == 0:
            batch_num = seen // (micro * subdivisions)
            if batch_num < burn_in:
                rates.append(lr0 * float(np.float32(batch_num) / np.float32(burn_in)) ** power)
                continue
            rate = lr0
            for boundary, scale in zip(steps, scales, strict=True):
                if boundary > batch_num:
                    break
                rate *= scale
            rates.append(rate)
    return rates


def test_darknet_preset_on_yolov3_cfg():
    cfg, plan, lr = schedule_of(str(DARKNET_DATA / "yolov3.cfg"))
    assert (cfg.batch, cfg.subdivisions, plan.steps) == (64, 16, 500_200)
    assert cfg.optim.momentum == 0.9 and cfg.optim.weight_decay == 0.0005
    d = cfg.schedule.darknet
    assert (d.policy, d.burn_in, d.power, d.steps, d.scales) == ("steps", 1000, 4.0, [400_000, 450_000], [0.1, 0.1])
    rates = darknet_oracle(64, 16, 460_000, 0.001, 1000, 4.0, [400_000, 450_000], [0.1, 0.1])
    for step in [*range(0, 3000), *range(399_990, 400_010), *range(449_990, 450_010), 459_999]:
        assert lr(step) == pytest.approx(rates[step], rel=1e-6), step
    assert lr(998) < 0.001 and lr(999) == pytest.approx(0.001)  # batch_num 1000 ends the burn-in


@pytest.mark.parametrize(
    ("policy", "extra", "closed_form"),
    [
        ("constant", [], lambda b: 0.01),
        ("step", ["schedule.darknet.step=40", "schedule.darknet.scale=0.5"], lambda b: 0.01 * 0.5 ** (b // 40)),
        ("exp", ["schedule.darknet.gamma=0.99"], lambda b: 0.01 * 0.99**b),
        ("poly", ["schedule.darknet.power=2", "schedule.darknet.max_batches=200"], lambda b: 0.01 * (1 - b / 200) ** 2),
        ("sig", ["schedule.darknet.gamma=0.1", "schedule.darknet.step=100"],
         lambda b: 0.01 / (1 + math.exp(0.1 * (b - 100)))),
    ],
)
def test_darknet_policies(policy, extra, closed_form):
    _, _, lr = schedule_of("digits", "schedule.preset=darknet", f"schedule.darknet.policy={policy}",
                           "optim.lr=0.01", "optim.ref_batch=null", "steps=200", *extra)
    for step in range(200):
        assert lr(step) == pytest.approx(closed_form(step + 1), rel=1e-9), step


@pytest.mark.parametrize("settings", [
    ["schedule.preset=darknet", "schedule.darknet.policy=sig", "schedule.darknet.gamma=10", "schedule.darknet.step=10"],
    ["schedule.decay.kind=sigmoid", "schedule.decay.center=10", "schedule.decay.gamma=10"],
])
def test_a_sigmoid_decay_far_past_its_centre_is_zero_not_a_crash(settings):
    """1 / (1 + exp(gamma (t - c))) past exp's range (gamma (t - c) > 709.78): Darknet's C gives inf, so the rate 0;
    Python's math.exp raised OverflowError, which ended the run with a traceback at step 81 of 100 (and ``bigbatch
    schedule`` and ``show`` on such a config). Both forms, far on either side and at the centre."""
    _, _, lr = schedule_of("digits", "optim.lr=0.01", "optim.ref_batch=null", "steps=200", "schedule.warmup=[]",
                           *settings)
    rates = [lr(step) for step in range(200)]
    assert rates[-1] == 0.0 and all(0.0 <= rate <= 0.01 for rate in rates)
    assert rates[0] == pytest.approx(0.01) and max(abs(lr(t) - 0.005) for t in (8, 9, 10)) < 0.005


def alexeyab_sgdr(batch_num: int, lr: float, lr_min: float, cycle: int, mult: int) -> float:
    """AlexeyAB's ``get_current_rate``, case SGDR (src/network.c), line for line."""
    last_iteration_start, cycle_size = 0, cycle
    while last_iteration_start + cycle_size < batch_num:
        last_iteration_start += cycle_size
        cycle_size *= mult
    return lr_min + 0.5 * (lr - lr_min) * (1.0 + math.cos((batch_num - last_iteration_start) * 3.14159265 / cycle_size))


@pytest.mark.parametrize(("mult", "cycle_key"), [(2, "sgdr_cycle=30\n"), (1, "sgdr_cycle=30\n"), (3, "")])
def test_darknet_sgdr_policy_read_from_a_cfg_is_alexeyabs(tmp_path, mult, cycle_key):
    """policy=sgdr with its keys read from [net] (sgdr_cycle defaults to max_batches, learning_rate_min to 1e-5),
    burn-in first, against AlexeyAB's loop; steps= without scales= is read as AlexeyAB reads it for sgdr (unused)."""
    cfg_file = tmp_path / "sgdr.cfg"
    cfg_file.write_text(f"[net]\nbatch=4\nsubdivisions=1\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.01\n"
                        f"burn_in=5\nmax_batches=200\npolicy=sgdr\n{cycle_key}sgdr_mult={mult}\n"
                        "steps=100,150\n#scales=.1,.1\n"
                        "[convolutional]\nfilters=4\nsize=3\nstride=2\npad=1\nactivation=leaky\n"
                        "[avgpool]\n[softmax]\n", encoding="utf-8")
    cfg, plan, lr = schedule_of(str(cfg_file))
    assert plan.steps == 200 and cfg.schedule.darknet.policy == "sgdr"
    cycle = 30 if cycle_key else 200
    for step in range(200):
        batch_num = step + 1
        expected = (0.01 * (batch_num / 5) ** 4 if batch_num < 5 else
                    alexeyab_sgdr(batch_num, 0.01, 1e-5, cycle, mult))
        assert lr(step) == pytest.approx(expected, rel=1e-6, abs=1e-12), step


def test_megdet_recipe_warmup_and_steps():
    cfg, plan, lr = schedule_of("megdet-r50-fpn")
    peak = 0.02  # the seed's numbers: 0.001 -> 0.02 over 500 iterations at batch 256
    per_epoch = 118_287 / 256
    for step in range(plan.steps):
        if step < 500:
            expected = peak * (0.05 + 0.95 * step / 500)  # linear per iteration
        else:
            expected = peak * 0.1 ** ((step >= 8 * per_epoch) + (step >= 10 * per_epoch))
        assert lr(step) == pytest.approx(expected, rel=1e-12), step
    assert lr(0) == pytest.approx(0.001) and lr(500) == pytest.approx(0.02)
    assert cfg.clip.max_norm == 3.0 and cfg.clip.start_step == 300
    assert cfg.norm.freeze_during_warmup and cfg.data.crop_size == 800
    _, _, paper = schedule_of("megdet-r50-fpn", "optim.ref_batch=16")  # the paper's "0.02 per 16 images"
    assert paper(500) == pytest.approx(0.32) and paper(0) == pytest.approx(0.016)


# ----------------------------------------------------------------------------- components


def test_cosine_decay_matches_torch_cosine_annealing():
    _, _, lr = schedule_of("digits", "steps=100", "schedule.decay.kind=cosine", "schedule.min_lr=0.001")
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    torch_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100, eta_min=0.001)
    for step in range(100):
        assert lr(step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9), step
        opt.step()
        torch_sched.step()


def test_linear_warmup_then_cosine_starts_after_warmup():
    _, _, lr = schedule_of("digits", "steps=110", "schedule.warmup=[{kind: linear, length: 10, start_factor: 0.1}]",
                           "schedule.decay.kind=cosine")
    for t in range(10):
        assert lr(t) == pytest.approx(0.1 * (0.1 + 0.9 * t / 10))
    for t in range(10, 110):
        assert lr(t) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * (t - 10) / 100)))


def test_cold_constant_phase_then_linear_from_it_then_power_phase():
    warmup = "[{kind: constant, length: 5, factor: 0.1}, {kind: linear, length: 10}]"
    _, _, lr = schedule_of("digits", "steps=40", f"schedule.warmup={warmup}")
    assert [lr(t) for t in range(5)] == pytest.approx([0.01] * 5)
    assert [lr(t) for t in range(5, 15)] == pytest.approx([0.1 * (0.1 + 0.9 * (t - 5) / 10) for t in range(5, 15)])
    assert lr(15) == pytest.approx(0.1)
    _, _, lr = schedule_of("digits", "steps=40", "schedule.warmup=[{kind: power, length: 8, power: 2}]")
    assert [lr(t) for t in range(10)] == pytest.approx([0.1 * min((t + 1) / 8, 1) ** 2 for t in range(10)])


@pytest.mark.parametrize("length", ["4.5", "2 epochs", "1000 images"])
def test_a_power_warmup_of_no_whole_number_of_steps_never_passes_the_target(length):
    """Darknet's burn-in factor, (batch_num / burn_in) ** power, stays under 1; a length in epochs or images (11.23
    steps for 2 epochs of digits) once gave its last step ((u + 1) / n) ** p > 1: 0.13 for a target of 0.1."""
    warmup = f"[{{kind: power, length: {length}, power: 4}}, {{kind: constant, length: 1.5, factor: 1.0}}]"
    _, _, lr = schedule_of("digits", "steps=20", "schedule.decay.kind=constant", f"schedule.warmup={warmup}")
    rates = [lr(t) for t in range(20)]
    assert max(rates) == pytest.approx(0.1) and all(b >= a for a, b in zip(rates, rates[1:], strict=False))
    assert rates[0] < 0.001


def test_linear_warmup_from_a_start_lr_in_epochs():
    # 2 epochs of 1437 images at batch 256 = 11.23 steps
    _, _, lr = schedule_of("digits", "steps=30", "schedule.warmup=[{kind: linear, length: 2 epochs, start_lr: 0.02}]")
    length = 2 * 1437 / 256
    for t in range(30):
        expected = 0.1 * (0.2 + 0.8 * t / length) if t < length else 0.1
        assert lr(t) == pytest.approx(expected), t


@pytest.mark.parametrize(
    ("decay", "closed_form"),
    [
        (["schedule.decay.kind=step", "schedule.decay.every=7", "schedule.decay.gamma=0.5"],
         lambda t: 0.5 ** (t // 7)),
        (["schedule.decay.kind=multistep", "schedule.decay.milestones=[10, 2560 images]",
          "schedule.decay.scales=[0.5, 0.2]"], lambda t: (0.5 if t >= 10 else 1) * (0.2 if t >= 10 else 1)),
        (["schedule.decay.kind=multistep", "schedule.decay.milestones=[12, '20 steps']"],
         lambda t: 0.1 ** ((t >= 12) + (t >= 20))),
        (["schedule.decay.kind=exponential", "schedule.decay.every=4", "schedule.decay.gamma=0.9"],
         lambda t: 0.9 ** (t // 4)),
        (["schedule.decay.kind=exponential", "schedule.decay.every=4", "schedule.decay.gamma=0.9",
          "schedule.decay.staircase=false"], lambda t: 0.9 ** (t / 4)),
        (["schedule.decay.kind=poly", "schedule.decay.power=2"], lambda t: (1 - t / 30) ** 2),
        (["schedule.decay.kind=sigmoid", "schedule.decay.center=15", "schedule.decay.gamma=0.5"],
         lambda t: 1 / (1 + math.exp(0.5 * (t - 15)))),
        (["schedule.decay.kind=constant"], lambda t: 1.0),
    ],
)
def test_decay_kinds_closed_forms(decay, closed_form):
    _, _, lr = schedule_of("digits", "steps=30", *decay)
    for t in range(30):
        assert lr(t) == pytest.approx(0.1 * closed_form(t), rel=1e-12), t


@pytest.mark.parametrize(("floor", "value"), [("schedule.min_lr=0.02", 0.02), ("schedule.min_lr_ratio=0.3", 0.03)])
def test_floor(floor, value):
    _, _, lr = schedule_of("digits", "steps=30", "schedule.decay.kind=step", "schedule.decay.every=5", floor)
    for t in range(30):
        assert lr(t) == pytest.approx(max(0.1 * 0.1 ** (t // 5), value))


# ----------------------------------------------------------------------------- CLI


def test_schedule_cli_writes_csv_and_png(tmp_path):
    csv, png = tmp_path / "f.csv", tmp_path / "f.png"
    result = run_cli("schedule", "inception-v3-tpu", "--csv", str(csv), "--png", str(png),
                     "--set", f"data.path={tmp_path / 'imagenet'}")  # not at hand: its data.train_images counts
    assert result.returncode == 0, result.stderr
    lines = csv.read_text().splitlines()
    assert lines[0] == "step,lr" and len(lines) == 212_695 + 1
    step, value = lines[100_000].split(",")
    expected = inception_tf_oracle(np.array([int(step)]), 0.165, 1024, True)[0]
    assert float(value) == pytest.approx(expected, rel=1e-6)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schedule_cli_reads_a_darknet_cfg(tmp_path):
    csv = tmp_path / "y.csv"
    result = run_cli("schedule", str(DARKNET_DATA / "yolov3.cfg"), "--csv", str(csv))
    assert result.returncode == 0, result.stderr
    rows = dict(line.split(",") for line in csv.read_text().splitlines()[1:])
    assert len(rows) == 500_200
    assert float(rows["999"]) == pytest.approx(0.001) and float(rows["420000"]) == pytest.approx(0.0001)


def test_a_warmup_longer_than_the_run_is_said_once_with_its_numbers(capsys):
    """A 10-step trial of a cfg with burn_in=1000: lr * ((10 / 1000) ** 4) at most, said with the key to shorten;
    a run whose warmup ends inside it, or whose LR is not negligible, says nothing."""
    from bigbatch.cli import main
    from bigbatch.largebatch.schedule import warmup_note

    cfg, plan, lr = schedule_of(str(DARKNET_DATA / "yolov3-tiny.cfg"), "steps=10")
    note = warmup_note(cfg, plan)
    assert lr(9) == pytest.approx(0.001 * (10 / 1000) ** 4)
    assert note is not None and "ends at step 1000, after this run's 10 steps" in note, note
    assert f"at most {lr(9):.3g}" in note and "schedule.darknet.burn_in" in note
    assert warmup_note(*schedule_of(str(DARKNET_DATA / "yolov3-tiny.cfg"), "steps=2000")[:2]) is None
    assert warmup_note(*schedule_of(str(DARKNET_DATA / "yolov3-tiny.cfg"), "steps=900")[:2]) is None  # 0.66 x
    assert warmup_note(*schedule_of("digits")[:2]) is None
    assert main(["schedule", str(DARKNET_DATA / "yolov3-tiny.cfg"), "--set", "steps=10", "--lines", "2"]) == 0
    assert capsys.readouterr().out.startswith(note + "\n")


def test_schedule_csv_is_written_in_blocks_and_keeps_every_row(tmp_path):
    """``write_csv`` writes blocks of rows (the text at 10^7 steps is about 300 MB): every step, in order, across
    block edges, with and without a batch column."""
    from bigbatch.report import schedule_files

    steps = 2 * schedule_files._ROWS_PER_WRITE + 5
    lrs = [step / 7 for step in range(steps)]
    schedule_files.write_csv(tmp_path / "lr.csv", lrs)
    lines = (tmp_path / "lr.csv").read_text().splitlines()
    assert lines[0] == "step,lr" and len(lines) == steps + 1
    assert [float(line.split(",")[1]) for line in lines[1:]] == lrs
    batches = [256 * (1 + step // 1000) for step in range(steps)]
    schedule_files.write_csv(tmp_path / "b.csv", lrs, batches)
    rows = [line.split(",") for line in (tmp_path / "b.csv").read_text().splitlines()[1:]]
    assert [int(r[0]) for r in rows] == list(range(steps)) and [int(r[2]) for r in rows] == batches


@pytest.mark.parametrize("overrides", [
    ["schedule.decay.kind=exponential", "schedule.decay.gamma=10", "schedule.decay.every=1", "steps=1000"],
    ["schedule.decay.kind=step", "schedule.decay.gamma=1e10", "schedule.decay.every=10", "steps=1000"],
])
def test_a_learning_rate_that_overflows_within_the_run_is_refused_before_it_starts(overrides):
    """A growing factor (gamma > 1) raised to the step passes the largest float: one line before any work, where
    ``train`` once stopped mid-run in Python's OverflowError (and ``schedule`` at once)."""
    cfg = load_config("digits", overrides)
    with pytest.raises(UserError, match=r"^schedule: the learning rate at step 999 is past the largest float"):
        build_schedule(cfg, make_plan(cfg, 1, 1437))
    shrinking = load_config("digits", [*overrides[:1], "schedule.decay.gamma=0.5", *overrides[2:]])
    assert build_schedule(shrinking, make_plan(shrinking, 1, 1437))(999) >= 0


def test_darknets_exp_policy_growing_past_a_float_is_refused(tmp_path):
    cfg_file = tmp_path / "exp.cfg"
    cfg_file.write_text("[net]\nbatch=4\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.01\nmax_batches=100000\n"
                        "policy=exp\ngamma=1.01\n[convolutional]\nfilters=4\nsize=3\nstride=2\npad=1\n"
                        "activation=leaky\n[avgpool]\n[softmax]\n")
    result = run_main("schedule", str(cfg_file))
    assert result.returncode == 2
    assert result.stderr.startswith("error: schedule: the learning rate at step 99999 is past the largest float")
