"""A Darknet network as a torch module, built from the specs of a ``.cfg`` (``cfg.py``).

One torch module per Darknet layer, in ``DarknetNetwork.layers`` (so names read ``layers.0.conv``, ``layers.0.bn``),
each computing what Darknet's ``forward_*_layer`` computes:

- ``[convolutional]`` (convolutional_layer.c): with ``batch_normalize``, a convolution without bias, then
  ``BatchNorm2d`` (``y = scale * (x - mean) / sqrt(var + 1e-5) + shift``; Darknet's rolling statistics
  ``r = 0.99 r + 0.01 batch``, i.e. torch's ``momentum=0.01``), then the activation; without, a convolution with
  bias, then the activation. Padding ``padding * dilation`` cells of zeros, as Darknet's im2col.
  Initialised as make_convolutional_layer: ``w ~ U(-1, 1) * sqrt(2 / (size * size * c / groups))``, biases 0,
  BN scales 1.
- ``[maxpool]`` (maxpool_layer.c): ``padding // 2`` cells left and top, enough right and bottom for
  ``out = (in + padding - size) // stride + 1`` windows; out-of-bounds cells read as ``-FLT_MAX``.
- ``[upsample]`` (upsample_layer.c): ``out[y, x] = scale * in[y // stride, x // stride]``.
- ``[shortcut]`` (shortcut_layer.c): ``activation(alpha * previous + beta * sum(sources))``.
- ``[route]`` (route_layer.c): the sources' ``group_id``-th of ``groups`` channel chunks, concatenated.
- ``[dropout]`` (dropout_layer.c): ``nn.Dropout(probability)`` (zero with p, scale the rest by 1 / (1 - p)).
- ``[yolo]`` (yolo_layer.c): passes its input through. ``forward`` returns, per ``[yolo]`` in cfg order, the tensor
  Darknet's yolo layer receives, ``(N, len(mask) * (5 + classes), H, W)``, raw: the logistic on x, y, objectness
  and classes and the box decoding that forward_yolo_layer applies belong to the loss and the decoder, which read
  the anchors, masks, classes and strides from ``DarknetNetwork.yolo_heads``.

``layer_table`` prints the layers as Darknet does at load time, with the parameter count (convolution weights and
biases, BN scales and shifts; BN running statistics are buffers, not parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from bigbatch.darknet.activations import activation
from bigbatch.darknet.cfg import (
    Convolutional,
    DarknetCfg,
    Dropout,
    LayerSpec,
    MaxPool,
    Route,
    Shortcut,
    Upsample,
    Yolo,
    read_darknet_cfg,
    with_classes,
)
from bigbatch.darknet.shapes import Shape, layer_shapes
from bigbatch.errors import UserError

BN_EPS = 1e-5
"""Darknet's batch-norm epsilon (normalize_cpu in AlexeyAB's blas.c, cuDNN's in both forks)."""
BN_MOMENTUM = 0.01
"""Darknet's rolling statistics: ``rolling = 0.99 * rolling + 0.01 * batch`` (torch's momentum is the 0.01)."""


# ----------------------------------------------------------------------------- one module per layer kind


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x)


class DarknetMaxPool(nn.Module):
    """``[maxpool]`` with Darknet's padding: ``padding // 2`` left/top, the rest right/bottom, at ``-FLT_MAX``."""

    def __init__(self, spec: MaxPool) -> None:
        super().__init__()
        self.size, self.stride, self.padding = spec.size, (spec.stride_y, spec.stride_x), spec.padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size, (sy, sx), p = self.size, self.stride, self.padding
        h, w = x.shape[-2:]
        out_h, out_w = (h + p - size) // sy + 1, (w + p - size) // sx + 1
        first = p // 2  # maxpool_layer.c: w_offset = h_offset = -pad / 2
        bottom = max(0, (out_h - 1) * sy + size - h - first)  # the cells the last window needs beyond the input
        right = max(0, (out_w - 1) * sx + size - w - first)
        if first == bottom == right == 0:
            return F.max_pool2d(x, size, (sy, sx))
        if first == bottom == right and 2 * first <= size:  # torch's own (-inf) padding: no window is all padding
            return F.max_pool2d(x, size, (sy, sx), padding=first)
        x = F.pad(x, (first, right, first, bottom), value=torch.finfo(x.dtype).min)
        return F.max_pool2d(x, size, (sy, sx))

    def extra_repr(self) -> str:
        return f"size={self.size}, stride={self.stride}, padding={self.padding}"


class DarknetUpsample(nn.Module):
    """``[upsample]``: nearest neighbour by an integer ``stride``, times ``scale``."""

    def __init__(self, spec: Upsample) -> None:
        super().__init__()
        self.stride, self.scale = spec.stride, spec.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        s = self.stride
        x = x[:, :, :, None, :, None].expand(n, c, h, s, w, s).reshape(n, c, h * s, w * s)
        return x * self.scale if self.scale != 1 else x

    def extra_repr(self) -> str:
        return f"stride={self.stride}, scale={self.scale:g}"


