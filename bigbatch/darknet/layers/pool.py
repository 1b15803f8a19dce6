"""``[maxpool]`` (alias ``[max]``): the max over ``size x size`` windows, and AlexeyAB's ``[local_avgpool]`` (alias
``[local_avg]``): the mean over each window of its cells inside the input (maxpool_layer.c).

``padding`` (default ``size - 1``) cells of padding in all, ``padding // 2`` left and top, the rest right and
bottom; out-of-bounds cells never win a max (Darknet reads them as ``-FLT_MAX``) and are not counted in a mean.
``size`` defaults to ``stride``,
``stride_x``/``stride_y`` to ``stride``. Output size per axis: ``out = (in + padding - size) // stride + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bigbatch.darknet.layers.conv import window_out
from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind, strides


@dataclass(frozen=True, kw_only=True)
class MaxPool(LayerSpec):
    """``[maxpool]``: window ``size``, strides, and ``padding`` in all (split as above)."""

    kind = "maxpool"
    size: int = 1
    stride_x: int = 1
    stride_y: int = 1
    padding: int = 0


REFUSED = {"maxpool_depth": "0", "antialiasing": "0", "maxpool_zero_nonmax": "0"}


def window(s: SectionReader) -> dict[str, int]:
    """size, stride_x, stride_y and padding, with parse_maxpool's defaults (shared by parse_local_avgpool)."""
    stride = s.integer("stride", 1, 1)
    size = s.integer("size", stride, 1)
    return {"size": size, "stride_x": s.integer("stride_x", stride, 1), "stride_y": s.integer("stride_y", stride, 1),
            "padding": s.integer("padding", size - 1, 0)}


def parse(s: SectionReader, common: dict[str, Any]) -> MaxPool:
    s.refuse(REFUSED)
    return MaxPool(**common, **window(s))


def shape(cfg: DarknetCfg, layer: MaxPool, x: Shape, outputs: list[Shape]) -> Shape:
    return Shape(x.channels,
                 window_out(cfg, layer, x.height + layer.padding, layer.size, layer.stride_y, "height"),
                 window_out(cfg, layer, x.width + layer.padding, layer.size, layer.stride_x, "width"))


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


def build(spec: MaxPool, x: Shape, outputs: list[Shape]) -> DarknetMaxPool:
    return DarknetMaxPool(spec)


def row(spec: MaxPool, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("max", "", f"{spec.size} x{spec.size:2d}/{strides(spec.stride_x, spec.stride_y):>2}")


@dataclass(frozen=True, kw_only=True)
class LocalAvgPool(MaxPool):
    kind = "local_avgpool"


def parse_local_avgpool(s: SectionReader, common: dict[str, Any]) -> LocalAvgPool:
    return LocalAvgPool(**common, **window(s))


def window_padding(size: int, stride: tuple[int, int], p: int, h: int, w: int) -> tuple[int, int, int, int]:
    """(left, right, top, bottom) cells of padding: ``p // 2`` left and top, right and bottom as many as the
    last window of ``out = (in + p - size) // stride + 1`` needs."""
    sy, sx = stride
    out_h, out_w = (h + p - size) // sy + 1, (w + p - size) // sx + 1
    first = p // 2
    return (first, max(0, (out_w - 1) * sx + size - w - first), first, max(0, (out_h - 1) * sy + size - h - first))


class DarknetLocalAvgPool(DarknetMaxPool):
    """``[local_avgpool]``: the sum over the window's cells inside the input, divided by their number."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = window_padding(self.size, self.stride, self.padding, *x.shape[-2:])
        ones = torch.ones_like(x[:1, :1])
        total = F.avg_pool2d(F.pad(x, pads), self.size, self.stride, divisor_override=1)
        count = F.avg_pool2d(F.pad(ones, pads), self.size, self.stride, divisor_override=1)
        return total / count


def build_local_avgpool(spec: LocalAvgPool, x: Shape, outputs: list[Shape]) -> DarknetLocalAvgPool:
    return DarknetLocalAvgPool(spec)


def local_avgpool_row(spec: LocalAvgPool, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("avg", "", f"{spec.size} x{spec.size:2d}/{strides(spec.stride_x, spec.stride_y):>2}")


register_kind(LayerKind("local_avgpool", ("local_avgpool", "local_avg"), parse_local_avgpool, shape,
                        build_local_avgpool, local_avgpool_row))
register_kind(LayerKind("maxpool", ("maxpool", "max"), parse, shape, build, row,
                        ignored=frozenset({"out_channels"}), refused=REFUSED))
