"""Optimizers against independent oracles: timm's RMSpropTF / Lars / Lamb, a hand-written closed form for
LR-in-buffer momentum, PyTorch-style SGD for Goyal et al.'s momentum correction, and a checkpoint round trip."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from timm.optim import Lamb as TimmLamb
from timm.optim import Lars as TimmLars
from timm.optim import RMSpropTF as TimmRMSpropTF
from timm.optim import param_groups_weight_decay

from bigbatch.config import OptimConfig
from bigbatch.errors import UserError
from bigbatch.largebatch.optim import Lamb, Lars, MomentumSGD, RMSpropTF, build_optimizer, set_lr

pytestmark = pytest.mark.fast

STEPS = 20


def make_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Conv (4-d weight, bias), BatchNorm, Linear, LayerNorm: several shapes, 1-d ones included; random values,
    except one bias left at zero (the trust ratios' ||w|| == 0 case)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(6, 5), nn.LayerNorm(5))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
        model[3].bias.zero_()
    return model.to(dtype)


def grads_for(model: nn.Module, step: int, scale: float = 1.0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return [scale * torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in model.parameters()]


def set_grads(model: nn.Module, grads: list[torch.Tensor]) -> None:
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def run_pair(ours, ours_model, theirs, theirs_model, lrs=None, steps: int = STEPS, scale: float = 1.0) -> None:
    """Step both optimizers on identical gradients; parameters must agree within 1e-6 after every step."""
    for t in range(steps):
        if lrs is not None:
            set_lr(ours, lrs[t])
            for group in theirs.param_groups:
                group["lr"] = lrs[t]
        grads = grads_for(ours_model, t, scale)
        set_grads(ours_model, grads)
        set_grads(theirs_model, grads)
        ours.step()
        theirs.step()
        assert max_diff(ours_model, theirs_model) < 1e-6, f"step {t}"
    assert max_diff(ours_model, make_model()) > 1e-2  # the parameters did move


def timm_groups(model: nn.Module, cfg: OptimConfig):
    if cfg.no_decay_norm_bias:
        return param_groups_weight_decay(model, cfg.weight_decay)
    return model.parameters()


@pytest.mark.parametrize("no_decay", [False, True])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rmsprop_tf_matches_timm(no_decay: bool, eps: float | None) -> None:
    cfg = OptimConfig(name="rmsprop_tf", momentum=0.9, weight_decay=1e-2, rmsprop_decay=0.9, eps=eps,
                      no_decay_norm_bias=no_decay)
    ours_model, theirs_model = make_model(), make_model()
    ours = build_optimizer(cfg, ours_model, lr=0.05)
    assert isinstance(ours, RMSpropTF)
    theirs = TimmRMSpropTF(timm_groups(theirs_model, cfg), lr=0.05, alpha=0.9, momentum=0.9,
                           eps=1.0 if eps is None else eps, weight_decay=1e-2, lr_in_momentum=True)
    lrs = [0.05 * (t + 1) / 5 if t < 5 else 0.05 * 0.5 ** (t // 7) for t in range(STEPS)]  # warmup, then decay
    run_pair(ours, ours_model, theirs, theirs_model, lrs=lrs)


def test_rmsprop_tf_without_momentum_matches_timm() -> None:
    cfg = OptimConfig(name="rmsprop_tf", momentum=0.0, weight_decay=1e-3)
    ours_model, theirs_model = make_model(), make_model()
    ours = build_optimizer(cfg, ours_model, lr=0.05)
    theirs = TimmRMSpropTF(theirs_model.parameters(), lr=0.05, alpha=0.9, momentum=0.0, eps=1.0, weight_decay=1e-3)
    run_pair(ours, ours_model, theirs, theirs_model)
    assert all("momentum_buffer" not in s for s in ours.state.values())


@pytest.mark.parametrize("no_decay", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 5e-2])
def test_lars_matches_timm(no_decay: bool, nesterov: bool, weight_decay: float) -> None:
    cfg = OptimConfig(name="lars", momentum=0.9, nesterov=nesterov, weight_decay=weight_decay,
                      trust_coefficient=0.02, no_decay_norm_bias=no_decay)
    ours_model, theirs_model = make_model(), make_model()
    ours = build_optimizer(cfg, ours_model, lr=2.0)
    assert isinstance(ours, Lars)
    theirs = TimmLars(timm_groups(theirs_model, cfg), lr=2.0, momentum=0.9, nesterov=nesterov,
                      weight_decay=weight_decay, trust_coeff=0.02)
    lrs = [2.0 * 0.9**t for t in range(STEPS)]
    lr_scale = 1.0 if weight_decay else 0.01  # without weight decay (timm: no trust ratio) this is plain SGD
    run_pair(ours, ours_model, theirs, theirs_model, lrs=[lr * lr_scale for lr in lrs])


@pytest.mark.parametrize("no_decay", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
@pytest.mark.parametrize("grad_scale", [0.01, 3.0])  # timm's max_grad_norm=1.0 inactive / active
def test_lamb_matches_timm(no_decay: bool, weight_decay: float, grad_scale: float) -> None:
    cfg = OptimConfig(name="lamb", betas=(0.9, 0.98), weight_decay=weight_decay, no_decay_norm_bias=no_decay)
    ours_model, theirs_model = make_model(), make_model()
    ours = build_optimizer(cfg, ours_model, lr=0.02)
    assert isinstance(ours, Lamb)
    theirs = TimmLamb(timm_groups(theirs_model, cfg), lr=0.02, betas=(0.9, 0.98), weight_decay=weight_decay)
    lrs = [0.02 * (1 - t / STEPS) for t in range(STEPS)]
    run_pair(ours, ours_model, theirs, theirs_model, lrs=lrs, scale=grad_scale)


def test_lamb_without_global_clipping_matches_timm() -> None:
    ours_model, theirs_model = make_model(), make_model()
    ours = Lamb(ours_model.parameters(), lr=0.02, weight_decay=1e-2, max_grad_norm=None)
    theirs = TimmLamb(theirs_model.parameters(), lr=0.02, weight_decay=1e-2, max_grad_norm=None)
    run_pair(ours, ours_model, theirs, theirs_model, scale=3.0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_closed_form(nesterov: bool) -> None:
    """u <- m u + lr (g + wd w); w <- w - u (nesterov: w <- w - (m u + lr (g + wd w))), written out by hand."""
    lr, m, wd = 0.1, 0.9, 1e-2
    cfg = OptimConfig(name="momentum", momentum=m, nesterov=nesterov, weight_decay=wd)
    model = make_model(dtype=torch.float64)
    opt = build_optimizer(cfg, model, lr=lr)
    assert isinstance(opt, MomentumSGD)
    ws = [p.detach().clone() for p in model.parameters()]
    us = [torch.zeros_like(w) for w in ws]
    for t in range(10):
        grads = grads_for(model, t)
        set_grads(model, grads)
        opt.step()
        for i, (w, g) in enumerate(zip(ws, grads, strict=True)):
            d = g + wd * w
            us[i] = m * us[i] + lr * d
            ws[i] = w - (m * us[i] + lr * d if nesterov else us[i])
        for p, w in zip(model.parameters(), ws, strict=True):
            torch.testing.assert_close(p.detach(), w, rtol=0, atol=1e-12)


def test_sgd_and_adamw_are_torch() -> None:
    model = make_model()
    sgd = build_optimizer(OptimConfig(name="sgd", momentum=0.8, nesterov=True, weight_decay=1e-4), model, lr=0.3)
    assert type(sgd) is torch.optim.SGD
    group = sgd.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.3, 0.8, True, 1e-4)
    adamw = build_optimizer(OptimConfig(name="adamw", betas=(0.9, 0.95), weight_decay=0.05), model, lr=1e-3)
    assert type(adamw) is torch.optim.AdamW
    group = adamw.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-3, (0.9, 0.95), 1e-8, 0.05)
    eps = build_optimizer(OptimConfig(name="adamw", eps=1e-6), model, lr=1e-3).param_groups[0]["eps"]
    assert eps == 1e-6


def test_fused_adamw_makes_the_same_update_to_rounding() -> None:
    updated = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = make_model()
        adamw = build_optimizer(OptimConfig(name="adamw", weight_decay=0.05, fused=fused), model, lr=1e-2)
        assert adamw.param_groups[0]["fused"] is (True if fused else None)
        for step in range(5):
            for p in model.parameters():
                p.grad = torch.full_like(p, 0.1 * (step + 1)) + p.detach()
            adamw.step()
        updated.append([p.detach().clone() for p in model.parameters()])
    for foreach, fused in zip(*updated, strict=True):
        torch.testing.assert_close(fused, foreach, rtol=1e-6, atol=1e-7)


def test_lr_defaults_to_config_and_nesterov_needs_momentum() -> None:
    assert build_optimizer(OptimConfig(lr=0.25), make_model()).param_groups[0]["lr"] == 0.25
    with pytest.raises(UserError, match="optim.nesterov"):
        build_optimizer(OptimConfig(name="momentum", momentum=0.0, nesterov=True), make_model(), lr=0.1)


def test_no_decay_norm_bias_groups() -> None:
    model = make_model()
    cfg = OptimConfig(name="momentum", weight_decay=1e-4, no_decay_norm_bias=True)
    groups = build_optimizer(cfg, model, lr=0.1).param_groups
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in groups}
    assert set(by_decay) == {0.0, 1e-4}
    named = dict(model.named_parameters())
    expected_zero = {"0.bias", "1.weight", "1.bias", "3.bias", "4.weight", "4.bias"}  # biases, BN, LayerNorm
    assert by_decay[0.0] == {id(named[n]) for n in expected_zero}
    assert by_decay[1e-4] == {id(named["0.weight"]), id(named["3.weight"])}
    # the same split as timm's param_groups_weight_decay
    timm_split = {g["weight_decay"]: {id(p) for p in g["params"]} for g in param_groups_weight_decay(model, 1e-4)}
    assert timm_split == by_decay
    # off: one group, everything decayed
    groups = build_optimizer(cfg.model_copy(update={"no_decay_norm_bias": False}), model, lr=0.1).param_groups
    assert len(groups) == 1 and groups[0]["weight_decay"] == 1e-4 and len(groups[0]["params"]) == len(named)


def run_with_lrs(opt, model, lrs) -> list[list[torch.Tensor]]:
    out = []
    for t, lr in enumerate(lrs):
        set_lr(opt, lr)
        set_grads(model, grads_for(model, t))
        opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out


LRS = [0.02, 0.04, 0.06, 0.08, 0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.05, 0.05]  # warmup, two drops, a jump up


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_correction_equals_pytorch_sgd(nesterov: bool) -> None:
    """Goyal et al. remark 2: with u rescaled by lr_new / lr_old, LR-in-buffer momentum = PyTorch SGD, any LRs."""
    def ours(correction: bool):
        model = make_model(dtype=torch.float64)
        cfg = OptimConfig(name="momentum", momentum=0.9, nesterov=nesterov, weight_decay=1e-3,
                          momentum_correction=correction)
        return run_with_lrs(build_optimizer(cfg, model, lr=LRS[0]), model, LRS)

    model = make_model(dtype=torch.float64)
    torch_sgd = torch.optim.SGD(model.parameters(), lr=LRS[0], momentum=0.9, nesterov=nesterov, weight_decay=1e-3)
    oracle = run_with_lrs(torch_sgd, model, LRS)
    corrected, uncorrected = ours(True), ours(False)
    for t in range(len(LRS)):
        for a, b in zip(corrected[t], oracle[t], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert max((a - b).abs().max().item() for a, b in zip(uncorrected[-1], oracle[-1], strict=True)) > 1e-3


def test_rmsprop_tf_momentum_correction_equals_lr_outside_buffer() -> None:
    """Corrected RMSpropTF = timm's RMSpropTF with the LR outside the buffer (lr_in_momentum=False)."""
    def ours(correction: bool):
        model = make_model(dtype=torch.float64)
        cfg = OptimConfig(name="rmsprop_tf", weight_decay=1e-3, momentum_correction=correction)
        return run_with_lrs(build_optimizer(cfg, model, lr=LRS[0]), model, LRS)

    model = make_model(dtype=torch.float64)
    timm_opt = TimmRMSpropTF(model.parameters(), lr=LRS[0], alpha=0.9, momentum=0.9, eps=1.0, weight_decay=1e-3,
                             lr_in_momentum=False)
    oracle = run_with_lrs(timm_opt, model, LRS)
    corrected, uncorrected = ours(True), ours(False)
    for t in range(len(LRS)):
        for a, b in zip(corrected[t], oracle[t], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert max((a - b).abs().max().item() for a, b in zip(uncorrected[-1], oracle[-1], strict=True)) > 1e-3


def test_set_lr_from_zero_is_safe() -> None:
    model = make_model()
    opt = build_optimizer(OptimConfig(name="momentum", momentum_correction=True), model, lr=0.1)
    run_with_lrs(opt, model, [0.1, 0.0])  # the second step rescales the buffers to 0
    set_lr(opt, 0.1)  # lr_old == 0: no division, buffers left as they are
    bufs = [s["momentum_buffer"] for s in opt.state.values()]
    assert all(torch.isfinite(b).all() and (b == 0).all() for b in bufs)
    assert all(g["lr"] == 0.1 for g in opt.param_groups)
    # set_lr on a torch optimizer just sets the LR
    sgd = build_optimizer(OptimConfig(name="sgd", momentum_correction=True), model, lr=0.1)
    set_lr(sgd, 0.5)
    assert sgd.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("name", ["sgd", "momentum", "rmsprop_tf", "adamw", "lars", "lamb"])
def test_state_dict_round_trip(name: str, tmp_path) -> None:
    """Save after 3 steps, load with weights_only=True into a fresh optimizer: the next steps are bit-identical."""
    cfg = OptimConfig(name=name, weight_decay=1e-2, no_decay_norm_bias=True, momentum_correction=True)
    lrs = [0.01, 0.02, 0.03, 0.02, 0.01, 0.005]
    model = make_model()
    opt = build_optimizer(cfg, model, lr=0.1)
    run_with_lrs(opt, model, lrs[:3])
    torch.save(opt.state_dict(), tmp_path / "opt.pt")

    resumed_model = copy.deepcopy(model)
    resumed = build_optimizer(cfg, resumed_model, lr=0.1)
    resumed.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    assert all(g["lr"] == lrs[2] for g in resumed.param_groups)  # the LR that set_lr's correction divides by

    for t in range(3, len(lrs)):
        grads = grads_for(model, t)
        for m, o in ((model, opt), (resumed_model, resumed)):
            set_lr(o, lrs[t])
            set_grads(m, grads)
            o.step()
        for p, q in zip(model.parameters(), resumed_model.parameters(), strict=True):
            assert torch.equal(p, q), f"step {t}"


@pytest.mark.parametrize("wrapped", [False, True])
def test_no_decay_norm_bias_leaves_out_what_the_model_exempts_as_timms_factory_does(wrapped):
    """A timm ViT exempts its position embedding and class token (``no_weight_decay()``, 3-d tensors the 1-d rule
    misses); timm's ``create_optimizer_v2`` puts them in the no-decay group, and so must bigbatch, also for a ViT
    inside another module (its names prefixed)."""
    import timm
    from timm.optim import create_optimizer_v2

    from bigbatch.largebatch.optim import param_groups

    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
    model = nn.Sequential(nn.Identity(), vit) if wrapped else vit
    cfg = OptimConfig(name="adamw", weight_decay=0.05, no_decay_norm_bias=True)
    names = {id(p): name for name, p in model.named_parameters()}

    def split(groups) -> tuple[set[str], set[str]]:
        return ({names[id(p)] for g in groups if g["weight_decay"] == 0 for p in g["params"]},
                {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]})

    theirs = split(create_optimizer_v2(vit, "adamw", weight_decay=0.05).param_groups)  # named from our root
    ours = split(param_groups(cfg, model))
    assert ours == theirs
    assert {"pos_embed", "cls_token"} <= {name.removeprefix("1.") for name in ours[0]}
