"""Optimizers by name, and the learning-rate setter that keeps LR-in-buffer momentum consistent.

``build_optimizer`` turns :class:`~bigbatch.config.OptimConfig` into the optimizer registered under its
``name`` (``OPTIMIZERS``; each below registers itself: obj(param_groups, lr, cfg)); ``set_lr`` is called
before every step. Four optimizers are written out here (small, one loop each, no timm at run time):

* :class:`MomentumSGD` -- Caffe2 / Goyal et al. 2017 momentum, the LR inside the buffer;
* :class:`RMSpropTF` -- TensorFlow's RMSProp (as ``timm.optim.RMSpropTF`` with ``lr_in_momentum=True``);
* :class:`Lars` -- LARS (You et al. 2017), as ``timm.optim.Lars``;
* :class:`Lamb` -- LAMB (You et al. 2019), as ``timm.optim.Lamb``.

Their state holds only tensors and plain Python numbers, so ``optimizer.state_dict()`` survives
``torch.save`` / ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from typing import Any

import torch
import torch.nn as nn

from bigbatch.config import OptimConfig
from bigbatch.config.optim import OPTIMIZER_KEYS
from bigbatch.errors import UserError
from bigbatch.registry import OPTIMIZERS

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


class _LRInMomentum(torch.optim.Optimizer):
    """Base of optimizers whose momentum buffer holds LR-scaled updates (``state[p]["momentum_buffer"]``).

    ``momentum_correction``: :func:`set_lr` rescales the buffer by lr_new / lr_old when the LR changes.
    """

    lr_in_momentum = True

    def __init__(self, params: Params, defaults: dict[str, Any], momentum_correction: bool = False) -> None:
        super().__init__(params, defaults)
        self.momentum_correction = momentum_correction

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd = group["weight_decay"]
            for p in group["params"]:
                if p.grad is not None:
                    g = p.grad if wd == 0 else p.grad.add(p, alpha=wd)  # weight decay as an L2 term
                    self._update(p, g, group, self.state[p])
        return loss

    _update: Callable[[torch.Tensor, torch.Tensor, dict[str, Any], dict[str, Any]], None]
    """``_update(p, g, group, state)``: one update of ``p`` from its gradient ``g`` (weight decay included);
    each subclass defines its rule."""


class MomentumSGD(_LRInMomentum):
    """SGD with the learning rate inside the momentum buffer (Caffe2's ``MomentumSGDUpdate``).

    Goyal et al. 2017, "Accurate, Large Minibatch SGD", eq. (10), with g = grad + wd * w::

        u <- m * u + lr * g          (u starts at 0)
        w <- w - u                   plain
        w <- w - (m * u + lr * g)    nesterov (Caffe2: (1 + m) * u_new - m * u_old)

    With a constant LR this is exactly PyTorch's SGD (v = m v + g; w -= lr v: u = lr v). When the LR changes,
    u still carries the old LR; Goyal et al.'s remark 2 rescales u by lr_new / lr_old (``momentum_correction``,
    done by :func:`set_lr`), which restores the equivalence.
    """

    def __init__(self, params: Params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = False, momentum_correction: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"invalid lr {lr}, momentum {momentum} or weight_decay {weight_decay}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults, momentum_correction)

    def _update(self, p: torch.Tensor, g: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        lr, m = group["lr"], group["momentum"]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        buf = state["momentum_buffer"]
        buf.mul_(m).add_(g, alpha=lr)
        if group["nesterov"]:
            p.sub_(buf, alpha=m).sub_(g, alpha=lr)
        else:
            p.sub_(buf)


class RMSpropTF(_LRInMomentum):
    """RMSProp as TensorFlow implements it (``tf.compat.v1.train.RMSPropOptimizer``, ``ApplyRMSProp``).

    With g = grad + wd * w (weight decay as an L2 term, timm's default ``decoupled_decay=False``)::

        ms  <- ms + (1 - decay) * (g^2 - ms)           (ms starts at 1, not 0 as in PyTorch)
        mom <- momentum * mom + lr * g / sqrt(ms + eps)  (eps inside the root; mom starts at 0)
        w   <- w - mom
        (momentum == 0: w <- w - lr * g / sqrt(ms + eps), no buffer)

    Same arithmetic as ``timm.optim.RMSpropTF(lr_in_momentum=True)``. The LR lives in ``mom``; see
    :func:`set_lr` for ``momentum_correction``.
    """

    def __init__(self, params: Params, lr: float, decay: float = 0.9, momentum: float = 0.9, eps: float = 1.0,
                 weight_decay: float = 0.0, momentum_correction: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or eps < 0 or not 0 <= decay < 1:
            raise ValueError(f"invalid lr {lr}, decay {decay}, momentum {momentum}, eps {eps} or "
                             f"weight_decay {weight_decay}")
        defaults = dict(lr=lr, decay=decay, momentum=momentum, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, momentum_correction)

    def _update(self, p: torch.Tensor, g: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        lr, m = group["lr"], group["momentum"]
        if "square_avg" not in state:
            state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
            if m > 0:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        ms = state["square_avg"]
        ms.add_(g.square() - ms, alpha=1 - group["decay"])
        rms = ms.add(group["eps"]).sqrt_()
        if m > 0:
            buf = state["momentum_buffer"]
            buf.mul_(m).addcdiv_(g, rms, value=lr)
            p.sub_(buf)
        else:
            p.addcdiv_(g, rms, value=-lr)


class Lars(torch.optim.Optimizer):
    """LARS, layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017, arXiv:1708.03888), as ``timm.optim.Lars``.

    Per parameter tensor w with gradient g (timm / NVIDIA apex LARC arithmetic)::

        if weight_decay != 0 or always_adapt:
            trust = trust_coeff * ||w|| / (||g|| + wd * ||w|| + eps)    (1 when ||w|| == 0 or ||g|| == 0)
            g <- (g + wd * w) * trust
        v <- m * v + g          (v starts at g: PyTorch SGD)
        w <- w - lr * v         plain;   w <- w - lr * (g + m * v)   nesterov

    As in timm, groups with weight_decay 0 (``no_decay_norm_bias``) get neither decay nor the trust ratio
    (plain SGD) unless ``always_adapt``; and the global LR sits outside the buffer (the paper puts it inside).
    """

    def __init__(self, params: Params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = False, trust_coeff: float = 0.001, eps: float = 1e-8,
                 always_adapt: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"invalid lr {lr}, momentum {momentum} or weight_decay {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                        trust_coeff=trust_coeff, eps=eps, always_adapt=always_adapt)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if wd != 0 or group["always_adapt"]:
                    w_norm, g_norm = p.norm(2.0), g.norm(2.0)
                    trust = group["trust_coeff"] * w_norm / (g_norm + w_norm * wd + group["eps"])
                    trust = torch.where((w_norm > 0) & (g_norm > 0), trust, 1.0)
                    g = g.add(p, alpha=wd).mul_(trust)
                if m != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        buf = state["momentum_buffer"] = g.detach().clone()
                    else:
                        buf = state["momentum_buffer"].mul_(m).add_(g)
                    g = g.add(buf, alpha=m) if group["nesterov"] else buf
                p.add_(g, alpha=-lr)
        return loss


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", arXiv:1904.00962), as ``timm.optim.Lamb``
    (the NVIDIA apex FusedLAMB variant).

    Once per step, over all parameters with a gradient (timm's ``max_grad_norm``, default 1.0; None: off)::

        g <- g / max(1, ||all gradients||_2 / max_grad_norm)

    then per parameter tensor w, at step t (1-based, counted per parameter)::

        m <- b1 * m + (1 - b1) * g;      v <- b2 * v + (1 - b2) * g^2
        r <- (m / (1 - b1^t)) / (sqrt(v) / sqrt(1 - b2^t) + eps) + wd * w
        if weight_decay != 0 or always_adapt:
            r <- r * ||w|| / ||r||      (ratio 1 when ||w|| == 0 or ||r|| == 0)
        w <- w - lr * r

    As in timm, groups with weight_decay 0 (``no_decay_norm_bias``) skip the trust ratio (plain Adam step).
    """

    def __init__(self, params: Params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, max_grad_norm: float | None = 1.0, always_adapt: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid lr {lr}, betas {betas}, eps {eps} or weight_decay {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, always_adapt=always_adapt)
        super().__init__(params, defaults)
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def _grad_divisor(self) -> torch.Tensor | None:
        if self.max_grad_norm is None:
            return None
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return None
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        return (total / self.max_grad_norm).clamp_(min=1.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        divisor = self._grad_divisor()
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if divisor is None else p.grad / divisor
                state = self.state[p]
                if "step" not in state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(g, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                update = (exp_avg / (1 - beta1**t)).div_(denom)
                if wd != 0:
                    update.add_(p, alpha=wd)
                if wd != 0 or group["always_adapt"]:
                    w_norm, u_norm = p.norm(2.0), update.norm(2.0)
                    update.mul_(torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0))
                p.add_(update, alpha=-lr)
        return loss


def exempt_from_decay(model: nn.Module) -> list[str]:
    """The parameter names (``fnmatch`` patterns, from the model's root) that modules exempt from weight decay by a
    ``no_weight_decay()`` method, as timm's ``create_optimizer_v2`` reads it from the model (``no_weight_decay_list``
    of ``param_groups_weight_decay``); here from every module, so a timm model inside another (a detector's
    backbone) keeps its list."""
    exempt = []
    for prefix, module in model.named_modules():
        method = getattr(module, "no_weight_decay", None)
        if callable(method):
            exempt += [f"{prefix}.{name}" if prefix else name for name in method()]
    return exempt


def param_groups(cfg: OptimConfig, model: nn.Module, model_name: str = "the model") -> list[dict[str, Any]]:
    """The trainable parameters, split as timm's ``param_groups_weight_decay`` does when ``no_decay_norm_bias``:

    1-d parameters (biases, normalisation weights and biases), any ``*.bias`` and the names a module's own
    ``no_weight_decay()`` gives (a timm ViT's ``pos_embed`` and ``cls_token``: :func:`exempt_from_decay`) first, with
    weight_decay 0; the rest with ``cfg.weight_decay``. Otherwise (or without weight decay), one group. With
    ``backbone_lr_scale``
    other than 1, each is split again into the backbone's parameters (``lr_scale``: that fraction of the step's LR,
    :func:`set_lr`) and the rest.
    """
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not (cfg.no_decay_norm_bias and cfg.weight_decay > 0):
        groups = [{"params": named, "weight_decay": cfg.weight_decay}]
    else:
        exempt = exempt_from_decay(model)

        def decayed(name: str, p: nn.Parameter) -> bool:
            return not (p.ndim <= 1 or name.endswith(".bias") or any(fnmatch(name, e) for e in exempt))

        no_decay = [(name, p) for name, p in named if not decayed(name, p)]
        decay = [(name, p) for name, p in named if decayed(name, p)]
        groups = [group for group in ({"params": no_decay, "weight_decay": 0.0},
                                      {"params": decay, "weight_decay": cfg.weight_decay}) if group["params"]]
    if cfg.backbone_lr_scale != 1:
        from bigbatch.largebatch.freeze import backbone

        names = set(backbone(model, model_name, "optim.backbone_lr_scale")[0])
        groups = [{**group, "params": part, **({"lr_scale": cfg.backbone_lr_scale} if in_backbone else {})}
                  for group in groups for in_backbone in (True, False)
                  if (part := [(n, p) for n, p in group["params"] if (n in names) == in_backbone])]
    return [{**group, "params": [p for _, p in group["params"]]} for group in groups]


def build_optimizer(cfg: OptimConfig, model: nn.Module, lr: float | None = None, model_name: str = "the model"
                    ) -> torch.optim.Optimizer:
    """The optimizer ``cfg.name`` (as registered in ``OPTIMIZERS``) over ``model``'s trainable parameters, at
    learning rate ``lr`` (a group's ``lr_scale`` times it, :func:`param_groups`).

    ``lr`` is the LR for the global batch (already scaled by the caller); None: ``cfg.lr`` as it is.
    """
    lr = cfg.lr if lr is None else lr
    optimizer = OPTIMIZERS.get(cfg.name).obj(param_groups(cfg, model, model_name), lr, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return optimizer


def _momentum_for_nesterov(cfg: OptimConfig) -> None:
    if cfg.nesterov and cfg.momentum == 0:
        raise UserError("optim.nesterov: Nesterov momentum needs optim.momentum > 0")


@OPTIMIZERS.register("sgd", fields=OPTIMIZER_KEYS["sgd"])
def _sgd(groups: list[dict[str, Any]], lr: float, cfg: OptimConfig) -> torch.optim.Optimizer:
    """torch.optim.SGD: v = m v + g; w -= lr v (the LR outside the momentum buffer)."""
    _momentum_for_nesterov(cfg)
    return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)


@OPTIMIZERS.register("momentum", fields=OPTIMIZER_KEYS["momentum"])
def _momentum(groups: list[dict[str, Any]], lr: float, cfg: OptimConfig) -> torch.optim.Optimizer:
    _momentum_for_nesterov(cfg)
    return MomentumSGD(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov,
                       momentum_correction=cfg.momentum_correction)


@OPTIMIZERS.register("rmsprop_tf", fields=OPTIMIZER_KEYS["rmsprop_tf"])
def _rmsprop_tf(groups: list[dict[str, Any]], lr: float, cfg: OptimConfig) -> torch.optim.Optimizer:
    """eps 1.0 unless given, as in Cloud TPU's Inception v3 recipe (tensorflow/tpu ``inception_v3.py``)."""
    return RMSpropTF(groups, lr=lr, decay=cfg.rmsprop_decay, momentum=cfg.momentum,
                     eps=1.0 if cfg.eps is None else cfg.eps, weight_decay=cfg.weight_decay,
                     momentum_correction=cfg.momentum_correction)


@OPTIMIZERS.register("adamw", fields=OPTIMIZER_KEYS["adamw"])
def _adamw(groups: list[dict[str, Any]], lr: float, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=lr, betas=cfg.betas, eps=1e-8 if cfg.eps is None else cfg.eps,
                             weight_decay=cfg.weight_decay, **({"fused": True} if cfg.fused else {}))


@OPTIMIZERS.register("lars", fields=OPTIMIZER_KEYS["lars"])
def _lars(groups: list[dict[str, Any]], lr: float, cfg: OptimConfig) -> torch.optim.Optimizer:
    _momentum_for_nesterov(cfg)
    return Lars(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov,
                trust_coeff=cfg.trust_coefficient, eps=1e-8 if cfg.eps is None else cfg.eps)


@OPTIMIZERS.register("lamb", fields=OPTIMIZER_KEYS["lamb"])
def _lamb(groups: list[dict[str, Any]], lr: float, cfg: OptimConfig) -> torch.optim.Optimizer:
    """eps 1e-6 unless given, as timm."""
    return Lamb(groups, lr=lr, betas=cfg.betas, eps=1e-6 if cfg.eps is None else cfg.eps,
                weight_decay=cfg.weight_decay)


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings as the config made them (weight decay, momentum, betas, eps, ``lr_scale``
    ...): everything but its parameters and its LR, which the schedule sets every step."""
    return [{key: value for key, value in group.items() if key not in ("params", "lr")}
            for group in optimizer.param_groups]


def apply_settings(optimizer: torch.optim.Optimizer, settings: list[dict[str, Any]]) -> list[str]:
    """Put ``settings`` (:func:`group_settings` of an optimizer built from this config) back into the groups after
    ``load_state_dict``, which brings the checkpoint's: a resume with ``--set optim.weight_decay=...`` trains with
    the value asked for. Its momentum buffers and LR stay the checkpoint's. What changed, as ``key old -> new``."""
    def same(a: Any, b: Any) -> bool:
        return (tuple(a) if isinstance(a, list) else a) == (tuple(b) if isinstance(b, list) else b)

    changed = []
    for group, wanted in zip(optimizer.param_groups, settings, strict=True):
        for key, value in wanted.items():
            if key in group and not same(group[key], value):
                change = f"{key} {group[key]} -> {value}"
                if change not in changed:
                    changed.append(change)
            group[key] = value
    return changed


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's LR (``lr`` times its ``lr_scale``); with the LR inside the momentum buffer and
    ``momentum_correction``, rescale it.

    Goyal et al. 2017, remark 2: for u <- m u + lr g, a change lr_old -> lr_new multiplies u by lr_new / lr_old,
    which makes the updates those of w -= lr * v, v <- m v + g (PyTorch SGD) under any LR sequence. A buffer
    whose old LR was 0 is left as it is (nothing to rescale it by).
    """
    correct = getattr(optimizer, "lr_in_momentum", False) and getattr(optimizer, "momentum_correction", False)
    for group in optimizer.param_groups:
        lr_old, lr_new = group["lr"], lr * group.get("lr_scale", 1.0)  # optim.backbone_lr_scale: param_groups
        group["lr"] = lr_new
        if not correct or lr_old == lr_new or lr_old == 0:
            continue
        ratio = lr_new / lr_old
        for p in group["params"]:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                buf.mul_(ratio)
