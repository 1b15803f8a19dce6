"""The layers that read earlier layers: ``[route]`` (route_layer.c) and ``[shortcut]`` (shortcut_layer.c).

- ``[route]``: the outputs of ``layers`` concatenated along channels; with ``groups``, only the ``group_id``-th of
  ``groups`` equal channel chunks of each. The sources share one height and width;
  ``channels = sum(c_i) / groups``.
- ``[shortcut]``: ``activation(alpha * previous + beta * sum(outputs of from))`` (``alpha``, ``beta`` are
  pjreddie's, default 1); the output has the previous layer's shape. A source of other channels (same height and
  width) adds to the first ``min(c_source, c)`` channels (AlexeyAB's shortcut_multilayer_cpu adds the flat prefix,
  pjreddie's shortcut_cpu the common channels: the same at one height and width). A source ``s`` times larger is
  read every ``s`` cells, one ``s`` times smaller added every ``s`` cells (pjreddie's shortcut_cpu: its ResNets;
  AlexeyAB's Darknet crashes on those cfgs).

A relative (negative) index ``i`` in ``layers``/``from`` means layer ``index + i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bigbatch.darknet.activations import activation
from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Shortcut(LayerSpec):
    """``[shortcut]``: ``sources`` are absolute indices."""

    kind = "shortcut"
    activation: str = "linear"
    alpha: float = 1.0
    beta: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Route(LayerSpec):
    """``[route]``: ``sources`` are absolute indices."""

    kind = "route"
    groups: int = 1
    group_id: int = 0


def check_sources(cfg: DarknetCfg, layer: LayerSpec, key: str) -> None:
    """A layer may not read a head's output: Darknet's is decoded, bigbatch's network returns a head's input."""
    from bigbatch.darknet.spec import KINDS

    for source in layer.sources:
        if KINDS[cfg.layers[source].kind].head:
            raise cfg.error(layer, key, f"layer {source} is a [{cfg.layers[source].section}], whose output Darknet "
                                        "decodes; bigbatch's network returns its input raw (use the layer before it)")


# ----------------------------------------------------------------------------- [shortcut]

SHORTCUT_REFUSED = {"weights_type": "none", "weights_normalization": "none"}


def parse_shortcut(s: SectionReader, common: dict[str, Any]) -> Shortcut:
    s.refuse(SHORTCUT_REFUSED)
    return Shortcut(**common, sources=s.layer_indices("from"), activation=s.activation("linear"),
                    alpha=s.number("alpha", 1.0), beta=s.number("beta", 1.0))


def shortcut_shape(cfg: DarknetCfg, layer: Shortcut, x: Shape, outputs: list[Shape]) -> Shape:
    check_sources(cfg, layer, "from")
    for source in layer.sources:
        shape = outputs[source]
        if sampling(shape, x) is None:
            raise cfg.error(layer, "from", f"layer {source} is {shape}, the previous layer {x}: Darknet adds a source "
                                           "of an integer multiple or fraction of the size, the same in both axes")
    return x


def sampling(source: Shape, x: Shape) -> tuple[int, int] | None:
    """pjreddie's shortcut_cpu: (stride, sample), the source read every ``stride`` cells and added every ``sample``
    cells of the output; None when the sizes are not so related."""
    if (source.height, source.width) == (x.height, x.width):
        return 1, 1
    if source.width >= x.width and source.width % x.width == 0 and source.height == x.height * (
            source.width // x.width):
        return source.width // x.width, 1
    if x.width % source.width == 0 and x.height == source.height * (x.width // source.width):
        return 1, x.width // source.width
    return None


def fitted(source: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``source`` as shortcut_cpu adds it to ``like``: the common channels, read every ``stride`` cells or written
    every ``sample`` cells (zero elsewhere)."""
    (n, c, h, w), (sc, sh, sw) = like.shape, source.shape[1:]
    common = min(c, sc)
    if (sh, sw) == (h, w):
        if sc == c:
            return source
        return source[:, :c] if sc > c else F.pad(source, (0, 0, 0, 0, 0, c - sc))
    if sw > w:
        stride = sw // w
        return F.pad(source[:, :common, ::stride, ::stride], (0, 0, 0, 0, 0, c - common))
    sample = w // sw
    out = like.new_zeros(n, c, h, w)
    out[:, :common, ::sample, ::sample] = source[:, :common]
    return out


