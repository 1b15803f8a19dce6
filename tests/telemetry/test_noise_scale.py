"""The gradient noise scale (bigbatch/telemetry/noise_scale.py): the estimator against a closed form, driven through
the real accumulation path; the tracker's measurement against per-micro-batch gradients computed separately (one
process, a simulated all-reduce, and two real Gloo processes running ``attempt_step``); its memory."""

from __future__ import annotations

import gc
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch.engine.step import attempt_step
from bigbatch.largebatch.precision import LossScaler
from bigbatch.telemetry.noise_scale import GradientNorms, MicroBatchGradients, NoiseScale, batch_sizes
from tests.helpers import count_host_transfers, join_gloo, run_spawned

SCALE = 1024.0


def _attached(model: nn.Module, world: int = 1) -> MicroBatchGradients:
    tracker = MicroBatchGradients(world=world)
    tracker.attach(model.parameters())
    return tracker


# ---------------------------------------------------------------------------------------------------- closed form


def _linear_regression_noise_scale(d: int, sigma: float, delta_norm: float, subdivisions: int, micro: int,
                                   steps: int, seed: int) -> NoiseScale:
    """The real accumulation path on y = x.w* + eps at a fixed w = w* + delta: S micro-batches of ``micro`` samples,
    ``(loss_i * SCALE / S).backward()``, the tracker after each, ``end_step``, ``NoiseScale.update``; w never
    updated, so the true noise scale is the same at every step (the average may span them all: decay 0.995)."""
    gen = torch.Generator().manual_seed(seed)
    w_star = torch.randn(d, generator=gen)
    delta = torch.randn(d, generator=gen)
    delta *= delta_norm / delta.norm()
    model = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + delta)[None])
    tracker, noise = _attached(model), NoiseScale(decay=0.995)
    for _ in range(steps):
        tracker.begin_step(SCALE, subdivisions)
        for i in range(subdivisions):
            x = torch.randn(micro, d, generator=gen)
            y = x @ w_star + sigma * torch.randn(micro, generator=gen)
            loss = 0.5 * (model(x).squeeze(1) - y).pow(2).mean()
            (loss * SCALE / subdivisions).backward()
            tracker.after_backward(i)
        norms = tracker.end_step()
        b_small, b_big = batch_sizes(micro, subdivisions)
        noise.update(norms.small_sq, b_small, norms.big_sq, b_big)
        model.zero_grad(set_to_none=True)
    return noise


@pytest.mark.parametrize(("d", "sigma", "delta_norm", "subdivisions", "micro"), [
    (10, 1.0, 1.0, 4, 8),  # B_simple = 21, B_big = 32
    (20, 2.0, 1.0, 8, 8),  # B_simple = 101, B_big = 64
])
def test_linear_regression_closed_form(d, sigma, delta_norm, subdivisions, micro):
    """Per-sample loss 1/2 (x.w - y)^2 with x ~ N(0, I_d), y = x.w* + eps, eps ~ N(0, sigma^2), delta = w - w*.
    The per-sample gradient is g = (x.w - y) x = (x.delta - eps) x, so G = E[g] = E[x x^T] delta - E[eps x] = delta.
    For Gaussian x, E[(x.delta)^2 x x^T] = E[x x^T delta delta^T x x^T] = |delta|^2 I + 2 delta delta^T (Isserlis:
    E[x_i x_j x_k x_l] = d_ij d_kl + d_ik d_jl + d_il d_jk), and the eps cross term has mean 0, so
    E[g g^T] = |delta|^2 I + 2 delta delta^T + sigma^2 I and Sigma = E[g g^T] - G G^T = (|delta|^2 + sigma^2) I +
    delta delta^T: tr(Sigma) = (d + 1) |delta|^2 + d sigma^2 and B_simple = tr(Sigma) / |delta|^2.

    The smoothed |G|^2, tr(Sigma) and B_simple must each be within 20 % (the spread over seeds is ~4 %): a factor
    of the loss scale or of 1/S left in, or batch sizes swapped, moves |G|^2 and tr(Sigma) far away."""
    noise = _linear_regression_noise_scale(d, sigma, delta_norm, subdivisions, micro, steps=400, seed=d)
    trace = (d + 1) * delta_norm**2 + d * sigma**2
    assert noise.gradient_sq == pytest.approx(delta_norm**2, rel=0.2)
    assert noise.trace_sigma == pytest.approx(trace, rel=0.2)
    assert noise.b_simple == pytest.approx(trace / delta_norm**2, rel=0.2)


