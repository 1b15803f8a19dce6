"""An exported model (``bigbatch export --format onnx|torchscript|openvino``) in its own runtime, as a ``Predictor``.

The file holds the graph of the part of the model that has weights (a classifier; a Darknet network's ``[yolo]``
inputs) and, in its metadata (ONNX ``metadata_props``, TorchScript's extra file), ``bigbatch.json``: the task, the
class names, the input shape and the predictor's ``origin`` (a run's config and kept files, or a Darknet cfg's text
and ``detector test``'s settings). :func:`load_exported` rebuilds the predictor from the metadata alone, with
:class:`RuntimeNetwork` (onnxruntime's session or the TorchScript module) in place of the exported part, so that
``predict`` decodes its outputs exactly as it decodes the PyTorch model's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.inference.predictor import Predictor

METADATA_KEY = "bigbatch.json"
OPENVINO_METADATA = ("bigbatch", "json")
"""Where an OpenVINO model's ``rt_info`` holds ``bigbatch.json``."""
METADATA_FORMAT = 1
MISSING = "{what} needs the optional 'export' extra: pip install 'bigbatch[export]'"
MAX_METADATA = 64 << 20
"""The largest ``bigbatch.json`` read from a file (a run's config and a cfg's text are a few KB)."""


class RuntimeNetwork(nn.Module):
    """An exported graph in its runtime standing in for the module it was exported from: ``forward(x)`` gives the
    same outputs (one tensor, or a list for a Darknet network). It holds no weights; its one buffer says where its
    inputs go (the CPU)."""

    def __init__(self, run: Callable[[torch.Tensor], list[torch.Tensor]], single: bool, batch: int | None,
                 decoded: bool = False) -> None:
        super().__init__()
        self.run, self.single = run, single
        self.decoded = decoded
        """A Darknet network exported with ``--postprocess``: its outputs are decoded (boxes, objectness, classes)."""
        self.batch = batch
        """The batch the graph was exported for (inputs are cut into it), or None for a free batch dimension."""
        self.register_parameter("device_marker", nn.Parameter(torch.zeros(()), requires_grad=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        x = x.detach().float().cpu().contiguous()
        if self.batch is None or len(x) == self.batch:
            outputs = self.run(x)
        else:
            parts = [self.run(chunk) for chunk in x.split(self.batch)]
            outputs = [torch.cat(pieces) for pieces in zip(*parts, strict=True)]
        return outputs[0] if self.single else outputs


class RuntimeDetector(nn.Module):
    """A torchvision detector exported whole (``inference/export.py``'s ``DetectorGraph``) standing in for it:
    ``forward(images)`` runs each image alone, as the graph takes them, and gives torchvision's detections. Its
    thresholds were fixed when it was exported (``fixed_thresholds``); ``predict``'s ``--conf`` and ``--max-det``
    still filter what it finds."""

    fixed_thresholds = True

    def __init__(self, run: Callable[[torch.Tensor], list[torch.Tensor]], thresholds: dict[str, float]) -> None:
        super().__init__()
        self.run = run
        self.score_thresh, self.nms_thresh = thresholds["conf"], thresholds["iou"]
        self.detections_per_img = int(thresholds["max_det"])
        self.register_parameter("device_marker", nn.Parameter(torch.zeros(()), requires_grad=False))

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        found = []
        for image in images:
            boxes, scores, labels = self.run(image.detach().float().cpu()[None].contiguous())
            found.append({"boxes": boxes, "scores": scores, "labels": labels.long()})
        return found


def onnx_session(path: Path) -> tuple[Callable[[torch.Tensor], list[torch.Tensor]], dict[str, str]]:
    """(a function running the ONNX file at ``path`` in onnxruntime on the CPU, its metadata)."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(MISSING.format(what="an ONNX model")) from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise UserError(f"--from: {path} does not load in onnxruntime ({str(error).splitlines()[0][:200]})") from None
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        return [torch.from_numpy(out) for out in session.run(None, {name: x.numpy()})]

    return run, dict(session.get_modelmeta().custom_metadata_map)


def openvino_model(path: Path) -> tuple[Callable[[torch.Tensor], list[torch.Tensor]], dict[str, str]]:
    """(a function running the OpenVINO IR at ``path`` (``.xml`` beside its ``.bin``) on the CPU at f32 inference
    precision, its metadata). OpenVINO would run bf16 on a CPU with AVX512_BF16 or AMX by default."""
    try:
        import openvino
    except ImportError:
        raise UserError(MISSING.format(what="an OpenVINO model")) from None
    core = openvino.Core()
    try:
        model = core.read_model(str(path))
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    except Exception as error:  # OpenVINO raises RuntimeError subclasses of its own
        raise UserError(f"--from: {path} does not load in OpenVINO ({str(error).splitlines()[0][:200]})") from None
    try:
        text = model.get_rt_info(list(OPENVINO_METADATA)).astype(str)
    except Exception:  # no such rt_info entry
        text = ""

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        results = compiled(x.numpy())
        return [torch.from_numpy(results[output].copy()) for output in compiled.outputs]

    return run, {METADATA_KEY: text}


def torchscript_module(path: Path) -> tuple[Callable[[torch.Tensor], list[torch.Tensor]], dict[str, str]]:
    """(a function running the TorchScript file at ``path``, its metadata)."""
    import warnings

    files = {METADATA_KEY: ""}
    try:
        with warnings.catch_warnings():  # torch 2.14 deprecates TorchScript for torch.export; its files still load
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location="cpu", _extra_files=files)
    except Exception as error:  # a file that is not a TorchScript archive
        raise UserError(f"--from: {path} does not load as TorchScript ({str(error).splitlines()[0][:200]})") from None
    module.eval()

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad(), warnings.catch_warnings():  # a scripted torchvision detector says it on every call
            warnings.filterwarnings("ignore", message=r".* returns a \(Losses, Detections\) tuple in scripting")
            out = module(x)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    text = files[METADATA_KEY]
    return run, {METADATA_KEY: text.decode() if isinstance(text, bytes) else text}


def read_metadata(meta: dict[str, str], path: Path) -> dict[str, Any]:
    """The checked ``bigbatch.json`` of an exported file."""
    text = meta.get(METADATA_KEY)
    if not text:
        raise UserError(f"--from: {path} was not written by bigbatch export (no {METADATA_KEY} in its metadata)")
    if len(text) > MAX_METADATA:
        raise UserError(f"--from: {path}: its {METADATA_KEY} is larger than {MAX_METADATA >> 20} MiB")
    try:
        data = json.loads(text)
    except ValueError:
        raise UserError(f"--from: {path}: its {METADATA_KEY} is not JSON") from None
    ok = (isinstance(data, dict) and data.get("format") == METADATA_FORMAT and data.get("task") in
          ("classification", "detection") and isinstance(data.get("classes"), list)
          and all(isinstance(c, str) for c in data["classes"]) and isinstance(data.get("origin"), dict))
    if not ok:
        raise UserError(f"--from: {path}: its {METADATA_KEY} is not one this version of bigbatch reads")
    return data


def load_exported(path: Path, device: torch.device) -> Predictor:
    """The predictor an exported file stands for (see the module docstring), run on the CPU."""
    from bigbatch.registry import MODEL_FILES

    if not path.is_file():
        raise UserError(f"--from: {path} " + ("is not a regular file; not read" if path.exists() else "does not exist"))
    suffix = path.suffix.lower()
    run, meta = {".onnx": onnx_session, ".xml": openvino_model}.get(suffix, torchscript_module)(path)
    data = read_metadata(meta, path)
    batch = data.get("batch")
    if data.get("graph") == "detector":
        thresholds = data.get("thresholds")
        if not (isinstance(thresholds, dict) and all(isinstance(thresholds.get(k), (int, float))
                                                     for k in ("conf", "iou", "max_det"))):
            raise UserError(f"--from: {path}: its {METADATA_KEY} has no thresholds for its detector")
        network = RuntimeDetector(run, thresholds)
    else:
        network = RuntimeNetwork(run, single=data["task"] == "classification",
                                 batch=batch if isinstance(batch, int) and batch >= 1 else None,
                                 decoded=data.get("graph") == "decoded")
    origin, classes = data["origin"], data["classes"]
    kind = origin.get("kind")
    if kind == "run":
        predictor = rebuild_run(origin, network, classes)
    elif isinstance(kind, str) and kind in MODEL_FILES.names() and MODEL_FILES.get(kind).info.rebuild is not None:
        predictor = MODEL_FILES.get(kind).info.rebuild(origin, network, classes)
    else:
        raise UserError(f"--from: {path}: its model kind {kind!r} is not one this version of bigbatch rebuilds")
    predictor.source = f"{path} ({ {'.onnx': 'onnxruntime', '.xml': 'OpenVINO'}.get(suffix, 'TorchScript')})"
    return predictor


def rebuild_run(origin: dict[str, Any], network: RuntimeNetwork, classes: list[str]) -> Predictor:
    """A run's predictor around its exported graph: its config (with the files it kept, written to a temporary
    folder) builds the evaluation transform and, for a Darknet detector, the decoding (on the meta device)."""
    import tempfile

    from bigbatch.config import apply_overrides, validate_config
    from bigbatch.inference.pipelines import CONF, EvalClassification, EvalDetection, Settings, own_thresholds
    from bigbatch.registry import TASKS

    with tempfile.TemporaryDirectory() as folder:
        overrides = []
        for number, (key, text) in enumerate(sorted(origin.get("kept", {}).items())):
            kept = Path(folder) / f"kept{number}{Path(key).suffix or '.cfg'}"
            kept.write_text(text)
            overrides.append(f"{key}={kept}")
        cfg = validate_config(apply_overrides(origin["config"], overrides))
        task = TASKS.get(cfg.task).obj
        if cfg.task == "classification":
            settings = Settings(conf=CONF, iou=0.0, max_det=1, batch=cfg.eval.batch)
            return Predictor(network, classes, EvalClassification(task.image_input(cfg)), settings, "", origin)
        if isinstance(network, RuntimeDetector):  # the whole detector is in the file
            settings = Settings(conf=CONF, iou=network.nms_thresh, max_det=network.detections_per_img,
                                batch=cfg.eval.batch)
            return Predictor(network, classes, EvalDetection(task.image_input(cfg)), settings, "", origin)
        with torch.device("meta"):
            skeleton = task.model_for(cfg.model_copy(update={"model": cfg.model.model_copy(update={"weights": None})}),
                                      classes)
    if not hasattr(skeleton, "network"):
        raise UserError("--from: only Darknet detectors are exported with their decoding outside PyTorch so far")
    network.yolo_heads = skeleton.network.yolo_heads
    skeleton.network = network
    thresholds = own_thresholds(skeleton)
    settings = Settings(conf=CONF, iou=thresholds["iou"], max_det=thresholds["max_det"], batch=cfg.eval.batch)
    return Predictor(skeleton.eval(), classes, EvalDetection(task.image_input(cfg)), settings, "", origin)


def evaluate_exported(path: Path, overrides: list[str], save_detections: Path | None) -> None:
    """``eval MODEL.onnx|MODEL.torchscript``: a file ``bigbatch export`` wrote from a run, evaluated in its runtime
    (``inference/runtime.py``) on the validation set of the run's config it carries (``--set data...`` to point it
    elsewhere), through the same task code as a checkpoint."""
    from bigbatch.config import apply_overrides, validate_config
    from bigbatch.engine.eval_checkpoint import NOT_OURS, eval_record_path, is_results_file
    from bigbatch.errors import named_as
    from bigbatch.floor import files, written
    from bigbatch.floor.outputs import check_output_file, probe_writable
    from bigbatch.tasks import build_task
    from bigbatch.telemetry.capacity import check_capacity

    out = eval_record_path(path)
    probe_writable(out.parent, "eval")
    if save_detections is not None:
        check_output_file(save_detections, "--save-detections", ours=is_results_file, what=NOT_OURS)
    with named_as("eval", instead_of="--from"):
        model = load_exported(path, torch.device("cpu"))
    if model.origin.get("kind") != "run":
        raise UserError(f"eval: {path} was exported from a .cfg, not a run: it has no validation set to evaluate on "
                        "(bigbatch predict runs it)")
    cfg = validate_config(apply_overrides(model.origin["config"], overrides))
    check_capacity(cfg)  # what could never fit this machine (data.size=100000), as a checkpoint's eval refuses it
    task = build_task(cfg)
    images = f"{len(task.val_set)} validation image{'' if len(task.val_set) == 1 else 's'}"
    print(f"model    {model.source}; evaluating {images}", flush=True)
    metrics, predictions = task.predict(model.module, cfg.eval.batch, progress=True)
    if save_detections is not None and task.prediction_format is not None:
        with written.recorded(save_detections):  # the task's atomic write records the file it makes
            task.save_predictions(save_detections, predictions)
        print(f"{len(predictions)} detections written to {save_detections} ({task.prediction_format} format)")
    record = {"checkpoint": str(path), "split": "val", "runtime": model.source, **metrics}
    print(task.report(metrics))
    files.atomic_write(out, lambda f: f.write(json.dumps(record, indent=2) + "\n"), mode="w", record=True)
    print(f"written to {out}")
