"""What every Darknet layer has, and the table of layer kinds: one :class:`LayerKind` per kind, registered by its
module in ``layers/``.

A kind is everything bigbatch knows of one Darknet layer type, kept together in one module: the spec (a frozen
dataclass of the section's keys, with Darknet's defaults), the parser of its section, its shape rule, the torch
module that computes it, and its row of Darknet's layer table. ``cfg.py`` reads a file through
:data:`KINDS`; ``shapes.py`` and ``network.py`` dispatch on ``spec.kind``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bigbatch.errors import UserError

FREEZING_KEYS = ("stopbackward", "train_only_bn", "dont_update", "burnin_update")
"""The keys of every layer section that freeze parameters in training (:class:`LayerSpec`'s fields of those names,
read by ``cfg.py``; their meaning: ``darknet/freeze.py``)."""


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """What every layer spec has: its index in the network (from 0, ``[net]`` not counted), the section name as
    written, the line of its header and of each of its keys (for messages). ``sources``: the earlier layers it
    reads besides the previous one (absolute indices; empty for most kinds). The freezing keys AlexeyAB's
    ``parse_network_cfg`` reads for every layer (:data:`FREEZING_KEYS`; 0 where not given), which
    ``darknet/freeze.py`` turns into the parameters a run does not train."""

    kind: ClassVar[str] = ""
    index: int
    section: str
    line: int
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    sources: tuple[int, ...] = ()
    stopbackward: int = field(default=0, repr=False)
    train_only_bn: bool = field(default=False, repr=False)
    dont_update: int = field(default=0, repr=False)
    burnin_update: int = field(default=0, repr=False)

    def line_of(self, key: str | None) -> int:
        """The line of ``key`` in the cfg, else the line of the header."""
        return self.lines.get(key, self.line) if key else self.line


@dataclass(frozen=True)
class Shape:
    """A feature map's channels, height and width (Darknet prints it as ``w x h x c``)."""

    channels: int
    height: int
    width: int

    def __str__(self) -> str:
        return f"{self.width:4d} x{self.height:4d} x{self.channels:5d}"

    @property
    def size(self) -> int:
        """Darknet's ``outputs``: ``c * h * w``."""
        return self.channels * self.height * self.width


@dataclass(frozen=True)
class NetInput:
    """The network's input from ``[net]``: width, height (None where the cfg has none) and channels."""

    width: int | None
    height: int | None
    channels: int | None
    line: int
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    hue: float = 0.0
    """Darknet's colour augmentation (``parse_net_options``' defaults): a hue shift in [-hue, hue] turns,"""
    saturation: float = 1.0
    """saturation and exposure (HSV value) scaled by ``rand_scale``: in [1/s, s],"""
    exposure: float = 1.0
    flip: bool = True
    """and a horizontal flip of half the images (AlexeyAB's ``flip``, 1 by default)."""
    options: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Every ``[net]`` key as written (the first of a key given twice, as Darknet's ``option_find``)."""
    mosaic: bool = False
    """A detector's mosaic augmentation (AlexeyAB's ``mosaic=1``: half the samples made of four images),"""
    mosaic_bound: bool = False
    """its boxes clipped to their own quadrant (AlexeyAB's ``mosaic_bound=1``)."""


@dataclass(frozen=True)
class DarknetCfg:
    """A whole ``.cfg``: its path, the input, the layers in order, and the keys bigbatch knows but does not use
    (``"section:key"``), and the leniencies taken while reading it (one line each, for the caller to warn once)."""

    path: Path
    net: NetInput
    layers: tuple[LayerSpec, ...]
    ignored: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def error(self, layer: LayerSpec, key: str | None, what: str) -> UserError:
        """The one-line error ``"{path}:{line}: [section] key: what"`` about ``key`` of ``layer``."""
        name = f"[{layer.section}] {key}" if key else f"[{layer.section}]"
        return UserError(f"{self.path}:{layer.line_of(key)}: {name}: {what}")

    def of_kind(self, *kinds: str) -> tuple[LayerSpec, ...]:
        """The layers of the given kinds, in order."""
        return tuple(layer for layer in self.layers if layer.kind in kinds)

    @property
    def yolo_layers(self) -> tuple[Any, ...]:
        return self.of_kind("yolo")


@dataclass(frozen=True)
class TableRow:
    """A layer's row of Darknet's load-time table: its printed name, the filters column, the size column, the
    note after the output, and its billions of floating-point operations (counted in the total)."""

    name: str
    filters: str = ""
    size: str = ""
    note: str = ""
    bflops: float = 0.0


@dataclass(frozen=True)
class LayerKind:
    """One Darknet layer kind.

    - ``sections``: the section names Darknet's ``string_to_layer_type`` maps to it (``[conv]`` and
      ``[convolutional]``...);
    - ``parse(reader, common) -> spec``: read a section (``reading.SectionReader``), ``common`` being the
      :class:`LayerSpec` fields;
    - ``shape(cfg, spec, x, outputs) -> Shape``: the output for input ``x``, ``outputs`` the shapes of the layers
      before it (a shape Darknet would reject is ``cfg.error(...)``; ``outputs`` is one list the caller grows after
      each layer, so that a network costs work linear in its layers: read it, never keep it);
    - ``build(spec, x, outputs) -> nn.Module``: the torch module; it is called ``module(x)``, or
      ``module(x, [outputs of spec.sources])`` when the spec has sources;
    - ``row(spec, x, out, net) -> TableRow``, ``net`` the network's input shape;
    - ``ignored``: keys Darknet reads that change nothing bigbatch builds; ``refused``: keys bigbatch does not
      implement, with the value that leaves them off;
    - ``head``: its input is one of the network's outputs (``[yolo]``, ``[region]``, a final ``[softmax]``...);
    - ``reads_sources_only``: it ignores the previous layer's output (``[route]``), so it may follow a head;
    - ``may_follow_head``: it may read a head's output (``[cost]`` after ``[softmax]``).
    """

    kind: str
    sections: tuple[str, ...]
    parse: Callable[..., LayerSpec]
    shape: Callable[..., Shape]
    build: Callable[..., Any]
    row: Callable[..., TableRow]
    ignored: frozenset[str] = frozenset()
    refused: Mapping[str, str] = field(default_factory=dict)
    head: bool = False
    reads_sources_only: bool = False
    may_follow_head: bool = False


KINDS: dict[str, LayerKind] = {}
"""kind -> :class:`LayerKind`, filled by the modules of ``layers/`` as they are imported."""
SECTIONS: dict[str, str] = {}
"""Section name (as Darknet spells it) -> kind."""


def register_kind(kind: LayerKind) -> LayerKind:
    """Add ``kind`` to :data:`KINDS` and its section names to :data:`SECTIONS`."""
    if kind.kind in KINDS:
        raise ValueError(f"layer kind {kind.kind!r} registered twice")
    KINDS[kind.kind] = kind
    for section in kind.sections:
        SECTIONS[section] = kind.kind
    return kind


def strides(stride_x: int, stride_y: int) -> str:
    """A stride as Darknet's table prints it: ``2``, or ``2x1`` when the axes differ."""
    return f"{stride_x}" if stride_x == stride_y else f"{stride_x}x{stride_y}"