# ---------------------------------------------------------------------------------------------------- the estimator


def test_estimator_formulas_and_bias_correction():
    """A constant measurement is read back exactly from the first step (Adam's bias correction), in the paper's
    formulas written out here; B_simple is the ratio of the moving averages, not the average of the ratios."""
    noise = NoiseScale(decay=0.9)
    assert noise.gradient_sq is None and noise.trace_sigma is None and noise.b_simple is None
    small, big = 5.0, 2.0  # B_small = 4, B_big = 16
    g2 = (16 * big - 4 * small) / 12  # = 1
    tr = (small - big) / (1 / 4 - 1 / 16)  # = 16
    noise.update(small, 4, big, 16)
    assert noise.gradient_sq == pytest.approx(g2) and noise.trace_sigma == pytest.approx(tr)
    assert noise.b_simple == pytest.approx(16.0)
    noise.update(small, 4, big, 16)
    assert noise.gradient_sq == pytest.approx(g2) and noise.b_simple == pytest.approx(16.0)

    ratio = NoiseScale(decay=0.5)
    ratio.update(5.0, 4, 2.0, 16)  # |G|^2 = 1, tr = 16: ratio 16
    ratio.update(11.0, 4, 5.0, 16)  # |G|^2 = (80 - 44) / 12 = 3, tr = 6 / (3/16) = 32: ratio 32/3
    assert ratio.gradient_sq == pytest.approx((0.5 * 0.5 * 1 + 0.5 * 3) / (1 - 0.25))
    assert ratio.b_simple == pytest.approx((0.25 * 16 + 0.5 * 32) / (0.25 * 1 + 0.5 * 3))
    assert ratio.b_simple != pytest.approx((16 + 32 / 3) / 2)


def test_b_simple_is_none_while_the_gradient_estimate_is_not_positive():
    noise = NoiseScale()
    noise.update(10.0, 4, 1.0, 16)  # |G|^2 = (16 - 40) / 12 < 0: noise dominated
    assert noise.gradient_sq < 0 and noise.b_simple is None
    noise.update(math.inf, 4, 1.0, 16)  # an overflowed step is not averaged
    assert noise.steps == 1 and noise.ignored == 1
    with pytest.raises(ValueError, match="b_small < b_big"):
        noise.update(1.0, 8, 1.0, 8)
    restored = NoiseScale()
    restored.load_state_dict(noise.state_dict())
    assert restored.gradient_sq == noise.gradient_sq and restored.steps == 1


# ---------------------------------------------------------------------------------------------------- the tracker