class DarknetShortcut(nn.Module):
    """``[shortcut]``: ``activation(alpha * previous + beta * sum(sources))``."""

    def __init__(self, spec: Shortcut) -> None:
        super().__init__()
        self.sources, self.alpha, self.beta = spec.sources, spec.alpha, spec.beta
        self.act = activation(spec.activation)

    def forward(self, x: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
        common = [fitted(source, x) for source in sources]
        added = common[0]
        for other in common[1:]:
            added = added + other
        if self.alpha != 1:
            x = self.alpha * x
        if self.beta != 1:
            added = self.beta * added
        return self.act(x + added)

    def extra_repr(self) -> str:
        return f"from={list(self.sources)}"


def build_shortcut(spec: Shortcut, x: Shape, outputs: list[Shape]) -> DarknetShortcut:
    return DarknetShortcut(spec)


def shortcut_row(spec: Shortcut, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("shortcut", " ".join(str(i) for i in spec.sources))


# ----------------------------------------------------------------------------- [route]


def parse_route(s: SectionReader, common: dict[str, Any]) -> Route:
    sources = s.layer_indices("layers")
    groups = s.integer("groups", 1, 1)
    return Route(**common, sources=sources, groups=groups, group_id=s.integer("group_id", 0, 0, groups - 1))


def route_shape(cfg: DarknetCfg, layer: Route, x: Shape, outputs: list[Shape]) -> Shape:
    check_sources(cfg, layer, "layers")
    sources = [outputs[i] for i in layer.sources]
    first = sources[0]
    for source, shape in zip(layer.sources, sources, strict=True):
        if (shape.height, shape.width) != (first.height, first.width):
            raise cfg.error(layer, "layers", f"layer {source} is {shape}, layer {layer.sources[0]} {first}: "
                                             "the sources of a route must have one height and width")
        if shape.channels % layer.groups:
            raise cfg.error(layer, "groups", f"{layer.groups} does not divide the {shape.channels} channels of "
                                             f"layer {source}")
    return Shape(sum(s.channels for s in sources) // layer.groups, first.height, first.width)


class DarknetRoute(nn.Module):
    """``[route]``: the ``group_id``-th of ``groups`` channel chunks of each source, concatenated."""

    def __init__(self, spec: Route) -> None:
        super().__init__()
        self.sources, self.groups, self.group_id = spec.sources, spec.groups, spec.group_id

    def forward(self, x: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
        if self.groups > 1:
            sources = [s.chunk(self.groups, dim=1)[self.group_id] for s in sources]
        return sources[0] if len(sources) == 1 else torch.cat(sources, dim=1)

    def extra_repr(self) -> str:
        groups = f", groups={self.groups}, group_id={self.group_id}" if self.groups > 1 else ""
        return f"layers={list(self.sources)}{groups}"


def build_route(spec: Route, x: Shape, outputs: list[Shape]) -> DarknetRoute:
    return DarknetRoute(spec)


def route_row(spec: Route, x: Shape, out: Shape, net: Shape) -> TableRow:
    note = f"group {spec.group_id}/{spec.groups}" if spec.groups > 1 else ""
    return TableRow("route", " ".join(str(i) for i in spec.sources), "", note)


register_kind(LayerKind("shortcut", ("shortcut",), parse_shortcut, shortcut_shape, build_shortcut, shortcut_row,
                        refused=SHORTCUT_REFUSED))
register_kind(LayerKind("route", ("route",), parse_route, route_shape, build_route, route_row,
                        reads_sources_only=True))
