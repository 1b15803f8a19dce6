"""``[convolutional]`` (alias ``[conv]``): ``filters`` outputs of ``size x size`` kernels over ``channels / groups``
inputs each, then batch norm (``batch_normalize``) and the activation (convolutional_layer.c).

Padding, as parser.c: ``padding`` (default 0) unless ``pad`` is non-zero, then ``size // 2``: ``pad`` wins over
``padding``. ``stride_x``/``stride_y`` default to ``stride``. Output size per axis:
``out = (in + 2 * padding - size) // stride + 1``.

The module: with ``batch_normalize``, a convolution without bias, then ``BatchNorm2d``
(``y = scale * (x - mean) / sqrt(var + 1e-5) + shift``; Darknet's rolling statistics ``r = 0.99 r + 0.01 batch``,
i.e. torch's ``momentum=0.01``), then the activation; without, a convolution with bias, then the activation.
Padding ``padding * dilation`` cells of zeros, as Darknet's im2col. Initialised as make_convolutional_layer:
``w ~ U(-1, 1) * sqrt(2 / (size * size * c / groups))``, biases 0, BN scales 1.

A dilated convolution runs in Darknet with ``padding * dilation`` cells of padding and a kernel spanning
``(size - 1) * dilation + 1`` cells, while its output size is the formula above: the two agree only when
``2 * padding == size - 1``, which bigbatch requires of a dilated convolution.

``cbn`` (AlexeyAB's cross-iteration batch norm): non-zero turns batch norm on, as parser.c's ``if (cbn)
batch_normalize = 2`` does, with or without ``batch_normalize``: the layer has BN and its values are in the
``.weights`` file. Darknet's CBN differs in training only (its statistics are averaged over the last iterations);
bigbatch trains the layer as plain batch norm, and a warning says so.

In a ``.weights`` file (save_convolutional_weights): biases (the BN shift), then with BN scales, rolling mean,
rolling variance, then the weights (OIHW). A layer with AlexeyAB's ``share_index`` uses another convolution's
weights, biases and BN (its dilation and stride may differ) and saves nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.activations import activation
from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind, strides

BN_EPS = 1e-5
"""Darknet's batch-norm epsilon (normalize_cpu in AlexeyAB's blas.c, cuDNN's in both forks)."""
BN_MOMENTUM = 0.01
"""Darknet's rolling statistics: ``rolling = 0.99 * rolling + 0.01 * batch`` (torch's momentum is the 0.01)."""


@dataclass(frozen=True, kw_only=True)
class Convolutional(LayerSpec):
    """``[convolutional]``: the keys of parse_convolutional that bigbatch builds."""

    kind = "convolutional"
    filters: int = 1
    size: int = 1
    stride_x: int = 1
    stride_y: int = 1
    padding: int = 0
    groups: int = 1
    dilation: int = 1
    batch_normalize: bool = False
    activation: str = "logistic"
    share_index: int | None = None
    """AlexeyAB's ``share_index``: the layer whose weights, biases and BN (scales and rolling statistics) this one
    uses; it saves none of its own in a ``.weights`` file."""


REFUSED = {"binary": "0", "xnor": "0", "bin_output": "0", "sway": "0", "rotate": "0", "stretch": "0",
           "stretch_sway": "0", "antialiasing": "0", "flipped": "0", "coordconv": "0"}


def parse(s: SectionReader, common: dict[str, Any]) -> Convolutional:
    s.refuse(REFUSED)
    share = s.integer("share_index", -1000000000)  # parser.c: absent is -1000000000; i < 0 means index + i
    size = s.integer("size", 1, 1)
    stride = s.integer("stride", 1, 1)
    pad = s.integer("pad", 0, 0)
    padding = s.integer("padding", 0, 0)
    dilation = s.integer("dilation", 1, 1)
    batch_normalize = s.flag("batch_normalize")
    if s.integer("cbn", 0):  # parser.c: if (cbn) batch_normalize = 2; BN on, with its values in the .weights file
        batch_normalize = True
        s.warn("cbn", "batch norm on, as Darknet turns it on; its cross-iteration statistics (CBN) are trained as "
                      "plain batch norm (the network and its .weights are Darknet's)")
    return Convolutional(
        **common,
        filters=s.integer("filters", 1, 1),
        size=size,
        stride_x=s.integer("stride_x", stride, 1),
        stride_y=s.integer("stride_y", stride, 1),
        padding=size // 2 if pad else padding,  # parser.c: if(pad) padding = size/2;
        groups=s.integer("groups", 1, 1),
        dilation=1 if size == 1 else dilation,  # parser.c: if (size == 1) dilation = 1;
        batch_normalize=batch_normalize,
        activation=s.activation("logistic"),  # Darknet's default for a convolution
        share_index=None if share == -1000000000 else s.layer_index(share, "share_index"),
    )


