"""``bigbatch export SOURCE --format onnx|torchscript|openvino --out FILE``: a trained model out of PyTorch, checked
in its own runtime before it is written.

What is exported is the part of the model with weights, from a decoded image's input tensor ``[N, 3, H, W]`` (the run's
evaluation transform, or Darknet's ``detector test`` preprocessing, applied outside the graph):

- a classifier (``small_cnn``, torchvision's and timm's, a Darknet classifier): the logits ``[N, classes]``; Inception's
  auxiliary head is not in the graph (eval mode);
- a Darknet detector (a run of ``model.name: darknet``, or a ``.cfg`` with ``--weights``): the network's raw outputs,
  the input of each ``[yolo]`` layer; ``predict`` decodes them as it decodes the PyTorch model's. With
  ``--postprocess`` the decoding is in the graph (``DecodedNetwork``: boxes ``[N, P, 4]`` XYXY in input pixels,
  objectness ``[N, P]``, class probabilities ``[N, P, C]``, over every candidate ``P``), and ``predict`` keeps the
  thresholds and NMS: Darknet's NMS (greedy DIoU for ``nms_kind=greedynms``, per class) is in none of the formats
  (ONNX's ``NonMaxSuppression`` is plain IoU), and outside the graph ``--conf`` and ``--iou`` stay free;
- a torchvision detector (``small_detector``, FCOS, RetinaNet, Faster R-CNN, SSD): the whole detector on one image of
  any size, normalisation, decoding and NMS included, at the thresholds it evaluates with (``DetectorGraph``).
  torchvision writes its detectors for export: their data-dependent steps (the number of candidates, NMS) are traced
  by the TorchScript-based ONNX exporter (``dynamo=False``, opset 17; OpenVINO converts that ONNX file) and compiled by
  ``torch.jit.script``. A two-stage detector has no raw outputs to stop at (its second stage reads the first's NMS),
  so the graph always ends at the detections. Its answers are the PyTorch model's one image at a time: a batch of
  several pads each image to the largest, which moves a detector's outputs slightly.

- **ONNX**: ``torch.onnx.export(dynamo=True)``, torch 2.14's default exporter (``torch.export``, then onnxscript), at
  opset 18 (``--opset``: 18 to :data:`MAX_OPSET`); ``--dynamic-batch`` leaves the batch dimension free.
- **TorchScript**: ``torch.jit.trace`` (classifiers and Darknet networks), ``torch.jit.script`` (torchvision's
  detectors).
- **OpenVINO**: ``openvino.convert_model`` from the module (``--out NAME.xml``, and ``NAME.bin`` beside it), fp32,
  checked and run at f32 inference precision (``INFERENCE_PRECISION_HINT``: OpenVINO runs bf16 by default on CPUs with
  AVX512_BF16 or AMX).

The file's metadata (ONNX ``metadata_props``, TorchScript's extra files, OpenVINO's ``rt_info``) holds
``bigbatch.json``: the task, the class names, the input shape and what rebuilds the predictor around the graph
(``inference/runtime.py``), so that ``bigbatch predict --from FILE`` and ``bigbatch.load(FILE)`` use it alone.

Every export is checked: the file is loaded in its runtime (onnxruntime on the CPU; TorchScript; OpenVINO) and run on
``--check`` images (a run's first validation images, or ``--check-images SOURCE``; seeded random inputs otherwise, said
so); the largest difference from PyTorch, ``max|a - b| / max|b|`` per output, must be at most :data:`TOLERANCE`. A
torchvision detector's detections may differ from PyTorch's by NMS ties alone (:func:`compare_detections`): of two
candidates of one class overlapping by more than the IoU threshold, greedy NMS keeps the higher scored, and where the
two scores are equal to within :data:`TOLERANCE` the runtimes' rounding picks (measured: a Faster R-CNN's proposals
0.08 px apart, one float32 ulp apart in score in PyTorch, equal in onnxruntime). The file's detections must then be
what PyTorch's own NMS keeps of PyTorch's own candidates with such scores taken in either order, each a candidate to
within :data:`TOLERANCE`; the ties are said. The file is written to a temporary name beside ``--out`` and given its
name (a hard link, which never replaces a file) only once it has passed; a failed check leaves no file and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.inference.predictor import Predictor
from bigbatch.inference.runtime import METADATA_FORMAT, METADATA_KEY, MISSING, OPENVINO_METADATA

FORMATS = {"onnx": ".onnx", "torchscript": ".torchscript", "openvino": ".xml"}
"""The formats and the suffix each file must have (``predict --from`` knows a file by it)."""
RUNTIMES = {"onnx": "onnxruntime", "torchscript": "TorchScript", "openvino": "OpenVINO (CPU, f32 inference precision)"}
OPSET = 18
MAX_OPSET = 23
TOLERANCE = 1e-4
"""The largest ``max|a - b| / max|b|`` per output between the runtime and PyTorch, in fp32."""
MAX_CHECK = 256
TRACED_ONNX = "torch.onnx.export(dynamo=False), the TorchScript-based exporter, opset 17"
"""How a torchvision detector, decoding included, is written to ONNX (and, through ONNX, to OpenVINO)."""


class CheckFailed(Exception):
    """The exported file answers differently from PyTorch (exit 1; the file is not written)."""


def export_model(source: Path, fmt: str, out: Path, weights: Path | None = None, names: Path | None = None,
                 size: int | None = None, dynamic_batch: bool = False, opset: int | None = None, check: int = 8,
                 check_images: list[str] | None = None, postprocess: bool = False, half: bool = False) -> list[str]:
    """Export ``source`` (a run directory, a checkpoint, a ``.cfg`` with ``weights``) to ``out`` in ``fmt``, checked
    (see the module docstring); -> the lines to print."""
    from bigbatch.floor.outputs import check_output_file
    from bigbatch.inference.loading import load

    if fmt == "tensorrt":  # on any machine: a CUDA device would not change it
        raise UserError("--format tensorrt: TensorRT engines are not written by this version yet: export --format "
                        "onnx, and build the engine from it with TensorRT's own trtexec")
    if fmt not in FORMATS:
        raise UserError(f"--format: expected one of {', '.join(FORMATS)}, not {fmt!r}")
    if out.suffix.lower() != FORMATS[fmt]:
        raise UserError(f"--out: a {fmt} file is named *{FORMATS[fmt]} (predict --from knows it by that), not {out}")
    if fmt in ("onnx", "torchscript"):
        from bigbatch.floor.outputs import check_utf8_name

        check_utf8_name(out, "--out", "torch.jit.save" if fmt == "torchscript" else "onnxruntime's check")
    opset = OPSET if opset is None else opset
    if not OPSET <= opset <= MAX_OPSET:
        raise UserError(f"--opset: the dynamo exporter writes opsets {OPSET} to {MAX_OPSET}, not {opset}")
    if not 0 <= check <= MAX_CHECK:
        raise UserError(f"--check: expected 0 to {MAX_CHECK} images, got {check}")
    if half:
        raise UserError("--half: an fp16 export is made and checked on a CUDA device" + (
            "; this version exports fp32 only" if torch.cuda.is_available() else " (none here): the CPU runtimes run "
            "the fp32 file (OpenVINO in bf16 where the CPU has it, at its default precision)"))
    check_output_file(out, "--out")
    if fmt == "openvino":
        check_output_file(out.with_suffix(".bin"), "--out (its weights, beside it)")
        _require("openvino", what="export --format openvino")
    if fmt == "onnx":
        _require_onnx()
    model = load(source, weights=weights, names=names, size=size, device="cpu")
    graph, kind = exported_part(model, postprocess)
    if kind == "detector" and dynamic_batch:
        raise UserError("--dynamic-batch: a torchvision detector's graph takes one image (of any size) at a time")
    inputs = check_inputs(model, check_images, max(check, 1), same_size=kind != "detector")
    example = torch.stack(inputs[:2] if dynamic_batch else inputs[:1]).float()
    exporter = {"onnx": f"torch.onnx.export(dynamo=True), opset {opset}", "openvino": "openvino.convert_model, fp32",
                "torchscript": "torch.jit.trace"}[fmt]
    if kind == "detector":
        exporter = {"onnx": TRACED_ONNX, "openvino": f"openvino.convert_model from {TRACED_ONNX}, fp32",
                    "torchscript": "torch.jit.script"}[fmt]
    metadata = {"format": METADATA_FORMAT, "task": model.task, "classes": model.classes, "graph": kind,
                "input": list(inputs[0].shape) if kind != "detector" else [3, None, None],
                "batch": None if dynamic_batch else 1, "origin": model.origin, "exporter": exporter}
    if kind == "detector":
        from bigbatch.inference.pipelines import own_thresholds

        metadata["thresholds"] = own_thresholds(model.module)
    metadata = json.dumps(metadata)
    tmp = out.parent / f".{out.stem}.tmp-{os.getpid()}{out.suffix}"
    written = [(tmp, out)] if fmt != "openvino" else [(tmp.with_suffix(".bin"), out.with_suffix(".bin")), (tmp, out)]
    for made, _ in written:  # the temporary names must be new: only then is what is removed below this process's
        if os.path.lexists(made):
            raise UserError(f"--out: {made} is in the way of the temporary file export writes; move it away")
    try:
        if fmt == "onnx" and kind == "detector":
            write_onnx_traced(graph, example, tmp, metadata)
        elif fmt == "onnx":
            write_onnx(graph, example, tmp, metadata, opset, dynamic_batch)
        elif fmt == "openvino":
            write_openvino(graph, example, tmp, metadata, dynamic_batch)
        else:
            write_torchscript(graph, example, tmp, metadata)
        notes: list[str] = []
        worst = check_file(graph, tmp, fmt, inputs[:check], dynamic_batch, notes)
        for made, name in written:  # the .xml last: a model is there only once its weights are
            try:
                os.link(made, name)  # never over a file: one that appeared meanwhile stops it
            except FileExistsError:
                raise UserError(f"--out: {name} exists; bigbatch does not overwrite it (choose a new file)") from None
    finally:
        for made, _ in written:
            if made.exists():
                made.unlink()  # the temporary names made above, by this process
    shown = f"{worst:.2e}" if check else "not checked (--check 0)"
    shape = " x ".join(map(str, inputs[0].shape)) if kind != "detector" else "3 x H x W"
    return [f"{fmt} written to {out} ({out.stat().st_size:,} bytes; {model.task}, {len(model.classes)} classes, input "
            f"{'N' if dynamic_batch else 1} x {shape}; {exporter})",
            f"checked in {RUNTIMES[fmt]} on {min(check, len(inputs))} images: "
            f"largest difference from PyTorch {shown} (max|a - b| / max|b|, at most {TOLERANCE:g})",
            *(f"note: {note}" for note in notes)]


def _require(*modules: str, what: str) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise UserError(MISSING.format(what=what)) from None


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UserError(MISSING.format(what="export --format onnx")) from None


def exported_part(model: Predictor, postprocess: bool = False) -> tuple[nn.Module, str]:
    """(the module the file holds, its kind): a classifier whole (``logits``), a Darknet detector's network (``raw``:
    its ``[yolo]`` inputs; ``decoded`` with ``postprocess``), a torchvision detector whole with its decoding
    (``detector``, see the module docstring)."""
    if model.task == "classification":
        if postprocess:
            raise UserError("--postprocess: for a detector; a classifier's graph ends at its logits")
        return model.module.eval(), "logits"
    network = getattr(model.module, "network", None)
    if network is not None:
        return (model.module.decoded_network() if postprocess else network).eval(), "decoded" if postprocess else "raw"
    return DetectorGraph(model.module).eval(), "detector"


class DetectorGraph(nn.Module):
    """A torchvision detector (``models/detectors.py``'s ``Detector``) on one image ``[1, 3, H, W]`` in ``[0, 1]``,
    with its normalisation, decoding and NMS at its own thresholds: (boxes XYXY in the input's pixels, scores,
    labels ``0..C-1``)."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        found = self.detector([x[0]])[0]
        return found["boxes"], found["scores"], found["labels"]

    def scripted(self) -> torch.jit.ScriptModule:
        """The same graph compiled by ``torch.jit.script`` (torchvision's detectors are written to be scriptable;
        tracing would fix the number of detections)."""
        return torch.jit.script(_ScriptableDetector(torch.jit.script(self.detector.detector),
                                                    int(self.detector.label_offset)))


class _ScriptableDetector(nn.Module):
    """:class:`DetectorGraph` around a scripted torchvision detector, which returns ``(losses, detections)``."""

    def __init__(self, scripted: torch.jit.ScriptModule, label_offset: int) -> None:
        super().__init__()
        self.detector, self.label_offset = scripted, label_offset

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        found = self.detector([x[0]])[1][0]
        return found["boxes"], found["scores"], found["labels"] - self.label_offset


def check_inputs(model: Predictor, check_images: list[str] | None, count: int, same_size: bool = True
                 ) -> list[torch.Tensor]:
    """``count`` inputs of the model: from ``check_images`` (any ``predict`` source), else a run's first validation
    images as its evaluation reads them, else seeded random images of the input size; ``same_size``: all of one
    size, as a graph of fixed size takes them."""
    import sys

    if check_images:
        from bigbatch.errors import named_as
        from bigbatch.inference.sources import expand_sources

        with named_as("--check-images", instead_of="predict"):
            files = [f for f in expand_sources(check_images, lambda line: None) if not f.video][:count]
        inputs = [model.pipeline.prepare_file(f.path)[0] for f in files]
    elif model.origin.get("kind") == "run" and (inputs := _validation_inputs(model, count)) is not None:
        pass
    else:
        height, width = _input_size(model)
        print(f"note: checking on {count} random images of {width}x{height} (--check-images SOURCE: real ones)",
              file=sys.stderr, flush=True)
        inputs = list(torch.rand(count, 3, height, width, generator=torch.Generator().manual_seed(0)))
    shapes = {tuple(x.shape) for x in inputs}
    if same_size and len(shapes) != 1:
        raise UserError(f"export: the model's inputs differ in size ({sorted(shapes)[:3]}): an exported graph takes "
                        "one size (a letterboxed or cropped input)")
    if not inputs:
        raise UserError("--check-images: names no image")
    return [x.float() for x in inputs]


def _validation_inputs(model: Predictor, count: int) -> list[torch.Tensor] | None:
    """A run's first ``count`` validation images as its evaluation reads them; None (said) where its data is not
    at hand."""
    import sys

    from bigbatch.config import validate_config
    from bigbatch.tasks import build_task

    try:
        val = build_task(validate_config(model.origin["config"])).val_set
    except UserError as error:
        print(f"note: the run's validation images are not at hand ({error})", file=sys.stderr, flush=True)
        return None
    return [val[i][0].as_subclass(torch.Tensor) for i in range(min(count, len(val)))]


def _input_size(model: Predictor) -> tuple[int, int]:
    """The model's input side(s) without an image: a Darknet cfg's network size, a run's ``data.size``."""
    if hasattr(model.pipeline, "net_size"):
        return tuple(model.pipeline.net_size)
    size = model.origin["config"]["data"]["size"]
    return size, size


def write_onnx(graph: nn.Module, example: torch.Tensor, path: Path, metadata: str, opset: int,
               dynamic_batch: bool) -> None:
    import onnx

    dynamic = ({0: torch.export.Dim("batch", min=1, max=1024)},) if dynamic_batch else None
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():  # the exporter's progress lines
        program = torch.onnx.export(graph, (example,), dynamo=True, opset_version=opset, dynamic_shapes=dynamic,
                                    input_names=["images"], verbose=False)
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata
    onnx.save(proto, str(path))


def _in_one_order(found: list[torch.Tensor]) -> list[torch.Tensor]:
    """A detector's (boxes, scores, labels) sorted by score (to 1e-5: ties broken alike on both sides), then label,
    then box."""
    import numpy as np

    boxes, scores, labels = (t.detach().cpu().double() for t in found)
    keys = [boxes[:, k].round(decimals=3).numpy() for k in (3, 2, 1, 0)]
    order = np.lexsort([*keys, labels.numpy(), -scores.round(decimals=5).numpy()])
    index = torch.from_numpy(order)
    return [found[0][index], found[1][index], found[2][index]]


@contextlib.contextmanager
def nms_inputs() -> Iterator[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]]:
    """Records ``(boxes, scores, classes, iou_threshold)`` of every ``torchvision.ops.boxes.batched_nms`` call made
    inside, in order (torchvision's detectors call it as ``box_ops.batched_nms``, looked up at each call; on one image
    the last call is the NMS that gives the detections: a Faster R-CNN's RPN calls it first)."""
    from torchvision.ops import boxes as box_ops

    calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]] = []
    original = box_ops.batched_nms

    def recorded(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        calls.append((boxes.detach().clone(), scores.detach().clone(), idxs.detach().clone(), float(iou_threshold)))
        return original(boxes, scores, idxs, iou_threshold)

    box_ops.batched_nms = recorded
    try:
        yield calls
    finally:
        box_ops.batched_nms = original


def compare_detections(got: list[torch.Tensor], expected: list[torch.Tensor],
                       candidates: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None,
                       label_offset: int = 0, max_det: int | None = None) -> tuple[float, int]:
    """(the largest ``max|a - b| / max|b|`` per output, the detections that differ by a tie) between a detector's
    (boxes, scores, labels) in the file (``got``) and in PyTorch (``expected``), given the candidates of PyTorch's last
    NMS (:func:`nms_inputs`: boxes, scores, classes (the labels plus ``label_offset``), IoU threshold) and the most
    detections it keeps (``max_det``).

    Row by row, in one order (:func:`_in_one_order`), as any output is compared. Where that is over
    :data:`TOLERANCE` (or the counts differ), the file's detections must be what PyTorch's NMS keeps of its own
    candidates once scores equal to within the check's tolerance, ``TOLERANCE * max(scores)``, may come in either
    order (:func:`_replay_nms`): each of them one of PyTorch's candidates (the label; box and score to within
    :data:`TOLERANCE`, scaled as the rows are). Greedy NMS keeps the higher scored of two candidates of one class
    that overlap by more than its IoU threshold, and two scores equal to the check's own precision have no higher:
    the runtimes' rounding picks. Measured: a Faster R-CNN's two proposals 0.08 px apart (IoU 0.992 after decoding),
    class scores 0.1568665206 and 0.1568665355 in PyTorch (one float32 ulp apart) and both 0.1568665355 in
    onnxruntime, its Softmax rounding the first up: PyTorch kept one, onnxruntime the other. The difference is then
    the file's from those candidates. Anything else leaves the row-by-row difference (over the tolerance), or a
    different count, to fail the check."""
    same_shapes = all(a.shape == b.shape for a, b in zip(got, expected, strict=True))
    aligned = math.inf
    if same_shapes:
        mine, theirs = ([t.detach().double() for t in _in_one_order(found)] for found in (got, expected))
        aligned = max([(a - b).abs().max().item() / (b.abs().max().item() or 1.0) if b.numel() else 0.0
                       for a, b in zip(mine, theirs, strict=True)], default=0.0)
        if aligned <= TOLERANCE or math.isnan(aligned):
            return aligned, 0
    replayed = None if candidates is None else _replay_nms(got, expected, candidates, label_offset, max_det)
    if replayed is not None:
        return replayed
    if not same_shapes:
        raise CheckFailed(f"export: the file finds {tuple(got[0].shape)} where PyTorch finds "
                          f"{tuple(expected[0].shape)}: not written")
    return aligned, 0


def _replay_nms(got: list[torch.Tensor], expected: list[torch.Tensor],
                candidates: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float], label_offset: int,
                max_det: int | None) -> tuple[float, int] | None:
    """(:func:`compare_detections`' difference, the detections that differ) where the file's detections ``got`` are
    what greedy NMS (torchvision's ``batched_nms``: per class, the highest score first, dropping what overlaps a kept
    box by more than the IoU threshold; the first ``max_det``) keeps of PyTorch's ``candidates`` when any two scores
    at most ``TOLERANCE * max(PyTorch's scores)`` apart may be taken in either order; else None. The replay takes,
    among the candidates within that of the highest one left, one the file kept if there is one; the file's
    detections must come out, no more and no fewer."""
    import numpy as np
    from torchvision.ops import box_iou

    boxes, scores, classes, iou_threshold = (t.detach().double() if isinstance(t, torch.Tensor) else t
                                             for t in candidates)
    labels = classes - label_offset
    box_scale = (expected[0].abs().max().item() if expected[0].numel() else 0.0) or 1.0
    score_scale = (expected[1].abs().max().item() if expected[1].numel() else 0.0) or 1.0

    def which(found: list[torch.Tensor]) -> tuple[list[int], float] | None:
        """The candidate each detection is (one each), and the largest difference; None where one is none."""
        found_boxes, found_scores, found_labels = (t.detach().double() for t in found)
        far = torch.maximum((found_boxes[:, None] - boxes[None]).abs().amax(-1) / box_scale,
                            (found_scores[:, None] - scores[None]).abs() / score_scale)
        far = far.masked_fill(found_labels[:, None] != labels[None], math.inf).numpy()
        chosen: list[int] = []
        for row in far:
            row = row.copy()
            row[chosen] = math.inf
            if not len(row) or not row.min() <= TOLERANCE:
                return None
            chosen.append(int(row.argmin()))
        return chosen, max((float(far[i, c]) for i, c in enumerate(chosen)), default=0.0)

    ours, theirs = which(got), which(expected)
    if ours is None or theirs is None:
        return None
    kept_by_file = np.zeros(len(scores), bool)
    kept_by_file[ours[0]] = True
    order = scores.argsort(descending=True, stable=True).numpy()
    left = np.ones(len(scores), bool)
    values, kept = scores.numpy(), []
    slack = TOLERANCE * score_scale
    while left[order].any() and (max_det is None or len(kept) < max_det):
        waiting = order[left[order]]
        tied = waiting[values[waiting] >= values[waiting[0]] - slack]
        preferred = tied[kept_by_file[tied]]
        pick = int(preferred[0] if len(preferred) else tied[0])
        kept.append(pick)
        overlap = box_iou(boxes[pick:pick + 1], boxes)[0].numpy()
        left &= ~((labels.numpy() == labels[pick].item()) & (overlap > iou_threshold))
        left[pick] = False
    if sorted(kept) != sorted(ours[0]):
        return None
    return ours[1], len(set(ours[0]) - set(theirs[0]))


