"""Layers whose weights are not shared across positions: ``[connected]`` (connected_layer.c) and ``[local]``
(local_layer.c, pjreddie's).

- ``[connected]`` (alias ``[conn]``): ``y = act(W x + b)`` over the previous output taken flat (``c * h * w``, in
  Darknet's CHW order); with ``batch_normalize``, ``y = act(scale * (W x - mean) / sqrt(var + 1e-5) + b)``. Out
  ``1 x 1 x output``. In a ``.weights`` file (save_connected_weights): biases[output], weights[output x inputs], then
  with BN scales, rolling mean, rolling variance.
- ``[local]``: a convolution whose kernel differs at each output location: ``out[f, l] = act(sum_k W[l, f, k]
  cols[k, l] + b[f, l])``, ``cols`` Darknet's im2col of the input (``k`` over channel, kernel row, kernel column, as
  torch's ``unfold``), ``l`` over the ``out_h x out_w`` locations. Output size (local_out_height):
  ``(in - size) // stride + 1`` without ``pad``, ``(in - 1) // stride + 1`` with, im2col padding ``pad`` cells: the
  two agree only when ``2 * pad == size - 1``, which bigbatch requires. In a ``.weights`` file: biases[n x
  locations] (CHW), then weights, location by location, each ``n x (c * size * size)``.

Both initialise as Darknet: weights uniform in ``±sqrt(2 / inputs)`` (connected) or ``±sqrt(2 / (size^2 c))``
(local), biases 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bigbatch.darknet.activations import activation
from bigbatch.darknet.layers.conv import BN_EPS
from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind, strides

CONNECTED_BN_MOMENTUM = 0.05
"""A connected layer's rolling statistics in training: ``.95 * rolling + .05 * batch`` (AlexeyAB's CPU code)."""


@dataclass(frozen=True, kw_only=True)
class Connected(LayerSpec):
    kind = "connected"
    output: int = 1
    activation: str = "logistic"
    batch_normalize: bool = False


@dataclass(frozen=True, kw_only=True)
class Local(LayerSpec):
    kind = "local"
    filters: int = 1
    size: int = 1
    stride: int = 1
    pad: int = 0
    activation: str = "logistic"


# ----------------------------------------------------------------------------- [connected]


def parse_connected(s: SectionReader, common: dict[str, Any]) -> Connected:
    return Connected(**common, output=s.integer("output", 1, 1), activation=s.activation("logistic"),
                     batch_normalize=s.flag("batch_normalize"))


def connected_shape(cfg: DarknetCfg, layer: Connected, x: Shape, outputs: list[Shape]) -> Shape:
    return Shape(layer.output, 1, 1)


class ConnectedBlock(nn.Module):
    """``[connected]``: flatten, linear (+ BN), activation; out ``(N, output, 1, 1)``."""

    def __init__(self, spec: Connected, inputs: int) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, spec.output, bias=not spec.batch_normalize)
        # forward_connected_layer (AlexeyAB, CPU): rolling = .95 rolling + .05 batch (a convolution's is .99/.01)
        self.bn = (nn.BatchNorm1d(spec.output, eps=BN_EPS, momentum=CONNECTED_BN_MOMENTUM) if spec.batch_normalize
                   else None)
        self.act = activation(spec.activation)
        with torch.no_grad():  # make_connected_layer: scale * rand_uniform(-1, 1), scale = sqrt(2 / inputs)
            self.linear.weight.uniform_(-1, 1).mul_(math.sqrt(2.0 / inputs))
            if self.linear.bias is not None:
                self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x.flatten(1))
        if self.bn is not None:
            y = self.bn(y)
        return self.act(y)[:, :, None, None]

    def darknet_tensors(self) -> list[tuple[str, torch.Tensor]]:
        if self.bn is not None:
            return [("biases", self.bn.bias), ("weights", self.linear.weight), ("scales", self.bn.weight),
                    ("rolling_mean", self.bn.running_mean), ("rolling_variance", self.bn.running_var)]
        assert self.linear.bias is not None
        return [("biases", self.linear.bias), ("weights", self.linear.weight)]


def build_connected(spec: Connected, x: Shape, outputs: list[Shape]) -> ConnectedBlock:
    return ConnectedBlock(spec, x.size)


def connected_row(spec: Connected, x: Shape, out: Shape, net: Shape) -> TableRow:
    flops = 2.0 * x.size * spec.output / 1e9
    return TableRow("connected", "", "", f"{x.size:,} -> {spec.output:,}  {flops:.3f} BF", flops)


# ----------------------------------------------------------------------------- [local]


def parse_local(s: SectionReader, common: dict[str, Any]) -> Local:
    return Local(**common, filters=s.integer("filters", 1, 1), size=s.integer("size", 1, 1),
                 stride=s.integer("stride", 1, 1), pad=s.integer("pad", 0, 0), activation=s.activation("logistic"))


def local_shape(cfg: DarknetCfg, layer: Local, x: Shape, outputs: list[Shape]) -> Shape:
    if layer.pad and 2 * layer.pad != layer.size - 1:
        raise cfg.error(layer, "pad", f"a [local] with pad needs size = 2 * pad + 1 (here size {layer.size}, pad "
                                      f"{layer.pad}): Darknet's output size and its im2col disagree otherwise")
    if min(x.height, x.width) < (1 if layer.pad else layer.size):
        raise cfg.error(layer, "size", f"the window ({layer.size}) is larger than its input ({x})")
    return local_out(layer, x)


class LocalBlock(nn.Module):
    """``[local]``: unshared weights ``(locations, filters, c * size * size)``, biases ``(filters, locations)``."""

    def __init__(self, spec: Local, x: Shape, out: Shape) -> None:
        super().__init__()
        self.size, self.stride, self.pad, self.out = spec.size, spec.stride, spec.pad, out
        locations, fan_in = out.height * out.width, x.channels * spec.size * spec.size
        scale = math.sqrt(2.0 / fan_in)  # make_local_layer
        self.weight = nn.Parameter(torch.empty(locations, spec.filters, fan_in).uniform_(-1, 1).mul_(scale))
        self.bias = nn.Parameter(torch.zeros(spec.filters, locations))
        self.act = activation(spec.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = F.unfold(x, self.size, padding=self.pad, stride=self.stride)  # (N, k, locations)
        y = torch.einsum("lfk,nkl->nfl", self.weight, cols) + self.bias
        return self.act(y.view(x.shape[0], -1, self.out.height, self.out.width))

    def darknet_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [("biases", self.bias), ("weights", self.weight)]


def build_local(spec: Local, x: Shape, outputs: list[Shape]) -> LocalBlock:
    return LocalBlock(spec, x, local_out(spec, x))


def local_out(spec: Local, x: Shape) -> Shape:
    """local_out_height/width: ``(in - size) // stride + 1``, or ``(in - 1) // stride + 1`` with ``pad``."""
    span = 1 if spec.pad else spec.size
    return Shape(spec.filters, (x.height - span) // spec.stride + 1, (x.width - span) // spec.stride + 1)


def local_row(spec: Local, x: Shape, out: Shape, net: Shape) -> TableRow:
    flops = 2.0 * x.channels * spec.size * spec.size * spec.filters * out.height * out.width / 1e9
    return TableRow("local", str(spec.filters), f"{spec.size} x{spec.size:2d}/{strides(spec.stride, spec.stride):>2}",
                    f"{flops:.3f} BF", flops)


register_kind(LayerKind("connected", ("connected", "conn"), parse_connected, connected_shape, build_connected,
                        connected_row))
register_kind(LayerKind("local", ("local",), parse_local, local_shape, build_local, local_row))
