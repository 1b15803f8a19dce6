"""Darknet's layer kinds, one module each (``spec.LayerKind``: spec, parser, shape rule, torch module, table row).

Importing this package registers every kind in ``spec.KINDS``. To add a kind: a module here that calls
``register_kind``, imported below.
"""

from bigbatch.darknet.layers import (
    attention,
    classify,
    conv,
    crop,
    dense,
    dropout,
    heads,
    merge,
    pool,
    reorg,
    upsample,
    yolo,
)
from bigbatch.darknet.layers.classify import AvgPool, Cost, Softmax
from bigbatch.darknet.layers.conv import Convolutional
from bigbatch.darknet.layers.crop import Crop
from bigbatch.darknet.layers.dense import Connected, Local
from bigbatch.darknet.layers.dropout import Dropout
from bigbatch.darknet.layers.merge import Route, Shortcut
from bigbatch.darknet.layers.pool import LocalAvgPool, MaxPool
from bigbatch.darknet.layers.upsample import Upsample
from bigbatch.darknet.layers.yolo import Yolo

MODULES = (attention, classify, conv, crop, dense, dropout, heads, merge, pool, reorg, upsample, yolo)
"""The modules that register the kinds."""

__all__ = ["MODULES", "AvgPool", "Connected", "Convolutional", "Cost", "Crop", "Dropout", "Local", "LocalAvgPool",
           "MaxPool", "Route", "Shortcut", "Softmax", "Upsample", "Yolo"]