def write_onnx_traced(graph: nn.Module, example: torch.Tensor, path: Path, metadata: str) -> None:
    """A torchvision detector with its decoding, by the TorchScript-based exporter (torchvision traces its detectors'
    data-dependent steps for it: the number of candidates, NMS), at opset 17, the image's height and width free."""
    import contextlib
    import io
    import warnings

    import onnx

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's warnings on torchvision's own ONNX paths
        torch.onnx.export(graph, (example,), str(path), dynamo=False, opset_version=17, input_names=["images"],
                          output_names=["boxes", "scores", "labels"],
                          dynamic_axes={"images": {2: "height", 3: "width"}})
    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata
    onnx.save(proto, str(path))


def write_openvino(graph: nn.Module, example: torch.Tensor, path: Path, metadata: str, dynamic_batch: bool) -> None:
    """OpenVINO's IR (``path``, an ``.xml``, and its ``.bin``) by ``openvino.convert_model`` from the PyTorch module,
    fp32 weights, the metadata in its ``rt_info`` (``bigbatch/json``)."""
    import contextlib
    import io
    import tempfile
    import warnings

    import openvino

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's deprecation and shape warnings
        if isinstance(graph, DetectorGraph):  # OpenVINO reads torchvision's traced ONNX, NMS included
            with tempfile.TemporaryDirectory() as folder:
                write_onnx_traced(graph, example, Path(folder) / "detector.onnx", metadata)
                model = openvino.convert_model(str(Path(folder) / "detector.onnx"))
        else:
            model = openvino.convert_model(graph, example_input=example)
    if dynamic_batch:
        model.reshape({model.inputs[0]: openvino.PartialShape([-1, *example.shape[1:]])})
    model.set_rt_info(metadata, list(OPENVINO_METADATA))
    openvino.save_model(model, str(path), compress_to_fp16=False)


