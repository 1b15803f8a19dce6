"""Weight EMA: the closed form on a scripted sequence, and one update per applied optimizer step."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from bigbatch.config import load_config
from bigbatch.engine import checkpoint
from bigbatch.engine.trainer import seed_everything, train
from bigbatch.largebatch.ema import WeightEMA
from bigbatch.tasks import build_task


def closed_form(w0: float, ws: list[float], decays: list[float]) -> float:
    """ema_K = w0 * prod(d) + sum_k (1 - d_k) * w_k * prod_{j > k} d_j."""
    total = w0 * torch.tensor(decays, dtype=torch.float64).prod().item()
    for k, (w, d) in enumerate(zip(ws, decays, strict=True)):
        total += (1 - d) * w * torch.tensor(decays[k + 1 :], dtype=torch.float64).prod().item()
    return total


@pytest.mark.parametrize("warmup", [False, True])
def test_ema_equals_its_closed_form(warmup):
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(2.0)
    ema = WeightEMA(model, decay=0.9, warmup=warmup)
    ws = [3.0, -1.0, 0.5, 4.0, 4.0, 10.0, -2.0, 0.0]
    for w in ws:
        with torch.no_grad():
            model.weight.fill_(w)
        ema.update(model)
    n = range(1, len(ws) + 1)  # TF's num_updates: the optimizer steps applied, this one included
    decays = [min(0.9, (1 + k) / (10 + k)) if warmup else 0.9 for k in n]
    assert ema.updates == len(ws)
    assert ema.module.weight.item() == pytest.approx(closed_form(2.0, ws, decays), rel=1e-12)


def test_ema_averages_batchnorm_statistics_and_copies_counters():
    model = nn.BatchNorm1d(3)
    ema = WeightEMA(model, decay=0.5)
    model.train()
    model(torch.randn(16, 3) + 4)
    ema.update(model)
    torch.testing.assert_close(ema.module.running_mean, 0.5 * torch.zeros(3) + 0.5 * model.running_mean)
    assert ema.module.num_batches_tracked.item() == 1


def test_trainer_updates_the_ema_once_per_optimizer_step_not_per_micro_batch(tmp_path):
    cfg = load_config("digits", ["steps=2", "subdivisions=8", "ema.decay=0.8", "data.size=16", "model.width=8",
                                 "model.norm=group", "log.tensorboard=false"])
    seed_everything(cfg.seed)
    task = build_task(cfg)
    initial = task.build_model(cfg).state_dict()
    train(cfg, tmp_path)
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert state["ema"]["updates"] == 2
    # After two steps: ema = d^2 w0 + d (1 - d) w1 + (1 - d) w2; check with w1 from a one-step run.
    one = load_config("digits", ["steps=1", "subdivisions=8", "ema.decay=0.8", "data.size=16", "model.width=8",
                                 "model.norm=group", "log.tensorboard=false"])
    train(one, tmp_path / "one")
    w1 = checkpoint.load(tmp_path / "one" / "checkpoints" / "last.pt")["model"]
    for name, w2 in state["model"].items():
        expected = 0.64 * initial[name] + 0.16 * w1[name] + 0.2 * w2
        torch.testing.assert_close(state["ema"]["module"][name], expected, rtol=1e-5, atol=1e-6)
