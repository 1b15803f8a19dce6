"""``[maxpool]`` (alias ``[max]``): the max over ``size x size`` windows (maxpool_layer.c).

``padding`` (default ``size - 1``) cells of padding in all, ``padding // 2`` left and top, the rest right and
bottom; out-of-bounds cells never win (Darknet reads them as ``-FLT_MAX``). ``size`` defaults to ``stride``,
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


def parse(s: SectionReader, common: dict[str, Any]) -> MaxPool:
    s.refuse(REFUSED)
    stride = s.integer("stride", 1, 1)
    size = s.integer("size", stride, 1)
    return MaxPool(**common, size=size, stride_x=s.integer("stride_x", stride, 1),
                   stride_y=s.integer("stride_y", stride, 1), padding=s.integer("padding", size - 1, 0))


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


register_kind(LayerKind("maxpool", ("maxpool", "max"), parse, shape, build, row,
                        ignored=frozenset({"out_channels"}), refused=REFUSED))
