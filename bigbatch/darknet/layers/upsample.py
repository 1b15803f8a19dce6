"""``[upsample]``: nearest neighbour, ``stride`` times in each axis, times ``scale`` (upsample_layer.c):
``out[y, x] = scale * in[y // stride, x // stride]``, ``out = in * stride`` per axis. (A negative stride,
Darknet's downsampling, is refused.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Upsample(LayerSpec):
    kind = "upsample"
    stride: int = 2
    scale: float = 1.0


def parse(s: SectionReader, common: dict[str, Any]) -> Upsample:
    stride = s.integer("stride", 2)
    if stride < 1:
        raise s.error("stride", f"expected an integer >= 1 (a negative stride, Darknet's downsampling, is not "
                                f"supported), not {s.options['stride']!r}")
    return Upsample(**common, stride=stride, scale=s.number("scale", 1.0))


def shape(cfg: DarknetCfg, layer: Upsample, x: Shape, outputs: list[Shape]) -> Shape:
    return Shape(x.channels, x.height * layer.stride, x.width * layer.stride)


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


def build(spec: Upsample, x: Shape, outputs: list[Shape]) -> DarknetUpsample:
    return DarknetUpsample(spec)


def row(spec: Upsample, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("upsample", "", f"{spec.stride}x")


register_kind(LayerKind("upsample", ("upsample",), parse, shape, build, row))
