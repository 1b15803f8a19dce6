"""Darknet networks from a ``.cfg``, and Darknet ``.weights`` files.

    cfg = read_darknet_cfg("yolov3.cfg")          # typed, checked layer specs (cfg.py); cfg.ignored: unused keys
    net = DarknetNetwork(cfg, width=416, height=416)   # or load_network(path, width, height, classes)
    print(layer_table(net))                       # Darknet's load-time table and the parameter count
    seen = read_weights(net, "yolov3.weights")    # weights.py; write_weights(net, path, seen, overwrite=False)
    outputs = net(images)                         # the raw input of each [yolo] layer; net.yolo_heads

Modules: ``activations`` (Darknet's activations as torch), ``cfg`` (the specs), ``shapes`` (the shape rules),
``network`` (the torch modules and the layer table), ``weights`` (the file format).
"""

from bigbatch.models.darknet.cfg import DarknetCfg, ignored_keys, read_darknet_cfg, with_classes
from bigbatch.models.darknet.network import (
    DarknetNetwork,
    YoloHead,
    layer_table,
    load_network,
    parameter_count,
)
from bigbatch.models.darknet.weights import read_weights, weights_size, write_weights

__all__ = ["DarknetCfg", "DarknetNetwork", "YoloHead", "ignored_keys", "layer_table", "load_network",
           "parameter_count", "read_darknet_cfg", "read_weights", "weights_size", "with_classes", "write_weights"]
