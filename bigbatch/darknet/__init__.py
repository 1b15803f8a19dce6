"""Darknet networks from a ``.cfg``, and Darknet ``.weights`` files.

    cfg = read_darknet_cfg("yolov3.cfg")          # typed, checked layer specs (cfg.py); cfg.ignored: unused keys
    net = DarknetNetwork(cfg, width=416, height=416)   # or load_network(path, width, height, classes)
    print(layer_table(net))                       # Darknet's load-time table and the parameter count
    seen = read_weights(net, "yolov3.weights")    # weights.py; write_weights(net, path, seen, overwrite=False)
    outputs = net(images)                         # the raw input of each [yolo] layer; net.yolo_heads

Everything of Darknet's in bigbatch lives in this package:

    text.py        Darknet's key=value text files (.cfg, .data), read one way
    reading.py     one section read key by key, with Darknet's defaults and bigbatch's checks
    spec.py        what every layer has, and the table of layer kinds (KINDS)
    layers/        one module per layer kind: spec, parser, shape rule, torch module, table row
    cfg.py         a .cfg as typed, checked layer specs
    cfg_edit.py    a .cfg written back with keys changed (a run's network kept for its classes), the rest as written
    activations.py Darknet's activations as torch
    shapes.py      each layer's input and output shape at an input size
    network.py     the torch modules and Darknet's layer table
    weights.py     the .weights file format
    yolo_loss.py   Darknet's [yolo] loss and box decoding; the ``gradient`` dialect's loss
    yolo_delta.py  the ``alexeyab`` and ``pjreddie`` dialects: each fork's own [yolo] deltas as the gradient
    detector.py    a network as a bigbatch detector (loss in training, detections in eval)
    models.py      ``model.name: darknet`` in ``MODELS`` (and what ``bigbatch show`` prints of it)
    freeze.py      the freezing keys (stopbackward, train_only_bn, dont_update, burnin_update) as frozen groups
    recipe.py      a .cfg as a bigbatch config (``CONFIG_FORMATS``: ``bigbatch train yolov3.cfg``)
    yolo_data.py   the ``yolo`` dataset format in ``DATASETS`` (Darknet's .data files and label files)
    convert.py     ``bigbatch data convert``: COCO JSON to YOLO labels (Darknet's or Ultralytics' layout) and back
    export.py      ``bigbatch export``: a network's weights as .weights and/or a checkpoint
    test_image.py  Darknet's ``detector test``: its resize or letterbox, box correction and NMS kinds, in torch
    predict.py     ``bigbatch predict --from NET.cfg``: a network and its weights run as ``detector test`` runs it
    anchors.py     ``bigbatch data anchors``: ``detector calc_anchors`` (k-means on 1 - IoU); a .cfg with the anchors
"""

from bigbatch.darknet.cfg import DarknetCfg, ignored_keys, read_darknet_cfg, with_classes
from bigbatch.darknet.network import (
    DarknetNetwork,
    YoloHead,
    layer_table,
    load_network,
    parameter_count,
)
from bigbatch.darknet.weights import read_weights, weights_size, write_weights

__all__ = ["DarknetCfg", "DarknetNetwork", "YoloHead", "ignored_keys", "layer_table", "load_network",
           "parameter_count", "read_darknet_cfg", "read_weights", "weights_size", "with_classes", "write_weights"]