class _TwoHeads(nn.Module):
    """A body and two heads; the second head is used by odd micro-batches only, so its gradient first appears at
    micro-batch 1 (the tracker must take its change from zero)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)
        self.odd = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor, odd: bool) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        return self.head(h) + (self.odd(h) if odd else 0)


def _micro_batch(i: int, micro: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + i)
    return torch.randn(micro, 6, generator=gen), torch.randint(0, 3, (micro,), generator=gen)


def _loss(model: _TwoHeads, i: int) -> torch.Tensor:
    x, y = _micro_batch(i)
    return F.cross_entropy(model(x, odd=i % 2 == 1), y)


def _separate_gradients(model: _TwoHeads, indices: list[int]) -> list[torch.Tensor]:
    """The oracle: each micro-batch's gradient of its own mean loss, flattened in float64 (zeros for a parameter it
    does not reach), computed by its own backward with no scale."""
    params = list(model.parameters())
    flat = []
    for i in indices:
        grads = torch.autograd.grad(_loss(model, i), params, allow_unused=True)
        flat.append(torch.cat([(g if g is not None else torch.zeros_like(p)).double().flatten()
                               for g, p in zip(grads, params, strict=True)]))
    return flat


def _accumulate(model: _TwoHeads, tracker: MicroBatchGradients, subdivisions: int,
                before_last=lambda: None) -> GradientNorms | None:
    model.zero_grad(set_to_none=True)
    tracker.begin_step(SCALE, subdivisions)
    for i in range(subdivisions):
        (_loss(model, i) * (SCALE / subdivisions)).backward()
        if i == subdivisions - 1:
            before_last()
        tracker.after_backward(i)
    return tracker.end_step()


def test_scale_and_subdivisions_are_undone_exactly():
    """mean_i |g_i|^2 and |mean_i g_i|^2 equal those of gradients computed micro-batch by micro-batch, unscaled."""
    model, subdivisions = _TwoHeads(), 4
    g = _separate_gradients(model, list(range(subdivisions)))
    norms = _accumulate(model, _attached(model), subdivisions)
    assert norms.small_sq == pytest.approx(float(torch.stack([gi.square().sum() for gi in g]).mean()), rel=1e-5)
    assert norms.big_sq == pytest.approx(float(torch.stack(g).mean(0).square().sum()), rel=1e-5)
    # the same tracker, a second step at another scale and subdivisions: nothing carried over
    tracker = _attached(model)
    _accumulate(model, tracker, 3)
    again = _accumulate(model, tracker, subdivisions)
    assert again.small_sq == pytest.approx(norms.small_sq, rel=1e-5)
    assert again.big_sq == pytest.approx(norms.big_sq, rel=1e-5)


def test_a_single_micro_batch_measures_nothing():
    model = _TwoHeads()
    assert _accumulate(model, _attached(model), 1) is None
    assert _accumulate(model, _attached(model, world=2), 1) is None


def test_world_above_one_leaves_the_all_reduced_micro_batch_out():
    """A simulated all-reduce: just before the tracker reads the last micro-batch, ``.grad`` becomes the average of
    this process's accumulated gradient and another process's (micro-batches 4..7, same scale and S). The small
    estimate must use micro-batches 0..S-2 only; G_big is the mean over all 2 S micro-batches."""
    model, subdivisions = _TwoHeads(), 4
    mine = _separate_gradients(model, list(range(subdivisions)))
    other = _separate_gradients(model, list(range(subdivisions, 2 * subdivisions)))
    other_accumulated = torch.stack(other).sum(0) * (SCALE / subdivisions)

    def all_reduce() -> None:
        offset = 0
        for p in model.parameters():
            n = p.numel()
            theirs = other_accumulated[offset:offset + n].view_as(p).to(p.dtype)
            p.grad = (p.grad if p.grad is not None else torch.zeros_like(p)) + theirs
            p.grad /= 2
            offset += n

    norms = _accumulate(model, _attached(model, world=2), subdivisions, before_last=all_reduce)
    small = float(torch.stack([gi.square().sum() for gi in mine[:-1]]).mean())
    assert norms.small_sq == pytest.approx(small, rel=1e-5)
    assert norms.big_sq == pytest.approx(float(torch.stack(mine + other).mean(0).square().sum()), rel=1e-5)
    assert batch_sizes(5, subdivisions, world=2) == (5, 40)


def test_out_of_order_calls_are_refused():
    model, tracker = _TwoHeads(), MicroBatchGradients()
    with pytest.raises(RuntimeError, match="attach"):
        tracker.begin_step(SCALE, 2)
    tracker.attach(model.parameters())
    with pytest.raises(RuntimeError, match="already attached"):
        tracker.attach(model.parameters())
    with pytest.raises(RuntimeError, match="begin_step first"):
        tracker.after_backward(0)
    tracker.begin_step(SCALE, 2)
    _loss(model, 0).backward()
    tracker.after_backward(0)
    with pytest.raises(RuntimeError, match="1 of 2"):
        tracker.end_step()


def test_one_host_transfer_per_step(monkeypatch):
    """No host transfer per micro-batch: the squared norms stay tensors; ``end_step`` reads them once."""
    model = _TwoHeads()
    tracker = _attached(model)
    _accumulate(model, tracker, 2)
    losses = [_loss(model, i) * (SCALE / 4) for i in range(4)]
    model.zero_grad(set_to_none=True)
    calls = count_host_transfers(monkeypatch)
    tracker.begin_step(SCALE, 4)
    for i, loss in enumerate(losses):
        loss.backward()
        tracker.after_backward(i)
    assert calls["n"] == 0
    tracker.end_step()
    assert calls["n"] == 1


def _tensor_numel(obj: object) -> int:
    """Elements of every non-scalar tensor reachable from ``obj``'s attributes (lists and dicts followed)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() if obj.dim() > 0 else 0
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_numel(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_tensor_numel(o) for o in obj.values())
    return 0


