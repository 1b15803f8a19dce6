"""Gradient clipping against closed forms, and AGC against timm's ``adaptive_clip_grad``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from timm.utils.agc import adaptive_clip_grad

from bigbatch.config import ClipConfig
from bigbatch.largebatch.clip import clip_gradients

pytestmark = pytest.mark.fast

SHAPES = [(4, 3, 3, 3), (4,), (5, 6), (5,), (1,)]


def make_params(grad_scale: float = 1.0, seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in SHAPES:
        p = nn.Parameter(torch.randn(shape, generator=gen))
        p.grad = grad_scale * torch.randn(shape, generator=gen)
        params.append(p)
    return params


def grads(params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad.clone() for p in params]


def total_norm(gs: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in gs))


def test_norm_clipping_closed_form() -> None:
    params = make_params()
    before = grads(params)
    norm = total_norm(before)
    assert norm > 3.0
    returned = clip_gradients(ClipConfig(max_norm=3.0), params, step=0)
    assert returned == pytest.approx(norm, rel=1e-6)
    for p, g in zip(params, before, strict=True):
        torch.testing.assert_close(p.grad, g * (3.0 / norm), rtol=1e-5, atol=0)
    assert total_norm(grads(params)) == pytest.approx(3.0, rel=1e-5)


def test_norm_clipping_below_threshold_and_before_start_step() -> None:
    params = make_params(grad_scale=0.1)
    before = grads(params)
    norm = clip_gradients(ClipConfig(max_norm=10.0), params, step=0)
    assert norm == pytest.approx(total_norm(before), rel=1e-6) and norm < 10.0
    assert all(torch.equal(p.grad, g) for p, g in zip(params, before, strict=True))

    params = make_params()
    before = grads(params)
    cfg = ClipConfig(max_norm=3.0, start_step=300)  # MegDet: clip from step 300
    assert clip_gradients(cfg, params, step=299) is None
    assert all(torch.equal(p.grad, g) for p, g in zip(params, before, strict=True))
    assert clip_gradients(cfg, params, step=300) == pytest.approx(total_norm(before), rel=1e-6)
    assert total_norm(grads(params)) == pytest.approx(3.0, rel=1e-5)


def test_value_clipping() -> None:
    params = make_params()
    before = grads(params)
    assert clip_gradients(ClipConfig(max_value=0.5), params, step=0) is None
    for p, g in zip(params, before, strict=True):
        expected = torch.where(g > 0.5, 0.5, torch.where(g < -0.5, -0.5, g))
        assert torch.equal(p.grad, expected)
    assert any((g.abs() > 0.5).any() for g in before)


def test_no_clipping_configured() -> None:
    params = make_params()
    before = grads(params)
    assert clip_gradients(ClipConfig(), params, step=5) is None
    assert all(torch.equal(p.grad, g) for p, g in zip(params, before, strict=True))


@pytest.mark.parametrize("clip_factor", [0.05, 0.5, 2.0])
def test_agc_matches_timm(clip_factor: float) -> None:
    ours, theirs = make_params(), make_params()
    ours[1].data.zero_()  # ||w|| = 0: the limit is clip_factor * eps
    theirs[1].data.zero_()
    ours[3].grad.zero_()  # ||g|| = 0: left alone
    theirs[3].grad.zero_()
    before = grads(ours)
    assert clip_gradients(ClipConfig(agc=clip_factor, agc_eps=1e-3), iter(ours), step=0) is None
    adaptive_clip_grad(theirs, clip_factor=clip_factor, eps=1e-3)
    changed = 0
    for p, q, g in zip(ours, theirs, before, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-7)
        changed += int(not torch.equal(p.grad, g))
    assert changed > 0
    # unit-wise (per output filter) for the conv weight: each filter's gradient norm within its limit
    w, g = ours[0].detach(), ours[0].grad
    limits = w.flatten(1).norm(dim=1).clamp(min=1e-3) * clip_factor
    assert (g.flatten(1).norm(dim=1) <= limits * (1 + 1e-5)).all()


def test_agc_before_start_step() -> None:
    params = make_params()
    before = grads(params)
    clip_gradients(ClipConfig(agc=0.01, start_step=2), params, step=1)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, before, strict=True))