def window_out(cfg: DarknetCfg, layer: LayerSpec, size_in: int, span: int, stride: int, axis: str) -> int:
    """``(size_in - span) // stride + 1`` where the window fits (``size_in`` already padded)."""
    if size_in < span:
        raise cfg.error(layer, "size", f"the window ({span}) is larger than the {axis} of its padded input "
                                       f"({size_in}); the input is too small for this network")
    return (size_in - span) // stride + 1


def shape(cfg: DarknetCfg, layer: Convolutional, x: Shape, outputs: list[Shape]) -> Shape:
    if layer.share_index is not None:
        owner = cfg.layers[layer.share_index]
        owner_in = outputs[owner.index - 1].channels if owner.index else None
        if not isinstance(owner, Convolutional) or owner.share_index is not None or (
                owner.filters, owner.size, owner.groups, owner.batch_normalize, owner_in) != (
                layer.filters, layer.size, layer.groups, layer.batch_normalize, x.channels):
            raise cfg.error(layer, "share_index", f"layer {layer.share_index} is not a [convolutional] of the same "
                                                  "filters, size, groups, batch_normalize and input channels")
    if x.channels % layer.groups or layer.filters % layer.groups:
        raise cfg.error(layer, "groups", f"{layer.groups} does not divide both the input channels "
                                         f"({x.channels}) and filters ({layer.filters})")
    if layer.dilation > 1 and 2 * layer.padding != layer.size - 1:
        raise cfg.error(layer, "dilation", f"a dilated convolution needs padding = (size - 1) / 2 (here size "
                                           f"{layer.size}, padding {layer.padding}): Darknet's output size and "
                                           "its im2col disagree otherwise")
    return Shape(layer.filters,
                 window_out(cfg, layer, x.height + 2 * layer.padding, layer.size, layer.stride_y, "height"),
                 window_out(cfg, layer, x.width + 2 * layer.padding, layer.size, layer.stride_x, "width"))


class ConvBlock(nn.Module):
    """``[convolutional]``: conv (+ BN) + activation."""

    def __init__(self, spec: Convolutional, in_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, spec.filters, spec.size, stride=(spec.stride_y, spec.stride_x),
                              padding=spec.padding * spec.dilation, dilation=spec.dilation, groups=spec.groups,
                              bias=not spec.batch_normalize)
        self.bn = nn.BatchNorm2d(spec.filters, eps=BN_EPS, momentum=BN_MOMENTUM) if spec.batch_normalize else None
        self.act = activation(spec.activation)
        fan_in = spec.size * spec.size * (in_channels // spec.groups)
        with torch.no_grad():  # make_convolutional_layer: scale * rand_uniform(-1, 1), scale = sqrt(2 / fan_in)
            self.conv.weight.uniform_(-1, 1).mul_(math.sqrt(2.0 / fan_in))
            if self.conv.bias is not None:
                self.conv.bias.zero_()

        self.share_index = spec.share_index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x)

    def link(self, layers: nn.ModuleList) -> None:
        """With ``share_index``: use that layer's weight, bias and BN module (one set of parameters)."""
        if self.share_index is not None:
            owner = layers[self.share_index]
            self.conv.weight, self.conv.bias, self.bn = owner.conv.weight, owner.conv.bias, owner.bn

    def darknet_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The tensors of the layer in a ``.weights`` file, in order, by Darknet's names (none when shared)."""
        if self.share_index is not None:
            return []
        if self.bn is not None:
            return [("biases", self.bn.bias), ("scales", self.bn.weight), ("rolling_mean", self.bn.running_mean),
                    ("rolling_variance", self.bn.running_var), ("weights", self.conv.weight)]
        assert self.conv.bias is not None
        return [("biases", self.conv.bias), ("weights", self.conv.weight)]


def build(spec: Convolutional, x: Shape, outputs: list[Shape]) -> ConvBlock:
    return ConvBlock(spec, x.channels)


def bflops(spec: Convolutional, x: Shape, out: Shape) -> float:
    """Darknet's ``l.bflops = 2 * nweights * out_h * out_w / 1e9``, ``nweights = c / groups * n * size * size``."""
    return 2.0 * (x.channels // spec.groups) * spec.filters * spec.size * spec.size * out.height * out.width / 1e9


def row(spec: Convolutional, x: Shape, out: Shape, net: Shape) -> TableRow:
    size = f"{spec.size} x{spec.size:2d}/{strides(spec.stride_x, spec.stride_y):>2}" + (
        f"({spec.dilation})" if spec.dilation > 1 else "")
    flops = bflops(spec, x, out)
    note = f"{flops:.3f} BF" + (f"  groups {spec.groups}" if spec.groups > 1 else "")
    return TableRow("conv", str(spec.filters), size, note, flops)


register_kind(LayerKind(
    "convolutional", ("convolutional", "conv"), parse, shape, build, row,
    ignored=frozenset({"dot", "angle", "grad_centr", "reverse", "assisted_excitation"}), refused=REFUSED))
