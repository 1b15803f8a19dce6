"""Mixed precision: the loss scalers' rules, skipped steps, and stopping on persistent non-finite gradients."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
import torch.nn as nn

from bigbatch.config import load_config
from bigbatch.engine import checkpoint
from bigbatch.engine.trainer import train
from bigbatch.largebatch.precision import DynamicLossScaler, UpdateRatioLossScaler, build_scaler, grads_are_finite
from tests.helpers import run_main


def scripted_events(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice([float("inf"), float("nan")]) if rng.random() < 0.15 else 1.0 for _ in range(n)]


@pytest.mark.parametrize("growth_interval", [1, 3, 7])
def test_dynamic_scaler_follows_torch_grad_scaler(growth_interval):
    events = scripted_events(200, seed=growth_interval)
    param = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([param], lr=0.0)
    reference = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=growth_interval)
    ours = DynamicLossScaler(init_scale=2.0**16, growth_interval=growth_interval)
    for value in events:
        optimizer.zero_grad()
        reference.scale((param * value).sum()).backward()
        reference.step(optimizer)
        reference.update()
        ours.update(finite=math.isfinite(value))
        assert ours.scale == reference.get_scale()


def test_dynamic_scaler_hysteresis_and_bounds():
    scaler = DynamicLossScaler(init_scale=8.0, growth_interval=2, hysteresis=2, min_scale=2.0, max_scale=16.0)
    scales = []
    for finite in [False, True, False, False, False, False, False, False, True, True, True, True, True, True]:
        scaler.update(finite)
        scales.append(scaler.scale)
    # 2nd overflow in a row backs off; a clean step in between does not reset the overflow count (only growth does)
    assert scales == [8, 8, 4, 4, 2, 2, 2, 2, 2, 4, 4, 8, 8, 16]


def conv_model_with_grad(magnitude: float) -> nn.Module:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 1))
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-9)
    model[0].weight.grad[0, 0, 0, 0] = -magnitude  # the largest |update| among the convolutions
    model[2].weight.grad.fill_(1e6)  # not a convolution: ignored by the rule
    return model


def test_update_ratio_scaler_follows_its_documented_rule():
    scaler = UpdateRatioLossScaler(init_scale=0.25, burn_in=6, double_every=2)
    magnitudes = [165_055.0, 80_000.0, None, 2_000.0, 161.0, 200_000.0, 3.0, 3.0, 3.0, None, 3.0, 3.0]
    expected, base, peak, applied, clean = [], 0.25, 0.0, 0, 0
    scale = 0.25
    for m in magnitudes:
        if applied < 6:  # burn-in: halve the base on overflow, else base * peak / current, a power of two
            if m is None:
                base, scale = base / 2, scale / 2
            else:
                applied += 1
                peak = max(peak, m)
                scale = 2.0 ** math.floor(math.log2(base * peak / m))
        else:  # after burn-in: double after 2 clean steps in a row, halve on overflow
            if m is None:
                scale, clean = scale / 2, 0
            else:
                clean += 1
                if clean == 2:
                    scale, clean = scale * 2, 0
        expected.append(scale)
        scaler.update(m is not None, conv_model_with_grad(m if m is not None else float("inf")))
        assert scaler.scale == expected[-1]
    # spot checks: peak 165055 at base 1/4; the overflow halves the base to 1/8; updates 82x smaller -> 8
    assert expected[:4] == [0.25, 0.5, 0.25, 8.0]


def test_auto_scaler_is_dynamic_for_fp16_only():
    assert type(build_scaler(load_config("digits", ["precision=fp16"]).precision)) is DynamicLossScaler
    assert build_scaler(load_config("digits", ["precision=bf16"]).precision).scale == 1.0
    assert build_scaler(load_config("digits", ["precision.loss_scale=128"]).precision).scale == 128.0


SMALL = ["steps=5", "batch=64", "subdivisions=4", "data.size=16", "model.width=8", "log.tensorboard=false",
         "log.every=1", "ema.decay=0.9", "ema.warmup=true", "schedule.warmup=[{kind: linear, length: 3}]"]


@pytest.mark.parametrize("loss_scale", ["none", "dynamic"])
def test_a_skipped_step_leaves_step_lr_and_ema_unchanged(tmp_path, loss_scale):
    clean = load_config("digits", [*SMALL, f"precision.loss_scale={loss_scale}"])
    faulty = load_config("digits", [*SMALL, f"precision.loss_scale={loss_scale}", "debug.nonfinite_at_step=2"])
    train(clean, tmp_path / "clean")
    train(faulty, tmp_path / "faulty")
    a = checkpoint.load(tmp_path / "clean" / "checkpoints" / "last.pt")
    b = checkpoint.load(tmp_path / "faulty" / "checkpoints" / "last.pt")
    assert b["step"] == a["step"] == 5 and b["skipped"] == 1 and a["skipped"] == 0
    assert b["ema"]["updates"] == 5
    for key in a["model"]:  # the skipped step was re-run on the same images at the same LR
        assert torch.equal(a["model"][key], b["model"][key]), key
        assert torch.equal(a["ema"]["module"][key], b["ema"]["module"][key]), key
    records = [json.loads(line) for line in (tmp_path / "faulty" / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if "lr" in r}
    assert lrs == {r["step"]: r["lr"] for r in map(json.loads, (tmp_path / "clean" / "metrics.jsonl").open())
                   if "lr" in r}
    skip = [r for r in records if r.get("event") == "skipped"]
    assert len(skip) == 1 and skip[0]["step"] == 3 and skip[0]["nonfinite"] == "features.0.0.weight"
    if loss_scale == "dynamic":
        assert skip[0]["loss_scale"] == 2.0**15


def test_persistent_nonfinite_gradients_stop_the_run(tmp_path):
    out = tmp_path / "run"
    result = run_main("train", "digits", "--out", str(out), "--set", *SMALL, "checkpoint.every=1",
                      "debug.nonfinite_at_step=3", "debug.nonfinite_repeats=100", "precision.max_skipped=4")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: 4 optimizer steps in a row had non-finite gradients")
    assert "features.0.0.weight" in lines[0]
    assert f"The last checkpoint, {out / 'checkpoints' / 'last.pt'} at step 3, holds finite weights" in lines[0]
    state = checkpoint.load(out / "checkpoints" / "last.pt")
    assert state["step"] == 3
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_bf16_autocast_trains_on_the_cpu(tmp_path):
    cfg = load_config("digits", [*SMALL, "precision=bf16"])
    train(cfg, tmp_path)
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert state["model"]["head.weight"].dtype == torch.float32  # fp32 master weights
    assert state["step"] == 5


def test_fp16_on_the_cpu_is_a_clear_error(tmp_path):
    result = run_main("train", "digits", "--out", str(tmp_path / "r"), "--set", "precision=fp16")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: precision.dtype: fp16 needs a CUDA device (this run is on the CPU); "
                                     "use bf16 on the CPU")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_grads_are_finite_finds_one_bad_value_in_any_dtype_and_changes_nothing(bad, dtype):
    params = [nn.Parameter(torch.zeros(5, 7)), nn.Parameter(torch.zeros(11, dtype=dtype)), nn.Parameter(torch.zeros(3))]
    for i, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(i)).to(p.dtype) * 1e30
    params.append(nn.Parameter(torch.zeros(2)))  # no gradient: not looked at
    before = [p.grad.clone() for p in params[:3]]
    assert grads_are_finite(params)
    assert all(torch.equal(b, p.grad) for b, p in zip(before, params, strict=False))  # unscaled by 1: unchanged
    params[1].grad[4] = bad
    assert not grads_are_finite(params)
    assert grads_are_finite([params[0], params[2]]) and grads_are_finite([])
