"""``bigbatch predict --from NET.cfg --weights W.weights``: a Darknet network run as Darknet's ``detector test``.

The network is built at its ``[net]`` size (or ``--size``) for the cfg's classes and loaded from ``--weights`` (a
``.weights`` file, a ``.conv.N`` backbone or a state dict: ``models.load_darknet_weights``). Each image goes through
``test_image.py``: Darknet's ``resize_image`` (or ``letterbox_image`` for ``[net] letter_box=1``), the forward pass,
``get_yolo_detections``' thresholds, the last ``[yolo]`` layer's ``nms_kind`` and ``beta_nms`` at 0.45 and
``correct_yolo_boxes``: AlexeyAB's ``test_detector`` (src/detector.c). ``--darknet-dialect pjreddie`` follows pjreddie's
instead, read from its source (not run against its binary, whose ``detector test`` writes no boxes): the cfg read as
that fork reads it, every image letterboxed, plain IoU NMS (``do_nms_sort``) and ``-thresh`` 0.5. The class names come
from ``--names`` (a ``.names`` file, or the ``names=`` of a ``.data`` file, as ``yolo_data.names_of_data_file`` reads it
for training); without it they are the class numbers. Registered in ``registry.MODEL_FILES`` under ``.cfg``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.inference.pipelines import Settings
from bigbatch.inference.predictor import Predictor
from bigbatch.registry import MODEL_FILES

CONF = 0.25
"""AlexeyAB's ``detector test``'s default ``-thresh`` (pjreddie's: 0.5); ``inference/pipelines.py``'s default too."""
DIALECTS = ("alexeyab", "pjreddie")
NMS = 0.45
"""``detector test``'s NMS threshold (``float nms = .45``)."""


class DarknetTestDetection:
    """The pipeline (``inference/pipelines.py``'s protocol) of a Darknet network run as ``detector test`` runs it."""

    task = "detection"

    def __init__(self, net_size: tuple[int, int], letter: bool, nms_kind: str, beta_nms: float) -> None:
        self.net_size, self.letter = net_size, letter
        self.nms_kind, self.beta_nms = nms_kind, beta_nms

    def prepare(self, pixels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        from bigbatch.darknet.test_image import preprocess

        return preprocess(pixels, self.net_size, self.letter)

    def prepare_file(self, path: str) -> tuple[torch.Tensor, Any]:
        from bigbatch.data.pipeline.images import decode_shown

        return self.prepare(decode_shown(path))

    @staticmethod
    def size_of(geometry: Any) -> tuple[int, int]:
        return geometry.image_size

    @torch.no_grad()
    def run(self, module: nn.Module, inputs: list[torch.Tensor], geometries: list[Any],
            settings: Settings) -> list[dict[str, torch.Tensor]]:
        from bigbatch.darknet.test_image import detections

        device = next(module.parameters()).device
        raw = module.network(torch.stack(inputs).to(device, non_blocking=True))
        return detections(raw, module.specs, geometries, settings.conf, settings.iou, settings.max_det,
                          self.nms_kind, self.beta_nms, decoded=getattr(module.network, "decoded", False))


def load_cfg(cfg_path: Path, weights: str | os.PathLike | None, names: str | os.PathLike | None,
             device: torch.device, size: int | None, letterbox: bool | None, dialect: str = "alexeyab") -> Predictor:
    """The :class:`~bigbatch.inference.predictor.Predictor` of a cfg and its weights (see the module docstring)."""
    from bigbatch.darknet.detector import DarknetDetector
    from bigbatch.darknet.models import darknet_network, load_darknet_weights
    from bigbatch.darknet.test_image import cfg_letter_box, cfg_nms

    if weights is None:
        raise UserError(f"--weights: a Darknet .cfg ({cfg_path}) needs its weights (--weights W.weights)")
    if dialect not in DIALECTS:
        raise UserError(f"--darknet-dialect: expected {' or '.join(DIALECTS)}, not {dialect!r}")
    network = darknet_network(str(cfg_path), None, size, key="--from", dialect=dialect)
    specs = network.cfg.yolo_layers
    if not specs:
        raise UserError(f"--from: {cfg_path} has no [yolo] layer: bigbatch predicts with Darknet YOLO detectors")
    load_darknet_weights(network, weights, key="--weights")
    classes = class_names(names, specs[-1].classes)
    module = DarknetDetector(network).to(device).eval()
    if dialect == "pjreddie":  # its test_detector: letterbox_image, do_nms_sort, -thresh .5
        letter, (nms_kind, beta_nms), conf = True if letterbox is None else letterbox, ("default", 0.6), 0.5
    else:  # AlexeyAB's: resize_image unless letter_box=1, the last [yolo] layer's NMS kind, -thresh .25
        letter = letterbox if letterbox is not None else cfg_letter_box(network.cfg)
        (nms_kind, beta_nms), conf = cfg_nms(specs), CONF
    shape = network.input_shape
    pipeline = DarknetTestDetection((shape.height, shape.width), letter, nms_kind, beta_nms)
    settings = Settings(conf=conf, iou=NMS, max_det=module.detections_per_image, batch=1)
    from bigbatch.darknet.cfg_edit import cfg_text_of

    origin = {"kind": ".cfg", "cfg": cfg_text_of(network.cfg, f"# exported from {cfg_path.name}"),
              "net_size": [shape.height, shape.width], "letter": letter, "nms_kind": nms_kind, "beta_nms": beta_nms,
              "conf": conf, "dialect": dialect}
    return Predictor(module, classes, pipeline, settings, f"{weights} on {cfg_path}", origin)


def rebuild(origin: dict[str, Any], network: nn.Module, classes: list[str]) -> Predictor:
    """The predictor an exported Darknet network stands for (``MODEL_FILES``' ``rebuild``): its cfg (kept in the
    file) built on the meta device for its ``[yolo]`` specs, the file's runtime in place of its network, and
    ``detector test``'s preprocessing and NMS as they were when it was exported."""
    import tempfile

    from bigbatch.darknet.detector import DarknetDetector
    from bigbatch.darknet.models import darknet_network

    net_h, net_w = origin["net_size"]
    with tempfile.TemporaryDirectory() as folder, torch.device("meta"):
        cfg_file = Path(folder) / "exported.cfg"
        cfg_file.write_text(origin["cfg"])
        skeleton = darknet_network(str(cfg_file), None, None, key="--from", dialect=origin["dialect"])
    network.yolo_heads = skeleton.yolo_heads  # the specs' places in the outputs, read by DarknetDetector.specs
    module = DarknetDetector(network).eval()
    pipeline = DarknetTestDetection((net_h, net_w), origin["letter"], origin["nms_kind"], origin["beta_nms"])
    settings = Settings(conf=origin["conf"], iou=NMS, max_det=module.detections_per_image, batch=1)
    return Predictor(module, classes, pipeline, settings, "", origin)


def class_names(names: str | os.PathLike | None, classes: int) -> list[str]:
    """The class names of a ``.names`` file, or of the ``names=`` a ``.data`` file gives; the class numbers without
    one. Their count must be the network's."""
    from bigbatch.darknet.yolo_data import names_of_data_file, read_names

    if names is None:
        return [str(label) for label in range(classes)]
    path = Path(names)
    found = names_of_data_file(path, key="--names") if path.suffix == ".data" else read_names(path)
    if len(found) != classes:
        raise UserError(f"--names: {path} holds {len(found)} class names; the network has classes={classes}")
    return found


MODEL_FILES.register(".cfg", load_cfg, rebuild=rebuild)
