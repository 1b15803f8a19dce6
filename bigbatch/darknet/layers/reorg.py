"""``[reorg]`` (reorg_layer.c, AlexeyAB's reorg_old_layer.c) and AlexeyAB's ``[reorg3d]`` (reorg_layer.c): a
``stride x stride`` block of cells moved into channels, by Darknet's ``reorg_cpu``.

``reorg_cpu(x, W, H, C, s, forward=0)`` (blas.c, the same arithmetic in both forks) reads its input as a
``C / s^2 x H*s x W*s`` array ``X`` and writes ``out[k, j, i] = X[k mod C', j*s + (k div C') div s,
i*s + (k div C') mod s]`` for ``k < C, j < H, i < W`` (``C' = C / s^2``), i.e. ``X`` viewed as
``(C', H, s, W, s)`` and permuted to ``(s, s, C', H, W)``; ``forward=1`` (``reverse``) is the inverse.

- ``[reorg]`` calls it with the layer's *input* sizes as ``(W, H, C)``: the input's flat buffer is read as
  ``c / s^2 x h*s x w*s`` (not as the ``c x h x w`` it is), which is why YOLOv2's passthrough is not a plain
  space-to-depth; the output is ``c*s^2 x h/s x w/s``. With ``reverse``, the output is ``c/s^2 x h*s x w*s``.
  pjreddie's ``extra=n`` instead passes the input through flat, followed by ``n`` zeros (``go.cfg``: a pass move
  after the 19 x 19 board); ``flatten`` is refused.
- ``[reorg3d]`` calls it with the *output* sizes: the input, read as the ``c x h x w`` it is, becomes
  ``c*s^2 x h/s x w/s`` with channel ``(dy * s + dx) * c + c0`` holding ``x[c0, j*s + dy, i*s + dx]``: a
  space-to-depth. ``reverse`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Reorg(LayerSpec):
    kind = "reorg"
    stride: int = 1
    reverse: bool = False
    extra: int = 0


@dataclass(frozen=True, kw_only=True)
class Reorg3d(LayerSpec):
    kind = "reorg3d"
    stride: int = 1


def space_to_channels(x: torch.Tensor, channels: int, height: int, width: int, s: int) -> torch.Tensor:
    """``reorg_cpu(forward=0)`` on ``x``'s flat buffer read as ``channels x height*s x width*s``: the
    ``channels*s^2 x height x width`` result."""
    n = x.shape[0]
    big = x.reshape(n, channels, height, s, width, s)
    return big.permute(0, 3, 5, 1, 2, 4).reshape(n, channels * s * s, height, width)


def channels_to_space(x: torch.Tensor, channels: int, height: int, width: int, s: int) -> torch.Tensor:
    """``reorg_cpu(forward=1)``: the inverse of :func:`space_to_channels` (``channels`` as there)."""
    n = x.shape[0]
    small = x.reshape(n, s, s, channels, height, width)
    return small.permute(0, 3, 4, 1, 5, 2).reshape(n, channels, height * s, width * s)


# ----------------------------------------------------------------------------- [reorg]


def parse_reorg(s: SectionReader, common: dict[str, Any]) -> Reorg:
    s.refuse({"flatten": "0"})
    return Reorg(**common, stride=s.integer("stride", 1, 1), reverse=s.flag("reverse"),
                 extra=s.integer("extra", 0, 0))


def reorg_shape(cfg: DarknetCfg, layer: Reorg, x: Shape, outputs: list[Shape]) -> Shape:
    s = layer.stride
    if layer.extra:
        return Shape(x.size + layer.extra, 1, 1)
    if layer.reverse:
        if x.channels % (s * s):
            raise cfg.error(layer, "stride", f"{s} x {s} does not divide the {x.channels} channels")
        return Shape(x.channels // (s * s), x.height * s, x.width * s)
    if x.channels % (s * s) or x.height % s or x.width % s:
        raise cfg.error(layer, "stride", f"Darknet's reorg reads the {x} input as {s * s} times fewer channels "
                                         f"at {s} times the size: {s} x {s} must divide its channels, height and "
                                         "width")
    return Shape(x.channels * s * s, x.height // s, x.width // s)


class DarknetReorg(nn.Module):
    def __init__(self, spec: Reorg, x: Shape) -> None:
        super().__init__()
        self.stride, self.reverse, self.extra, self.x = spec.stride, spec.reverse, spec.extra, x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, (c, h, w) = self.stride, (self.x.channels, self.x.height, self.x.width)
        if self.extra:
            flat = torch.cat([x.flatten(1), x.new_zeros(x.shape[0], self.extra)], dim=1)
            return flat[:, :, None, None]
        if self.reverse:
            return channels_to_space(x, c // (s * s), h, w, s)
        # reorg_cpu(input, w, h, c): the buffer is c / s^2 x h*s x w*s; out c x h x w, viewed c*s^2 x h/s x w/s
        return space_to_channels(x, c // (s * s), h, w, s).reshape(x.shape[0], c * s * s, h // s, w // s)

    def extra_repr(self) -> str:
        return f"stride={self.stride}" + (", reverse" if self.reverse else "") + (
            f", extra={self.extra}" if self.extra else "")


def build_reorg(spec: Reorg, x: Shape, outputs: list[Shape]) -> DarknetReorg:
    return DarknetReorg(spec, x)


def reorg_row(spec: Reorg, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("reorg", "", f"/{spec.stride:2d}")


# ----------------------------------------------------------------------------- [reorg3d]


def parse_reorg3d(s: SectionReader, common: dict[str, Any]) -> Reorg3d:
    s.refuse({"reverse": "0"})
    return Reorg3d(**common, stride=s.integer("stride", 1, 1))


def reorg3d_shape(cfg: DarknetCfg, layer: Reorg3d, x: Shape, outputs: list[Shape]) -> Shape:
    s = layer.stride
    if x.height % s or x.width % s:
        raise cfg.error(layer, "stride", f"{s} does not divide the height and width of {x}")
    return Shape(x.channels * s * s, x.height // s, x.width // s)


class DarknetReorg3d(nn.Module):
    def __init__(self, spec: Reorg3d, x: Shape) -> None:
        super().__init__()
        self.stride, self.x = spec.stride, x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stride
        return space_to_channels(x, self.x.channels, self.x.height // s, self.x.width // s, s)

    def extra_repr(self) -> str:
        return f"stride={self.stride}"


def build_reorg3d(spec: Reorg3d, x: Shape, outputs: list[Shape]) -> DarknetReorg3d:
    return DarknetReorg3d(spec, x)


def reorg3d_row(spec: Reorg3d, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("reorg3d", "", f"/{spec.stride:2d}")


register_kind(LayerKind("reorg", ("reorg",), parse_reorg, reorg_shape, build_reorg, reorg_row))
register_kind(LayerKind("reorg3d", ("reorg3d",), parse_reorg3d, reorg3d_shape, build_reorg3d, reorg3d_row))
