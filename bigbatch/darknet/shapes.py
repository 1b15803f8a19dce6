"""The shape (channels, height, width) of every layer's input and output, for an input size, as Darknet computes them.

Each kind's rule is its module's ``shape`` (``layers/``, from Darknet's ``make_*_layer``). A shape Darknet would
reject, or compute something bigbatch does not, is a :class:`UserError` naming the cfg's file and line: a window
larger than its (padded) input, ``groups`` not dividing the channels, sources of different sizes, a ``[yolo]`` whose
input is not ``len(mask) * (classes + 5)`` channels, a layer that reads a head's output (Darknet's is decoded; here
the network returns the raw one).
"""

from __future__ import annotations

from bigbatch.darknet.spec import KINDS, DarknetCfg, Shape

__all__ = ["Shape", "layer_shapes"]


def layer_shapes(cfg: DarknetCfg, channels: int, height: int, width: int) -> list[tuple[Shape, Shape]]:
    """(input, output) of each layer of ``cfg`` for a ``channels x height x width`` input."""
    shapes: list[tuple[Shape, Shape]] = []
    outputs: list[Shape] = []  # the outputs so far, grown by one a layer (never rebuilt: linear in the layers)
    previous = Shape(channels, height, width)
    for layer in cfg.layers:
        before = cfg.layers[layer.index - 1] if layer.index else None
        if before is not None and KINDS[before.kind].head and not (KINDS[layer.kind].reads_sources_only
                                                                   or KINDS[layer.kind].may_follow_head):
            raise cfg.error(layer, None, f"reads the output of the [{before.section}] before it, which Darknet "
                                         "decodes; bigbatch's network returns a head's input raw (put a [route] in "
                                         "between)")
        out = KINDS[layer.kind].shape(cfg, layer, previous, outputs)
        shapes.append((previous, out))
        outputs.append(out)
        previous = out
    return shapes
