"""Darknet's activation functions as torch modules, by the name a ``.cfg`` gives them.

Each formula is Darknet's own (``*_activate`` in src/activations.h of AlexeyAB/darknet, which holds pjreddie's
too). Only those with an exact torch equivalent, or a few lines of torch computing the same formula, are here;
their gradients are autograd's of the same formula, which equal Darknet's ``*_gradient`` (computed there from the
output) wherever the formula is differentiable.

    linear     x
    logistic   1 / (1 + e^-x)                                   torch.sigmoid
    loggy      2 / (1 + e^-x) - 1
    tanh       (e^2x - 1) / (e^2x + 1)                          torch.tanh
    relu       x * (x > 0)
    relu6      min(max(x, 0), 6)
    leaky      x > 0 ? x : 0.1 x
    relie      x > 0 ? x : 0.01 x
    ramp       x * (x > 0) + 0.1 x
    elu        x >= 0 ? x : e^x - 1
    selu       x >= 0 ? 1.0507 x : 1.0507 * 1.6732 (e^x - 1)    (Darknet's rounded constants, not torch's SELU)
    gelu       0.5 x (1 + tanh(0.797885 x + 0.035677 x^3))      (Darknet's rounded tanh form, not torch's GELU)
    swish      x * logistic(x)                                  torch SiLU
    mish       x * tanh(softplus(x)), softplus(x) = x above 20  torch Mish (the same threshold)
    hard_mish  x > 0 ? x : (x > -2 ? x^2 / 2 + x : 0)
    hardtan    x < -1 ? -1 : (x > 1 ? 1 : x)                    torch Hardtanh
    lhtan      x < 0 ? 0.001 x : (x > 1 ? 0.001 (x - 1) + 1 : x)
    plse       x < -4 ? 0.01 (x + 4) : (x > 4 ? 0.01 (x - 4) + 1 : 0.125 x + 0.5)

Not here: ``stair`` (Darknet's gradient is not its derivative), ``revleaky`` and the ``normalize_channels*``
family (not element-wise). Darknet falls back to relu for an unknown name; bigbatch refuses it instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class Formula(nn.Module):
    """An element-wise activation given by a function of a tensor (named, for ``print(model)``)."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.name = name
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


def _loggy(x: torch.Tensor) -> torch.Tensor:
    return 2 * torch.sigmoid(x) - 1


def _ramp(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x) + 0.1 * x


def _selu(x: torch.Tensor) -> torch.Tensor:
    return 1.0507 * F.elu(x, alpha=1.6732)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(0.797885 * x + 0.035677 * x * x * x))


def _hard_mish(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, torch.where(x > -2, x * x / 2 + x, torch.zeros_like(x)))


def _lhtan(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 0, 0.001 * x, torch.where(x > 1, 0.001 * (x - 1) + 1, x))


def _plse(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x < -4, 0.01 * (x + 4), torch.where(x > 4, 0.01 * (x - 4) + 1, 0.125 * x + 0.5))


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "linear": nn.Identity,
    "logistic": nn.Sigmoid,
    "loggy": lambda: Formula("loggy", _loggy),
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "relu6": nn.ReLU6,
    "leaky": lambda: nn.LeakyReLU(0.1),
    "relie": lambda: nn.LeakyReLU(0.01),
    "ramp": lambda: Formula("ramp", _ramp),
    "elu": nn.ELU,
    "selu": lambda: Formula("selu", _selu),
    "gelu": lambda: Formula("gelu", _gelu),
    "swish": nn.SiLU,
    "mish": nn.Mish,
    "hard_mish": lambda: Formula("hard_mish", _hard_mish),
    "hardtan": lambda: nn.Hardtanh(-1.0, 1.0),
    "lhtan": lambda: Formula("lhtan", _lhtan),
    "plse": lambda: Formula("plse", _plse),
}
"""Darknet activation name -> a function building its module."""


def activation(name: str) -> nn.Module:
    """The module computing Darknet's activation ``name`` (a key of :data:`ACTIVATIONS`)."""
    return ACTIVATIONS[name]()
