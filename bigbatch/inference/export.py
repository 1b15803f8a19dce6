"""``bigbatch export SOURCE --format onnx|torchscript --out FILE``: a trained model out of PyTorch, checked in its own
runtime before it is written.

What is exported is the part of the model with weights, from a decoded image's input tensor ``[N, 3, H, W]`` (the
run's evaluation transform, or Darknet's ``detector test`` preprocessing, applied outside the graph):

- a classifier (``small_cnn``, torchvision's and timm's, a Darknet classifier): the logits ``[N, classes]``;
  Inception's auxiliary head is not in the graph (eval mode);
- a Darknet detector (a run of ``model.name: darknet``, or a ``.cfg`` with ``--weights``): the network's raw outputs,
  the input of each ``[yolo]`` layer; ``predict`` decodes them as it decodes the PyTorch model's.

torchvision's detectors (FCOS, Faster R-CNN...) are refused in one line: their decoding depends on the data, and
their raw heads are not exported yet.

- **ONNX**: ``torch.onnx.export(dynamo=True)``, torch 2.14's default exporter (``torch.export``, then onnxscript), at
  opset 18 (``--opset``: 18 to :data:`MAX_OPSET`); ``--dynamic-batch`` leaves the batch dimension free.
- **TorchScript**: ``torch.jit.trace``.

The file's metadata (ONNX ``metadata_props``, TorchScript's extra files) holds ``bigbatch.json``: the task, the class
names, the input shape and what rebuilds the predictor around the graph (``inference/runtime.py``), so that
``bigbatch predict --from FILE`` and ``bigbatch.load(FILE)`` use it alone.

Every export is checked: the file is loaded in its runtime (onnxruntime on the CPU; TorchScript) and run on ``--check``
images (a run's first validation images, or ``--check-images SOURCE``; seeded random inputs otherwise, said so); the
largest difference from PyTorch, ``max|a - b| / max|b|`` per output, must be at most :data:`TOLERANCE`. The file is
written to a temporary name beside ``--out`` and given its name (a hard link, which never replaces a file) only once
it has passed; a failed check leaves no file and exits 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn

from bigbatch.errors import UserError
from bigbatch.inference.predictor import Predictor
from bigbatch.inference.runtime import METADATA_FORMAT, METADATA_KEY, MISSING

FORMATS = {"onnx": ".onnx", "torchscript": ".torchscript"}
"""The formats and the suffix each file must have (``predict --from`` knows a file by it)."""
OPSET = 18
MAX_OPSET = 23
TOLERANCE = 1e-4
"""The largest ``max|a - b| / max|b|`` per output between the runtime and PyTorch, in fp32."""
MAX_CHECK = 256


class CheckFailed(Exception):
    """The exported file answers differently from PyTorch (exit 1; the file is not written)."""


def export_model(source: Path, fmt: str, out: Path, weights: Path | None = None, names: Path | None = None,
                 size: int | None = None, dynamic_batch: bool = False, opset: int | None = None, check: int = 8,
                 check_images: list[str] | None = None) -> list[str]:
    """Export ``source`` (a run directory, a checkpoint, a ``.cfg`` with ``weights``) to ``out`` in ``fmt``, checked
    (see the module docstring); -> the lines to print."""
    from bigbatch.floor.outputs import check_output_file
    from bigbatch.inference.loading import load

    if fmt == "tensorrt":
        import torch.cuda

        found = torch.cuda.is_available()
        raise UserError("--format tensorrt: needs a CUDA device and the tensorrt package" + (
            "; TensorRT engines are not written by this version yet" if found else " (no CUDA device here)"))
    if fmt == "openvino":
        raise UserError("--format openvino: not written by this version yet; export --format onnx, which OpenVINO "
                        "reads (openvino.convert_model)")
    if fmt not in FORMATS:
        raise UserError(f"--format: expected one of {', '.join(FORMATS)}, not {fmt!r}")
    if out.suffix.lower() != FORMATS[fmt]:
        raise UserError(f"--out: a {fmt} file is named *{FORMATS[fmt]} (predict --from knows it by that), not {out}")
    opset = OPSET if opset is None else opset
    if not OPSET <= opset <= MAX_OPSET:
        raise UserError(f"--opset: the dynamo exporter writes opsets {OPSET} to {MAX_OPSET}, not {opset}")
    if not 0 <= check <= MAX_CHECK:
        raise UserError(f"--check: expected 0 to {MAX_CHECK} images, got {check}")
    check_output_file(out, "--out")
    if fmt == "onnx":
        _require_onnx()
    model = load(source, weights=weights, names=names, size=size, device="cpu")
    graph = exported_part(model)
    inputs = check_inputs(model, source, check_images, max(check, 1))
    example = inputs[:1] if not dynamic_batch else inputs[:2]
    metadata = json.dumps({"format": METADATA_FORMAT, "task": model.task, "classes": model.classes,
                           "input": list(inputs.shape[1:]), "batch": None if dynamic_batch else 1,
                           "origin": model.origin,
                           "exporter": f"torch.onnx.export(dynamo=True), opset {opset}" if fmt == "onnx"
                           else "torch.jit.trace"})
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        if fmt == "onnx":
            write_onnx(graph, example, tmp, metadata, opset, dynamic_batch)
        else:
            write_torchscript(graph, example, tmp, metadata)
        worst = check_file(graph, tmp, fmt, inputs[:check] if check else inputs[:0], dynamic_batch)
        try:
            os.link(tmp, out)  # never over a file: one that appeared meanwhile stops it
        except FileExistsError:
            raise UserError(f"--out: {out} exists; bigbatch does not overwrite it (choose a new file)") from None
    finally:
        if tmp.exists():
            tmp.unlink()  # the temporary name made above, by this process
    shown = f"{worst:.2e}" if check else "not checked (--check 0)"
    return [f"{fmt} written to {out} ({out.stat().st_size:,} bytes; {model.task}, {len(model.classes)} classes, input "
            f"{'N' if dynamic_batch else 1} x {' x '.join(map(str, inputs.shape[1:]))})",
            f"checked in {'onnxruntime' if fmt == 'onnx' else 'TorchScript'} on {min(check, len(inputs))} images: "
            f"largest difference from PyTorch {shown} (max|a - b| / max|b|, at most {TOLERANCE:g})"]


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UserError(MISSING.format(what="export --format onnx")) from None


def exported_part(model: Predictor) -> nn.Module:
    """The module the file holds: a classifier whole, a Darknet detector's network (see the module docstring)."""
    if model.task == "classification":
        return model.module.eval()
    network = getattr(model.module, "network", None)
    if network is None:
        raise UserError("--format: torchvision's detectors are not exported yet (their decoding depends on the data, "
                        "and their raw heads are the next step); Darknet detectors and every classifier are")
    return network.eval()


