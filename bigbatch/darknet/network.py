"""A Darknet network as a torch module, built from the specs of a ``.cfg`` (``cfg.py``).

One torch module per Darknet layer, in ``DarknetNetwork.layers`` (so names read ``layers.0.conv``, ``layers.0.bn``),
each computing what Darknet's ``forward_*_layer`` computes; each kind's module is in ``layers/`` (its docstring has
the formula). A module is called ``module(x)``, or ``module(x, sources)`` for a kind that reads earlier layers.

``forward`` returns the network's outputs: the input of each head layer (``[yolo]`` and the other kinds marked
``head``), in cfg order: the raw tensor the head receives; the logistic, the decoding and the loss belong to the
loss and the decoder, which read the anchors, masks, classes and strides from ``DarknetNetwork.yolo_heads``. A
network without a head returns its last layer's output. ``forward_layers`` returns every layer's output, as
Darknet's ``l.output`` after ``network_predict``.

``layer_table`` prints the layers as Darknet does at load time, with the parameter count (weights and biases, BN
scales and shifts; BN running statistics are buffers, not parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from bigbatch.darknet.cfg import DarknetCfg, Yolo, for_dialect, read_darknet_cfg, with_classes
from bigbatch.darknet.layers.conv import BN_EPS, BN_MOMENTUM, ConvBlock
from bigbatch.darknet.shapes import Shape, layer_shapes
from bigbatch.darknet.spec import KINDS
from bigbatch.errors import UserError

__all__ = ["BN_EPS", "BN_MOMENTUM", "ConvBlock", "DarknetNetwork", "YoloHead", "layer_table", "load_network",
           "parameter_count"]


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

    ``forward(x)`` returns the list of the raw inputs of the head layers, in cfg order (another input size works
    where its route and shortcut sources keep equal sizes)."""

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
        outputs: list[Shape] = []  # the layers' outputs before the one built, grown by one a layer (linear)
        self.layers = nn.ModuleList()
        for spec, (x, out) in zip(cfg.layers, self.shapes, strict=True):
            self.layers.append(KINDS[spec.kind].build(spec, x, outputs))
            outputs.append(out)
        for layer in self.layers:
            if hasattr(layer, "link"):  # layers that use another's parameters (share_index)
                layer.link(self.layers)
        self.yolo_heads = [
            YoloHead(spec.index, n, spec.masked_anchors, spec.mask, spec.classes,
                     (self.shapes[spec.index][1].height, self.shapes[spec.index][1].width),
                     (height / self.shapes[spec.index][1].height, width / self.shapes[spec.index][1].width), spec)
            for n, spec in enumerate(cfg.yolo_layers)]
        self._kept = frozenset(i for spec in cfg.layers for i in spec.sources)
        self._sources = tuple(spec.sources for spec in cfg.layers)
        self._heads = frozenset(spec.index for spec in cfg.layers if KINDS[spec.kind].head)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        heads: list[torch.Tensor] = []
        last = self._run(x, heads)
        return heads if self._heads else [last]

    def forward_layers(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's output, in order (Darknet's ``l.output`` of each layer)."""
        every: list[torch.Tensor] = []
        self._run(x, [], every)
        return every

    def _run(self, x: torch.Tensor, heads: list[torch.Tensor], every: list[torch.Tensor] | None = None
             ) -> torch.Tensor:
        kept: dict[int, torch.Tensor] = {}  # the outputs a later layer reads
        for i, (layer, sources) in enumerate(zip(self.layers, self._sources, strict=True)):
            if i in self._heads:
                heads.append(x)
                if every is None:  # a head's own output (Darknet's activated one) is read by no later layer
                    continue
            x = layer(x, [kept[j] for j in sources]) if sources else layer(x)
            if i in self._kept:
                kept[i] = x
            if every is not None:
                every.append(x)
        return x


def load_network(path: str | Path, width: int | None = None, height: int | None = None,
                 classes: int | None = None, dialect: str = "alexeyab") -> DarknetNetwork:
    """The network of the ``.cfg`` at ``path`` for a ``width x height`` input (default: its ``[net]``), for
    ``classes`` classes (default: the cfg's; see ``cfg.with_classes``), read as the Darknet of ``dialect`` reads
    it (``cfg.for_dialect``)."""
    cfg = for_dialect(read_darknet_cfg(path), dialect)
    if classes is not None:
        cfg = with_classes(cfg, classes)
    return DarknetNetwork(cfg, width, height)


def parameter_count(network: nn.Module) -> int:
    """The trainable values: convolution weights and biases, BN scales and shifts (not BN running statistics)."""
    return sum(p.numel() for p in network.parameters())


def layer_table(network: DarknetNetwork) -> str:
    """The layers as Darknet prints them at load time (index, type, filters, size/stride, input -> output), then
    the totals: billions of floating-point operations, and the parameter count."""
    lines = [f"{'layer':>5}  {'type':<9} {'filters':>8}  {'size/strd(dil)':<14} {'input':>19}    output"]
    total_bflops = 0.0
    for spec, (x, out) in zip(network.cfg.layers, network.shapes, strict=True):
        row = KINDS[spec.kind].row(spec, x, out, network.input_shape)
        total_bflops += row.bflops
        shown_in = "" if KINDS[spec.kind].reads_sources_only else str(x)
        lines.append(f"{spec.index:5d}  {row.name:<9} {row.filters:>8}  {row.size:<14} {shown_in:>19} -> {out}  "
                     f"{row.note}".rstrip())
    lines.append(f"total {total_bflops:.3f} BFLOPs at {network.input_shape.width} x {network.input_shape.height}; "
                 f"{len(network.cfg.layers)} layers; {parameter_count(network):,} parameters")
    return "\n".join(lines)