def test_the_tracker_holds_no_gradient():
    """Memory: besides the parameters it hooks, the tracker holds scalars only, after several steps; ``detach``
    removes its hooks (a backward after it records nothing)."""
    model = _TwoHeads()
    tracker = _attached(model)
    for subdivisions in (4, 2, 4):
        _accumulate(model, tracker, subdivisions)
    held = {k: v for k, v in vars(tracker).items() if k != "_params"}
    assert _tensor_numel(held) == 0
    assert all(p._backward_hooks for p in model.parameters())
    tracker.detach()
    assert not any(p._backward_hooks for p in model.parameters())


# ---------------------------------------------------------------------------------------------------- real DDP

WORLD, SUBDIVISIONS, MICRO = 2, 3, 4


def _ddp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _ddp_micro_batch(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + i)
    return torch.randn(MICRO, 6, generator=gen), torch.randint(0, 3, (MICRO,), generator=gen)


def _ddp_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _ddp_worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    join_gloo(rank, WORLD, port)
    try:
        model = DistributedDataParallel(_ddp_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        tracker, scaler = _attached(model, world=WORLD), LossScaler(SCALE)
        batches = [_ddp_micro_batch(rank, i) for i in range(SUBDIVISIONS)]

        def before_forward(i: int) -> None:
            if i == 0:
                tracker.begin_step(scaler.scale, SUBDIVISIONS)

        attempt_step(model, optimizer, batches, _ddp_loss, scaler=scaler, before_forward=before_forward,
                   after_backward=tracker.after_backward)
        torch.save({"norms": tuple(tracker.end_step())}, f"{out_dir}/rank{rank}.pt")
        # DDP freed before its process group: one alive at the group's end can abort the process (trainer.py)
        tracker.detach()
        del model, optimizer
        gc.collect()
    finally:
        dist.destroy_process_group()


def test_ddp_train_step(tmp_path):
    """Two Gloo processes run ``attempt_step`` (no_sync, then one all-reduce in the last backward) with the tracker
    in its hooks: each rank's small estimate is its own micro-batches 0..S-2, G_big the mean over all W S."""
    results = run_spawned(_ddp_worker, WORLD, tmp_path)
    model = _ddp_model()
    params = list(model.parameters())

    def gradient(rank: int, i: int) -> torch.Tensor:
        grads = torch.autograd.grad(_ddp_loss(model, _ddp_micro_batch(rank, i)), params)
        return torch.cat([g.double().flatten() for g in grads])

    g = {(rank, i): gradient(rank, i) for rank in range(WORLD) for i in range(SUBDIVISIONS)}
    big = float(torch.stack(list(g.values())).mean(0).square().sum())
    for rank, result in enumerate(results):
        small = float(torch.stack([g[rank, i].square().sum() for i in range(SUBDIVISIONS - 1)]).mean())
        assert result["norms"][0] == pytest.approx(small, rel=1e-5), f"rank {rank}"
        assert result["norms"][1] == pytest.approx(big, rel=1e-5), f"rank {rank}"
