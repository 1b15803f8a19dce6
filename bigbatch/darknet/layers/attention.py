"""AlexeyAB's attention layers, which multiply the previous layer's output into an earlier one's (``from``):
``[scale_channels]`` (scale_channels_layer.c) and ``[sam]`` (sam_layer.c).

- ``[scale_channels]``: ``out[c, y, x] = act(prev[c] * from[c, y, x])`` where the previous output is ``c x 1 x 1``
  (squeeze-and-excitation); with ``scale_wh``, ``out[c, y, x] = act(prev[0, y, x] * from[c, y, x])``. The output
  has the shape of ``from``.
- ``[sam]``: ``out = act(prev * from)``, element by element (spatial attention); the shape of ``from``.

``activation`` defaults to linear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.activations import activation
from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class ScaleChannels(LayerSpec):
    kind = "scale_channels"
    scale_wh: bool = False
    activation: str = "linear"


@dataclass(frozen=True, kw_only=True)
class Sam(LayerSpec):
    kind = "sam"
    activation: str = "linear"


def parse_scale_channels(s: SectionReader, common: dict[str, Any]) -> ScaleChannels:
    sources = s.layer_indices("from")
    if len(sources) != 1:
        raise s.error("from", "expected one layer")
    return ScaleChannels(**common, sources=sources, scale_wh=s.flag("scale_wh"), activation=s.activation("linear"))


def parse_sam(s: SectionReader, common: dict[str, Any]) -> Sam:
    sources = s.layer_indices("from")
    if len(sources) != 1:
        raise s.error("from", "expected one layer")
    return Sam(**common, sources=sources, activation=s.activation("linear"))


def scale_channels_shape(cfg: DarknetCfg, layer: ScaleChannels, x: Shape, outputs: list[Shape]) -> Shape:
    source = outputs[layer.sources[0]]
    if layer.scale_wh:
        ok = x.channels == 1 and (x.height, x.width) == (source.height, source.width)
        want = f"1 x {source.height} x {source.width} (channels x height x width)"
    else:
        ok = x.channels == source.channels and x.height == x.width == 1
        want = f"{source.channels} x 1 x 1"
    if not ok:
        raise cfg.error(layer, "from", f"the previous layer is {x}; scaling layer {layer.sources[0]} ({source}) "
                                       f"needs {want}")
    return source


def sam_shape(cfg: DarknetCfg, layer: Sam, x: Shape, outputs: list[Shape]) -> Shape:
    source = outputs[layer.sources[0]]
    if source != x:
        raise cfg.error(layer, "from", f"layer {layer.sources[0]} is {source}, the previous layer {x}: [sam] "
                                       "multiplies outputs of one shape")
    return source


class Multiply(nn.Module):
    """``act(previous * from)``, the previous output broadcast over ``from``'s shape."""

    def __init__(self, spec: ScaleChannels | Sam) -> None:
        super().__init__()
        self.act = activation(spec.activation)

    def forward(self, x: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
        return self.act(x * sources[0])


def build(spec: ScaleChannels | Sam, x: Shape, outputs: list[Shape]) -> Multiply:
    return Multiply(spec)


def row(spec: LayerSpec, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("scale_cha" if spec.kind == "scale_channels" else "sam", str(spec.sources[0]))


register_kind(LayerKind("scale_channels", ("scale_channels",), parse_scale_channels, scale_channels_shape, build,
                        row))
register_kind(LayerKind("sam", ("sam",), parse_sam, sam_shape, build, row))
