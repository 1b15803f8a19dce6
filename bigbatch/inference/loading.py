"""``bigbatch.load``: a trained model from a run directory, a checkpoint, or a Darknet ``.cfg`` with its weights.

- **A run directory or a checkpoint** (``checkpoints/last.pt`` of the run by default, as ``bigbatch eval``): the
  checkpoint's config (with the files the run kept, such as its Darknet cfg) builds the model (``Task.model_for``)
  for the class names the checkpoint keeps; older checkpoints without them have their names read from the run's
  data. The weights are those ``eval`` uses (the EMA's when the run kept one and ``ema.evaluate``), or as
  ``weights_from`` says (``ema`` or ``raw``). The preprocessing is the run's evaluation transform, the thresholds
  its detector's own, except ``conf``.
- **A model file** of a kind registered in ``registry.MODEL_FILES``, by suffix: a Darknet ``.cfg`` with ``weights``
  (``darknet/predict.py``: the network at its ``[net]`` size, or ``size``, run as Darknet's ``detector test`` runs
  it; class names from ``names``, a ``.names`` file or a ``.data`` file's ``names=``, else the class numbers).
- **An ONNX file** comes with ``bigbatch export --format onnx``, which this version does not have yet: one line.

Defaults: ``conf`` 0.25, as Darknet's ``detector test`` and Ultralytics' ``predict``; ``iou`` and ``max_det`` the
model's own, as ``bigbatch eval`` runs it (a Darknet cfg: ``detector test``'s 0.45, and 100).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from bigbatch.errors import UserError
from bigbatch.inference.pipelines import CONF, EvalClassification, EvalDetection, Settings, own_thresholds
from bigbatch.inference.predictor import Predictor
from bigbatch.registry import MODEL_FILES

EXPORTED_SUFFIXES = (".onnx", ".torchscript", ".xml")
"""Files ``bigbatch export --format onnx|torchscript|openvino`` writes, run in their own runtime
(``inference/runtime.py``)."""

MAX_CLASSES = 2**16
"""The most class names a checkpoint may give (a Darknet names file's bound), checked before a model is built for them:
each is an output of the model's head."""


def load(source: str | os.PathLike, weights: str | os.PathLike | None = None, weights_from: str | None = None,
         names: str | os.PathLike | None = None, device: str | torch.device | None = None,
         size: int | None = None, letterbox: bool | None = None, overrides: list[str] | None = None,
         dialect: str | None = None) -> Predictor:
    """A :class:`~bigbatch.inference.predictor.Predictor` for ``source`` (see the module docstring): a run directory,
    a bigbatch checkpoint, or a Darknet ``.cfg`` (with ``weights``, ``names``, ``size``, ``letterbox``: None for the
    cfg's ``letter_box``; ``dialect``: ``alexeyab``, the default, or ``pjreddie``, whose ``detector test`` it
    follows). ``device``: ``cuda`` where there is one, else ``cpu``. ``overrides``: ``--set`` overrides
    of a run's config (as ``bigbatch eval`` takes them)."""
    path = Path(source)
    try:
        device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as error:
        raise UserError(f"--device: {device!r} is not a device ({error})") from None
    if device.type not in ("cpu", "cuda"):  # mps, xpu, meta, ...: not what bigbatch predicts on
        raise UserError(f"--device: {device} is not a device bigbatch predicts on (cpu, cuda or cuda:N)")
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise UserError(f"--device: {device} is not on this machine ({torch.cuda.device_count()} CUDA devices)")
    if weights_from not in (None, "ema", "raw"):
        raise UserError(f"--weights-from: expected ema or raw, not {weights_from!r}")
    if path.suffix.lower() in EXPORTED_SUFFIXES:
        if any(v is not None for v in (weights, names, weights_from, size, letterbox, dialect)) or overrides:
            raise UserError(f"--from: {path} is an exported model: it carries its weights, classes and preprocessing "
                            "(no --weights, --names, --weights-from, --size, --darknet-dialect or --set)")
        from bigbatch.inference.runtime import load_exported

        return load_exported(path, device)
    if path.suffix.lower() in MODEL_FILES.names():
        if weights_from is not None:
            raise UserError("--weights-from: chooses a run's weights; a .cfg takes --weights W.weights")
        if overrides:
            raise UserError("--set: overrides a run's config; a .cfg takes --size, --weights and --names")
        return MODEL_FILES.get(path.suffix.lower()).obj(path, weights, names, device, size, letterbox,
                                                        dialect or "alexeyab")
    for key, value in (("--weights", weights), ("--names", names), ("--darknet-dialect", dialect)):
        if value is not None:
            raise UserError(f"{key}: for a Darknet .cfg; a run or checkpoint carries its weights and class names")
    if size is not None or letterbox is not None:
        raise UserError("--size: for a Darknet .cfg; a run predicts at its evaluation size (--set data.size=N)")
    return load_run(path, weights_from, device, overrides or [])


def load_run(path: Path, weights_from: str | None, device: torch.device, overrides: list[str]) -> Predictor:
    """A run directory's last checkpoint, or a checkpoint file (see the module docstring)."""
    from bigbatch.config import apply_overrides, validate_config
    from bigbatch.engine import checkpoint
    from bigbatch.engine.run_dir import kept_overrides, last_checkpoint, run_checkpoint, run_dir_of
    from bigbatch.engine.state import load_weights
    from bigbatch.largebatch.ema import counted_weights
    from bigbatch.registry import MODELS, TASKS
    from bigbatch.telemetry.capacity import check_capacity

    if not path.exists():
        raise UserError(f"--from: {path} does not exist (expected a run directory, a checkpoint or a Darknet .cfg)")
    if path.is_dir():
        run_checkpoint(path, "--from")  # a run's checkpoint is read only from inside it
        path = last_checkpoint(path)
        if not path.is_file():
            raise UserError(f"--from: {path.parent.parent} has no {path.parent.name}/{path.name}: not a run "
                            "directory with a checkpoint")
    state = checkpoint.load(path, checkpoint.EVAL_KEYS)
    run_dir = run_dir_of(path)
    kept = kept_overrides(run_dir, state["config"]) if run_dir is not None else []
    cfg = validate_config(apply_overrides(state["config"], [*kept, *overrides]))
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"weights": None})})  # the checkpoint's
    task = TASKS.get(cfg.task).obj
    classes = state.get("classes")
    if classes is None:
        classes = _classes_from_data(cfg)
    if not (isinstance(classes, list) and 1 <= len(classes) <= MAX_CLASSES
            and all(isinstance(name, str) for name in classes)):
        raise UserError(f"--from: {path}: 'classes' is not a list of 1 to {MAX_CLASSES:,} class names")
    check_capacity(cfg)
    module = task.model_for(cfg, classes)
    if weights_from == "ema" and not isinstance(state.get("ema"), dict):
        raise UserError(f"--weights-from: {path} holds no EMA weights (the run kept none); use raw")
    if weights_from is None:
        chosen, use_ema = counted_weights(state, cfg)
    else:
        use_ema = weights_from == "ema"
        chosen = state["ema"]["module"] if use_ema else state["model"]
    load_weights(module, chosen, "model")
    module.to(device)
    described = f"{'EMA' if use_ema else 'raw'} weights of {path} (step {state['step']})"
    keeps = MODELS.get(cfg.model.name).info.get("keeps") or {}
    origin = {"kind": "run", "config": cfg.model_dump(mode="json"),
              "kept": {key: text_of(module) for key, text_of in keeps.items()}}
    if cfg.task == "detection":
        thresholds = own_thresholds(module)
        settings = Settings(conf=CONF, iou=thresholds["iou"], max_det=thresholds["max_det"], batch=cfg.eval.batch)
        return Predictor(module, classes, EvalDetection(task.image_input(cfg)), settings, described, origin)
    settings = Settings(conf=CONF, iou=0.0, max_det=1, batch=cfg.eval.batch)
    return Predictor(module, classes, EvalClassification(task.image_input(cfg)), settings, described, origin)


def _classes_from_data(cfg: Any) -> list[str]:
    """The class names of a checkpoint that does not keep them (written before they were kept): the run's data."""
    import sys

    from bigbatch.tasks import build_task

    print("note: the checkpoint keeps no class names (an older one): reading them from the run's data",
          file=sys.stderr, flush=True)
    return list(build_task(cfg).class_names)
