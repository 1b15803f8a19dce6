"""The demo classifier: three conv stages, global average pooling and a linear head."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


def norm_layer(kind: str, channels: int, **factory: Any) -> nn.Module:
    """``batch``: BatchNorm2d; ``group``: GroupNorm with up to 8 groups; ``none``: identity. ``factory``: the
    ``device``/``dtype`` a model builder passes (timm's do)."""
    if kind == "batch":
        return nn.BatchNorm2d(channels, **factory)
    if kind == "group":
        groups = next(g for g in (8, 4, 2, 1) if channels % g == 0)
        return nn.GroupNorm(groups, channels, **factory)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}")


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 32, norm: str = "batch",
                 dropout: float = 0.0):
        super().__init__()
        bias = norm == "none"  # a norm layer's shift makes a conv bias redundant

        def stage(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=bias),
                norm_layer(norm, cout),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            )

        self.features = nn.Sequential(
            stage(in_channels, width), stage(width, 2 * width), stage(2 * width, 4 * width)
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(x).mean(dim=(2, 3))))
