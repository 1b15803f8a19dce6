"""Darknet's layer kinds, one module each (``spec.LayerKind``: spec, parser, shape rule, torch module, table row).

Importing this package registers every kind in ``spec.KINDS``. To add a kind: a module here that calls
``register_kind``, imported below.
"""

from bigbatch.darknet.layers import conv, dropout, merge, pool, upsample, yolo
from bigbatch.darknet.layers.conv import Convolutional
from bigbatch.darknet.layers.dropout import Dropout
from bigbatch.darknet.layers.merge import Route, Shortcut
from bigbatch.darknet.layers.pool import MaxPool
from bigbatch.darknet.layers.upsample import Upsample
from bigbatch.darknet.layers.yolo import Yolo

__all__ = ["Convolutional", "Dropout", "MaxPool", "Route", "Shortcut", "Upsample", "Yolo", "conv", "dropout",
           "merge", "pool", "upsample", "yolo"]
