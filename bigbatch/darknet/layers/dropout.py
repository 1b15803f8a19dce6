"""``[dropout]`` (dropout_layer.c): zero with ``probability``, scale the rest by ``1 / (1 - probability)`` in
training; the identity in evaluation (torch's ``nn.Dropout``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import DarknetCfg, LayerKind, LayerSpec, Shape, TableRow, register_kind


@dataclass(frozen=True, kw_only=True)
class Dropout(LayerSpec):
    kind = "dropout"
    probability: float = 0.2


REFUSED = {"dropblock": "0"}


def parse(s: SectionReader, common: dict[str, Any]) -> Dropout:
    s.refuse(REFUSED)
    probability = s.number("probability", 0.2, 0)
    if probability >= 1:
        raise s.error("probability", f"expected a number in [0, 1), not {s.options['probability']!r}")
    return Dropout(**common, probability=probability)


def shape(cfg: DarknetCfg, layer: Dropout, x: Shape, outputs: list[Shape]) -> Shape:
    return x


def build(spec: Dropout, x: Shape, outputs: list[Shape]) -> nn.Dropout:
    return nn.Dropout(spec.probability)


def row(spec: Dropout, x: Shape, out: Shape, net: Shape) -> TableRow:
    return TableRow("dropout", "", "", f"p = {spec.probability:g}")


register_kind(LayerKind("dropout", ("dropout",), parse, shape, build, row,
                        ignored=frozenset({"dropblock_size_rel", "dropblock_size_abs"}), refused=REFUSED))