class DarknetShortcut(nn.Module):
    """``[shortcut]``: ``activation(alpha * previous + beta * sum(sources))``."""

    def __init__(self, spec: Shortcut) -> None:
        super().__init__()
        self.sources, self.alpha, self.beta = spec.sources, spec.alpha, spec.beta
        self.act = activation(spec.activation)

    def forward(self, x: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
        added = sources[0]
        for other in sources[1:]:
            added = added + other
        if self.alpha != 1:
            x = self.alpha * x
        if self.beta != 1:
            added = self.beta * added
        return self.act(x + added)

    def extra_repr(self) -> str:
        return f"from={list(self.sources)}"


class DarknetRoute(nn.Module):
    """``[route]``: the ``group_id``-th of ``groups`` channel chunks of each source, concatenated."""

    def __init__(self, spec: Route) -> None:
        super().__init__()
        self.sources, self.groups, self.group_id = spec.sources, spec.groups, spec.group_id

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        if self.groups > 1:
            sources = [s.chunk(self.groups, dim=1)[self.group_id] for s in sources]
        return sources[0] if len(sources) == 1 else torch.cat(sources, dim=1)

    def extra_repr(self) -> str:
        groups = f", groups={self.groups}, group_id={self.group_id}" if self.groups > 1 else ""
        return f"layers={list(self.sources)}{groups}"


class YoloOutput(nn.Module):
    """``[yolo]``: the identity; its input is one of the network's outputs."""

    def __init__(self, spec: Yolo) -> None:
        super().__init__()
        self.spec = spec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"mask={list(self.spec.mask)}, classes={self.spec.classes}"


def _module(spec: LayerSpec, x: Shape) -> nn.Module:
    if isinstance(spec, Convolutional):
        return ConvBlock(spec, x.channels)
    if isinstance(spec, MaxPool):
        return DarknetMaxPool(spec)
    if isinstance(spec, Upsample):
        return DarknetUpsample(spec)
    if isinstance(spec, Shortcut):
        return DarknetShortcut(spec)
    if isinstance(spec, Route):
        return DarknetRoute(spec)
    if isinstance(spec, Yolo):
        return YoloOutput(spec)
    if isinstance(spec, Dropout):
        return nn.Dropout(spec.probability)
    raise TypeError(f"no module for {type(spec).__name__}")


# ----------------------------------------------------------------------------- the network


@dataclass(frozen=True)
class YoloHead:
    """What a YOLO loss or decoder needs of one ``[yolo]`` layer: the masked anchors (w, h, input pixels), the
    grid and the stride (input size / grid size, per axis) at the size the network was built for, and the spec
    (every ``[yolo]`` key)."""

    index: int
    output: int
    """Position of this head in the list ``DarknetNetwork.forward`` returns."""
    anchors: tuple[tuple[float, float], ...]
    mask: tuple[int, ...]
    classes: int
    grid: tuple[int, int]
    """(height, width) of the output at the built input size."""
    stride: tuple[float, float]
    """(input height / grid height, input width / grid width)."""
    spec: Yolo


class DarknetNetwork(nn.Module):
    """The network of ``cfg`` for a ``channels x height x width`` input (default: the ``[net]`` size).

    ``forward(x)`` returns the list of the raw inputs of the ``[yolo]`` layers, in cfg order (the network is fully
    convolutional; another input size works where its route and shortcut sources keep equal sizes)."""

    def __init__(self, cfg: DarknetCfg, width: int | None = None, height: int | None = None) -> None:
        super().__init__()
        width = width or cfg.net.width
        height = height or cfg.net.height
        for key, value in (("width", width), ("height", height), ("channels", cfg.net.channels)):
            if not value:
                raise UserError(f"{cfg.path}:{cfg.net.lines.get(key, cfg.net.line)}: [net] {key}: missing; "
                                "expected an integer >= 1 (or give the input size)")
            if value < 1:
                raise UserError(f"{key}: expected an integer >= 1, not {value}")
        assert cfg.net.channels and width and height
        self.cfg = cfg
        self.input_shape = Shape(cfg.net.channels, height, width)
        self.shapes = layer_shapes(cfg, cfg.net.channels, height, width)
        self.layers = nn.ModuleList(_module(spec, x) for spec, (x, _) in zip(cfg.layers, self.shapes, strict=True))
        self.yolo_heads = [
            YoloHead(spec.index, n, spec.masked_anchors, spec.mask, spec.classes,
                     (self.shapes[spec.index][1].height, self.shapes[spec.index][1].width),
                     (height / self.shapes[spec.index][1].height, width / self.shapes[spec.index][1].width), spec)
            for n, spec in enumerate(cfg.yolo_layers)]
        read = {i for spec in cfg.layers if isinstance(spec, (Route, Shortcut)) for i in spec.sources}
        self._kept = frozenset(read)
        self._kinds = tuple(type(spec) for spec in cfg.layers)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        kept: dict[int, torch.Tensor] = {}  # the outputs a later route or shortcut reads
        heads: list[torch.Tensor] = []
        for i, (layer, kind) in enumerate(zip(self.layers, self._kinds, strict=True)):
            if kind is Route:
                x = layer([kept[j] for j in layer.sources])
            elif kind is Shortcut:
                x = layer(x, [kept[j] for j in layer.sources])
            else:
                x = layer(x)
            if kind is Yolo:
                heads.append(x)
            if i in self._kept:
                kept[i] = x
        return heads

    def conv_blocks(self) -> list[ConvBlock]:
        """The ``[convolutional]`` layers in order (the layers with weights in a ``.weights`` file)."""
        return [layer for layer in self.layers if isinstance(layer, ConvBlock)]


def load_network(path: str | Path, width: int | None = None, height: int | None = None,
                 classes: int | None = None) -> DarknetNetwork:
    """The network of the ``.cfg`` at ``path`` for a ``width x height`` input (default: its ``[net]``), for
    ``classes`` classes (default: the cfg's; see ``cfg.with_classes``)."""
    cfg = read_darknet_cfg(path)
    if classes is not None:
        cfg = with_classes(cfg, classes)
    return DarknetNetwork(cfg, width, height)


def parameter_count(network: nn.Module) -> int:
    """The trainable values: convolution weights and biases, BN scales and shifts (not BN running statistics)."""
    return sum(p.numel() for p in network.parameters())


def _bflops(spec: Convolutional, x: Shape, out: Shape) -> float:
    """Darknet's ``l.bflops = 2 * nweights * out_h * out_w / 1e9``, ``nweights = c / groups * n * size * size``."""
    return 2.0 * (x.channels // spec.groups) * spec.filters * spec.size * spec.size * out.height * out.width / 1e9


def layer_table(network: DarknetNetwork) -> str:
    """The layers as Darknet prints them at load time (index, type, filters, size/stride, input -> output), then
    the totals: billions of floating-point operations of the convolutions, and the parameter count."""
    lines = [f"{'layer':>5}  {'type':<9} {'filters':>8}  {'size/strd(dil)':<14} {'input':>19}    output"]
    total_bflops = 0.0
    for spec, (x, out) in zip(network.cfg.layers, network.shapes, strict=True):
        filters, size, note = "", "", ""
        name = spec.kind
        if isinstance(spec, Convolutional):
            name, filters = "conv", str(spec.filters)
            stride = (f"{spec.stride_x}" if spec.stride_x == spec.stride_y else f"{spec.stride_x}x{spec.stride_y}")
            size = f"{spec.size} x{spec.size:2d}/{stride:>2}" + (f"({spec.dilation})" if spec.dilation > 1 else "")
            bflops = _bflops(spec, x, out)
            total_bflops += bflops
            note = f"{bflops:.3f} BF" + (f"  groups {spec.groups}" if spec.groups > 1 else "")
        elif isinstance(spec, MaxPool):
            name = "max"
            stride = (f"{spec.stride_x}" if spec.stride_x == spec.stride_y else f"{spec.stride_x}x{spec.stride_y}")
            size = f"{spec.size} x{spec.size:2d}/{stride:>2}"
        elif isinstance(spec, Upsample):
            size = f"{spec.stride}x"
        elif isinstance(spec, Route):
            filters = " ".join(str(i) for i in spec.sources)
            note = f"group {spec.group_id}/{spec.groups}" if spec.groups > 1 else ""
        elif isinstance(spec, Shortcut):
            filters = " ".join(str(i) for i in spec.sources)
        elif isinstance(spec, Yolo):
            head = next(h for h in network.yolo_heads if h.index == spec.index)
            note = (f"mask {','.join(map(str, spec.mask))}  classes {spec.classes}  stride "
                    f"{head.stride[1]:g}")
        elif isinstance(spec, Dropout):
            note = f"p = {spec.probability:g}"
        shown_in = "" if isinstance(spec, Route) else str(x)
        lines.append(f"{spec.index:5d}  {name:<9} {filters:>8}  {size:<14} {shown_in:>19} -> {out}  {note}".rstrip())
    lines.append(f"total {total_bflops:.3f} BFLOPs at {network.input_shape.width} x {network.input_shape.height}; "
                 f"{len(network.cfg.layers)} layers; {parameter_count(network):,} parameters")
    return "\n".join(lines)