def check_inputs(model: Predictor, source: Path, check_images: list[str] | None, count: int) -> torch.Tensor:
    """``count`` inputs of the model, stacked: from ``check_images`` (any ``predict`` source), else a run's first
    validation images as its evaluation reads them, else seeded random images of the input size."""
    import sys

    if check_images:
        from bigbatch.inference.sources import expand_sources

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
    if len(shapes) != 1:
        raise UserError(f"export: the model's inputs differ in size ({sorted(shapes)[:3]}): an exported graph takes "
                        "one size (a letterboxed or cropped input)")
    return torch.stack(inputs).float()


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


def write_torchscript(graph: nn.Module, example: torch.Tensor, path: Path, metadata: str) -> None:
    import warnings

    with torch.no_grad(), warnings.catch_warnings():  # torch 2.14 deprecates TorchScript (torch.export instead)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # sizes fixed at the input's: the export's size
        traced = torch.jit.trace(graph, (example,), check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={METADATA_KEY: metadata})


def check_file(graph: nn.Module, path: Path, fmt: str, inputs: torch.Tensor, dynamic_batch: bool) -> float:
    """The largest ``max|a - b| / max|b|`` over the outputs between the file in its runtime and ``graph``, on
    ``inputs`` (one at a time, or all at once with a free batch); over :data:`TOLERANCE`: :class:`CheckFailed`."""
    from bigbatch.inference.runtime import onnx_session, torchscript_module

    run, _ = onnx_session(path) if fmt == "onnx" else torchscript_module(path)
    batches = ([inputs] if len(inputs) else []) if dynamic_batch else [x[None] for x in inputs]
    worst = 0.0
    for batch in batches:
        with torch.no_grad():
            expected = graph(batch)
        expected = expected if isinstance(expected, (list, tuple)) else [expected]
        got = run(batch)
        if len(got) != len(expected):
            raise CheckFailed(f"export: the file gives {len(got)} outputs, PyTorch {len(expected)}")
        for a, b in zip(got, expected, strict=True):
            b = getattr(b, "logits", b).float()
            scale = b.abs().max().item() or 1.0
            worst = max(worst, (a.float() - b).abs().max().item() / scale)
    if not worst <= TOLERANCE:  # NaN fails too
        raise CheckFailed(f"export: the file's outputs differ from PyTorch's by {worst:.2e} (max|a - b| / max|b|), "
                          f"more than {TOLERANCE:g}: not written")
    return worst

