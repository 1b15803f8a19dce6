"""A classifier's head: ``[avgpool]`` (avgpool_layer.c), ``[softmax]`` (softmax_layer.c), ``[cost]``
(cost_layer.c).

- ``[avgpool]`` (alias ``[avg]``): the mean of each channel over its ``h x w`` cells; out ``1 x 1 x c``.
- ``[softmax]`` (alias ``[soft]``): over the ``c * h * w`` inputs taken flat, in ``groups`` equal consecutive
  chunks, ``softmax(x / temperature)`` per chunk; with ``tree=FILE`` (a WordTree, ``read_tree`` in tree.c: one
  ``name parent`` line per class), per run of consecutive classes with the same parent (inputs past the tree's
  classes are 0, where Darknet leaves its output untouched). A head: the network returns its input, the logits.
- ``[cost]``: Darknet's loss layer. At inference it computes nothing the network returns (``get_network_output``
  skips it; its ``l.output`` is the per-element loss, zero without a truth): here the identity. It may follow the
  ``[softmax]`` head.

A tree file is found as Darknet users run it: relative to the current folder, else to the cfg's folder or its
parent (Darknet's repository keeps ``cfg/`` beside ``data/``), and never outside those three folders
(``reading.find_named_file``); only a regular file of at most :data:`MAX_TREE_BYTES` and :data:`MAX_TREE_CLASSES`
lines is read (``files.read_lines``), and a mistake in it is named by its line, never quoted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind
from bigbatch.data.pipeline.files import BadLine, read_lines

MAX_TREE_BYTES = 16 * 2**20
"""The largest WordTree file read (Darknet's 9k.tree is 0.2 MB)."""

MAX_TREE_CLASSES = 2**16
"""The most lines a WordTree file may have (one class a line): Darknet's 9k.tree has 9,418 classes, the full ImageNet
(ImageNet-21k) 21,841; each line becomes a softmax output of the network."""


@dataclass(frozen=True, kw_only=True)
class AvgPool(LayerSpec):
    kind = "avgpool"


@dataclass(frozen=True, kw_only=True)
class Softmax(LayerSpec):
    """``group_sizes``: the consecutive chunks, from ``groups`` (equal) or the tree's parent runs; empty: ``groups``
    equal chunks of the input."""

    kind = "softmax"
    groups: int = 1
    temperature: float = 1.0
    tree: str | None = None
    tree_groups: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Cost(LayerSpec):
    kind = "cost"
    type: str = "sse"
    scale: float = 1.0
    ratio: float = 0.0


# ----------------------------------------------------------------------------- [avgpool]


def parse_avgpool(s: SectionReader, common: dict[str, Any]) -> AvgPool:
    return AvgPool(**common)


def avgpool_shape(cfg: DarknetCfg, layer: AvgPool, x: Shape, outputs: list[Shape]) -> Shape:
    return Shape(x.channels, 1, 1)


class GlobalAvgPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


def build_avgpool(spec: AvgPool, x: Shape, outputs: list[Shape]) -> GlobalAvgPool:
    return GlobalAvgPool()


def avgpool_row(spec: AvgPool, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("avg")


# ----------------------------------------------------------------------------- [softmax]


def read_tree_groups(s: SectionReader, key: str) -> tuple[int, ...]:
    """The sizes of the runs of consecutive classes with the same parent in the WordTree file ``key`` names (tree.c's
    groups: ``name parent`` lines, the parent's index or -1)."""
    path = s.file(key)
    groups: list[int] = []
    last: int | None = None
    try:
        for number, line in read_lines(path, MAX_TREE_CLASSES, "a WordTree file", limit=MAX_TREE_BYTES):
            fields = line.split()
            if not fields:
                continue
            try:
                parent = int(fields[1]) if len(fields) > 1 else -1
            except ValueError:
                raise s.error(key, f"{path}:{number}: expected 'name parent' (a class name, then its parent's index "
                                   "or -1)") from None
            if parent != last or not groups:
                groups.append(0)
                last = parent
            groups[-1] += 1
    except BadLine as error:
        raise s.error(key, str(error)) from None
    except OSError as error:
        raise s.error(key, f"cannot read {path}: {error.strerror or error}") from None
    if not groups:
        raise s.error(key, f"{path} holds no classes")
    return tuple(groups)


def parse_softmax(s: SectionReader, common: dict[str, Any]) -> Softmax:
    tree = s.text("tree", "") or None
    s.read.update({"spatial", "noloss"})
    if s.has("spatial") and s.number("spatial", 0) != 0:
        raise s.error("spatial", "a spatial softmax is not supported by bigbatch (only 0)")
    return Softmax(**common, groups=s.integer("groups", 1, 1), temperature=s.number("temperature", 1.0, above=0),
                   tree=tree, tree_groups=read_tree_groups(s, "tree") if tree else ())


def softmax_shape(cfg: DarknetCfg, layer: Softmax, x: Shape, outputs: list[Shape]) -> Shape:
    if layer.tree_groups and sum(layer.tree_groups) > x.size:
        raise cfg.error(layer, "tree", f"the tree has {sum(layer.tree_groups)} classes, the input {x.size} values")
    if not layer.tree_groups and x.size % layer.groups:
        raise cfg.error(layer, "groups", f"{layer.groups} does not divide the {x.size} inputs")
    return x


class DarknetSoftmax(nn.Module):
    """``softmax(x / temperature)`` over consecutive chunks of the flattened input."""

    def __init__(self, spec: Softmax) -> None:
        super().__init__()
        self.groups, self.temperature, self.sizes = spec.groups, spec.temperature, spec.tree_groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1) / self.temperature
        if self.sizes:  # values past the tree's classes stay 0, as Darknet leaves its output there
            rest = flat.shape[1] - sum(self.sizes)
            chunks = flat.split([*self.sizes, rest], dim=1)
            out = torch.cat([*(chunk.softmax(dim=1) for chunk in chunks[:-1]), torch.zeros_like(chunks[-1])], dim=1)
        else:
            out = flat.view(flat.shape[0], self.groups, -1).softmax(dim=2)
        return out.reshape(x.shape)


def build_softmax(spec: Softmax, x: Shape, outputs: list[Shape]) -> DarknetSoftmax:
    return DarknetSoftmax(spec)


def softmax_row(spec: Softmax, x: Shape, out: Shape, net: Shape) -> TableRow:
    note = f"tree {spec.tree}" if spec.tree else (f"groups {spec.groups}" if spec.groups > 1 else "")
    return TableRow("softmax", "", "", note)


# ----------------------------------------------------------------------------- [cost]

COST_TYPES = ("sse", "masked", "smooth", "L1", "seg", "wgan")


def parse_cost(s: SectionReader, common: dict[str, Any]) -> Cost:
    return Cost(**common, type=s.choice("type", "sse", COST_TYPES), scale=s.number("scale", 1.0),
                ratio=s.number("ratio", 0.0))


def cost_shape(cfg: DarknetCfg, layer: Cost, x: Shape, outputs: list[Shape]) -> Shape:
    return x


def build_cost(spec: Cost, x: Shape, outputs: list[Shape]) -> nn.Identity:
    return nn.Identity()


def cost_row(spec: Cost, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("cost", "", "", spec.type)


register_kind(LayerKind("avgpool", ("avgpool", "avg"), parse_avgpool, avgpool_shape, build_avgpool, avgpool_row))
register_kind(LayerKind("softmax", ("softmax", "soft"), parse_softmax, softmax_shape, build_softmax, softmax_row,
                        head=True))
register_kind(LayerKind("cost", ("cost",), parse_cost, cost_shape, build_cost, cost_row, may_follow_head=True))