def write_torchscript(graph: nn.Module, example: torch.Tensor, path: Path, metadata: str) -> None:
    import warnings

    with torch.no_grad(), warnings.catch_warnings():  # torch 2.14 deprecates TorchScript (torch.export instead)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # sizes fixed at the input's: the export's size
        if isinstance(graph, DetectorGraph):
            compiled = graph.scripted()
        else:
            compiled = torch.jit.trace(graph, (example,), check_trace=False)
        torch.jit.save(compiled, str(path), _extra_files={METADATA_KEY: metadata})


def check_file(graph: nn.Module, path: Path, fmt: str, inputs: list[torch.Tensor], dynamic_batch: bool,
               notes: list[str] | None = None) -> float:
    """The largest ``max|a - b| / max|b|`` over the outputs between the file in its runtime and ``graph``, on
    ``inputs`` (one at a time, or all at once with a free batch); over :data:`TOLERANCE`: :class:`CheckFailed`. A
    detector's NMS ties (:func:`compare_detections`) are said in ``notes``."""
    from bigbatch.inference.runtime import onnx_session, openvino_model, torchscript_module

    run, _ = {"onnx": onnx_session, "openvino": openvino_model, "torchscript": torchscript_module}[fmt](path)
    batches = ([torch.stack(inputs)] if inputs else []) if dynamic_batch else [x[None] for x in inputs]
    worst = 0.0
    if isinstance(graph, DetectorGraph):
        from bigbatch.inference.pipelines import own_thresholds

        max_det = int(own_thresholds(graph.detector)["max_det"])
    for number, batch in enumerate(batches, 1):
        if isinstance(graph, DetectorGraph):
            with torch.no_grad(), nms_inputs() as calls:
                expected = list(graph(batch))
            got = run(batch)
            if len(got) != len(expected):
                raise CheckFailed(f"export: the file gives {len(got)} outputs, PyTorch {len(expected)}")
            difference, ties = compare_detections(got, expected, calls[-1] if calls else None,
                                                  int(graph.detector.label_offset), max_det)
            worst = difference if math.isnan(difference) else max(worst, difference)
            if ties and notes is not None:
                notes.append(f"image {number}: {ties} of the file's detections {'are' if ties > 1 else 'is'} another "
                             f"of PyTorch's NMS candidates than PyTorch kept, equal in score to {TOLERANCE:g} of the "
                             "largest (NMS keeps either; the runtimes' rounding picks): compared with that candidate")
            continue
        with torch.no_grad():
            expected = graph(batch)
        expected = expected if isinstance(expected, (list, tuple)) else [expected]
        got = run(batch)
        if len(got) != len(expected):
            raise CheckFailed(f"export: the file gives {len(got)} outputs, PyTorch {len(expected)}")
        for a, b in zip(got, expected, strict=True):
            b = getattr(b, "logits", b).float()
            if a.shape != b.shape:  # a detector's detections: as many, or the file answers otherwise
                raise CheckFailed(f"export: the file finds {tuple(a.shape)} where PyTorch finds {tuple(b.shape)}: "
                                  "not written")
            scale = b.abs().max().item() or 1.0
            difference = (a.float() - b).abs().max().item() / scale
            worst = difference if math.isnan(difference) else max(worst, difference)  # max() would drop a NaN
    if not worst <= TOLERANCE:  # NaN fails too
        raise CheckFailed(f"export: the file's outputs differ from PyTorch's by {worst:.2e} (max|a - b| / max|b|), "
                          f"more than {TOLERANCE:g}: not written")
    return worst

