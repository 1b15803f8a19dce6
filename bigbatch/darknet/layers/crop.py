"""``[crop]`` (crop_layer.c): a ``crop_width x crop_height`` window of its input, times 2 minus 1 (``noadjust=1``:
as is), Darknet's in-network augmentation.

In evaluation the window is centred (``(in - out) // 2`` per axis, rounding down). In training, as
forward_crop_layer: one offset drawn uniformly in ``[0, in - out]`` per axis and, with ``flip``, a horizontal flip
with probability 1/2, the same for the whole batch; the flipped window reads columns ``in_w - dw - 1 - j``.
``angle``, ``saturation``, ``exposure`` and ``shift`` are read (Darknet's CPU forward does not apply them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Crop(LayerSpec):
    kind = "crop"
    crop_width: int = 1
    crop_height: int = 1
    flip: bool = False
    noadjust: bool = False
    angle: float = 0.0
    saturation: float = 1.0
    exposure: float = 1.0
    shift: float = 0.0


def parse(s: SectionReader, common: dict[str, Any]) -> Crop:
    return Crop(**common, crop_width=s.integer("crop_width", 1, 1), crop_height=s.integer("crop_height", 1, 1),
                flip=s.flag("flip"), noadjust=s.flag("noadjust"), angle=s.number("angle", 0.0),
                saturation=s.number("saturation", 1.0), exposure=s.number("exposure", 1.0),
                shift=s.number("shift", 0.0))


def shape(cfg: DarknetCfg, layer: Crop, x: Shape, outputs: list[Shape]) -> Shape:
    if layer.crop_height > x.height or layer.crop_width > x.width:
        raise cfg.error(layer, "crop_width", f"a {layer.crop_width} x {layer.crop_height} crop of a {x.width} x "
                                             f"{x.height} input")
    return Shape(x.channels, layer.crop_height, layer.crop_width)


class DarknetCrop(nn.Module):
    def __init__(self, spec: Crop) -> None:
        super().__init__()
        self.width, self.height, self.flip = spec.crop_width, spec.crop_height, spec.flip
        self.scale, self.shift_by = (1.0, 0.0) if spec.noadjust else (2.0, -1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if self.training:
            dh = int(torch.randint(h - self.height + 1, ()))
            dw = int(torch.randint(w - self.width + 1, ()))
            flip = self.flip and bool(torch.randint(2, ()))
        else:
            dh, dw, flip = (h - self.height) // 2, (w - self.width) // 2, False
        if flip:  # columns w - dw - 1 - j, j = 0 .. width - 1
            window = x[..., dh:dh + self.height, w - dw - self.width:w - dw].flip(-1)
        else:
            window = x[..., dh:dh + self.height, dw:dw + self.width]
        return window * self.scale + self.shift_by

    def extra_repr(self) -> str:
        return f"{self.width} x {self.height}, flip={self.flip}"


def build(spec: Crop, x: Shape, outputs: list[Shape]) -> DarknetCrop:
    return DarknetCrop(spec)


def row(spec: Crop, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("crop", "", "", "flip" if spec.flip else "")


register_kind(LayerKind("crop", ("crop",), parse, shape, build, row))
