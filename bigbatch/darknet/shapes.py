"""The shape (channels, height, width) of every layer's input and output, for an input size, as Darknet computes them.

Formulas, per axis, from Darknet's ``make_*_layer`` (AlexeyAB/darknet src/convolutional_layer.c, maxpool_layer.c,
upsample_layer.c, route_layer.c, shortcut_layer.c, yolo_layer.c):

    convolutional   out = (in + 2 * padding - size) // stride + 1,  channels = filters
    maxpool         out = (in + padding - size) // stride + 1
    upsample        out = in * stride
    route           out = (h, w) of its sources, channels = sum(c_i) / groups
    shortcut, yolo, dropout: out = in

A shape Darknet would reject, or compute something bigbatch does not, is a :class:`UserError` naming the cfg's file
and line: a window larger than its (padded) input, ``groups`` not dividing the channels, sources of different
sizes, a ``[yolo]`` whose input is not ``len(mask) * (classes + 5)`` channels, a layer that reads a ``[yolo]``'s
output (Darknet's is decoded; here the network returns the raw one).

A dilated convolution runs in Darknet with ``padding * dilation`` cells of padding and a kernel spanning
``(size - 1) * dilation + 1`` cells, while its output size is the formula above: the two agree only when
``2 * padding == size - 1``, which bigbatch requires of a dilated convolution.
"""

from __future__ import annotations

from dataclasses import dataclass

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
)


@dataclass(frozen=True)
class Shape:
    """A feature map's channels, height and width (Darknet prints it as ``w x h x c``)."""

    channels: int
    height: int
    width: int

    def __str__(self) -> str:
        return f"{self.width:4d} x{self.height:4d} x{self.channels:5d}"


def _window_out(cfg: DarknetCfg, layer: LayerSpec, size_in: int, span: int, stride: int, axis: str) -> int:
    """``(size_in - span) // stride + 1`` where the window fits (``size_in`` already padded)."""
    if size_in < span:
        raise cfg.error(layer, "size", f"the window ({span}) is larger than the {axis} of its padded input "
                                       f"({size_in}); the input is too small for this network")
    return (size_in - span) // stride + 1


def layer_shapes(cfg: DarknetCfg, channels: int, height: int, width: int) -> list[tuple[Shape, Shape]]:
    """(input, output) of each layer of ``cfg`` for a ``channels x height x width`` input."""
    shapes: list[tuple[Shape, Shape]] = []
    previous = Shape(channels, height, width)
    for layer in cfg.layers:
        if layer.index and isinstance(cfg.layers[layer.index - 1], Yolo) and not isinstance(layer, Route):
            raise cfg.error(layer, None, "reads the output of the [yolo] before it, which Darknet decodes; bigbatch's "
                                         "network returns a [yolo]'s input raw (put a [route] in between)")
        out = _output(cfg, layer, previous, [out for _, out in shapes])
        shapes.append((previous, out))
        previous = out
    return shapes


def _output(cfg: DarknetCfg, layer: LayerSpec, x: Shape, outputs: list[Shape]) -> Shape:
    if isinstance(layer, Convolutional):
        if x.channels % layer.groups or layer.filters % layer.groups:
            raise cfg.error(layer, "groups", f"{layer.groups} does not divide both the input channels "
                                             f"({x.channels}) and filters ({layer.filters})")
        if layer.dilation > 1 and 2 * layer.padding != layer.size - 1:
            raise cfg.error(layer, "dilation", f"a dilated convolution needs padding = (size - 1) / 2 (here size "
                                               f"{layer.size}, padding {layer.padding}): Darknet's output size and "
                                               "its im2col disagree otherwise")
        return Shape(layer.filters,
                     _window_out(cfg, layer, x.height + 2 * layer.padding, layer.size, layer.stride_y, "height"),
                     _window_out(cfg, layer, x.width + 2 * layer.padding, layer.size, layer.stride_x, "width"))
    if isinstance(layer, MaxPool):
        return Shape(x.channels,
                     _window_out(cfg, layer, x.height + layer.padding, layer.size, layer.stride_y, "height"),
                     _window_out(cfg, layer, x.width + layer.padding, layer.size, layer.stride_x, "width"))
    if isinstance(layer, Upsample):
        return Shape(x.channels, x.height * layer.stride, x.width * layer.stride)
    if isinstance(layer, (Route, Shortcut)):
        key = "layers" if isinstance(layer, Route) else "from"
        for source in layer.sources:
            if isinstance(cfg.layers[source], Yolo):
                raise cfg.error(layer, key, f"layer {source} is a [yolo], whose output Darknet decodes; bigbatch's "
                                            "network returns a [yolo]'s input raw (use the layer before it)")
        sources = [outputs[i] for i in layer.sources]
        if isinstance(layer, Shortcut):
            for source, shape in zip(layer.sources, sources, strict=True):
                if shape != x:
                    raise cfg.error(layer, "from", f"layer {source} is {shape}, the previous layer {x}: bigbatch "
                                                   "adds only outputs of the same shape")
            return x
        first = sources[0]
        for source, shape in zip(layer.sources, sources, strict=True):
            if (shape.height, shape.width) != (first.height, first.width):
                raise cfg.error(layer, "layers", f"layer {source} is {shape}, layer {layer.sources[0]} {first}: "
                                                 "the sources of a route must have one height and width")
            if shape.channels % layer.groups:
                raise cfg.error(layer, "groups", f"{layer.groups} does not divide the {shape.channels} channels of "
                                                 f"layer {source}")
        return Shape(sum(s.channels for s in sources) // layer.groups, first.height, first.width)
    if isinstance(layer, Yolo):
        if x.channels != layer.filters:
            raise cfg.error(layer, None, f"its input has {x.channels} channels; len(mask) * (classes + 5) = "
                                         f"{len(layer.mask)} * ({layer.classes} + 5) = {layer.filters} expected "
                                         "(the filters of the convolution before)")
        return x
    if isinstance(layer, Dropout):
        return x
    raise TypeError(f"no shape rule for {type(layer).__name__}")
