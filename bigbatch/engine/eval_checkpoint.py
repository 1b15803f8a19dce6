"""``bigbatch eval``: one checkpoint (or a run directory's last one) evaluated on the validation set.

The weights evaluated are those that count (``largebatch.ema.counted_weights``: the EMA's when the run keeps one and
``ema.evaluate``, else the raw ones), with the checkpoint's config and any ``--set`` overrides. The record (the
checkpoint, its step, which weights, the metrics) is written as JSON where :func:`eval_record_path` says; a detector's
detections can also be saved as a COCO results file, recorded as bigbatch's as it is written (``floor/written.py``).
Every output is checked before any work, and nothing bigbatch did not write is overwritten.
"""

from __future__ import annotations

import json
from pathlib import Path

from bigbatch.errors import UserError
from bigbatch.floor import run_files, written


def evaluate_checkpoint(path: Path, overrides: list[str], save_detections: Path | None = None) -> None:
    """Evaluate the checkpoint at ``path`` (a run directory: its ``checkpoints/last.pt``), printing the weights
    used, the metrics and where the record went; ``save_detections``: also write the detections there."""
    from bigbatch.config import apply_overrides, validate_config
    from bigbatch.engine import checkpoint
    from bigbatch.engine.run_dir import kept_overrides, last_checkpoint, run_checkpoint, run_dir_of
    from bigbatch.engine.state import load_weights
    from bigbatch.floor import distributed, files
    from bigbatch.floor.outputs import check_output_file, probe_writable
    from bigbatch.largebatch.ema import counted_weights
    from bigbatch.registry import TASKS
    from bigbatch.tasks import build_task
    from bigbatch.telemetry.capacity import check_capacity

    if path.is_dir():
        run_checkpoint(path, "eval")  # a run's checkpoint is read only from inside it
        path = last_checkpoint(path)
    out = eval_record_path(path)
    probe_writable(out.parent, "eval")
    if save_detections is not None:
        check_output_file(save_detections, "--save-detections", ours=is_results_file, what=NOT_OURS)
    state = checkpoint.load(path, checkpoint.EVAL_KEYS)
    run_dir = run_dir_of(path)
    kept = kept_overrides(run_dir, state["config"]) if run_dir is not None else []  # a run's cfg, kept in it
    cfg = validate_config(apply_overrides(state["config"], [*kept, *overrides]))
    check_capacity(cfg, distributed.world_size_from_env())
    task = build_task(cfg)
    if save_detections is not None and task.prediction_format is None:
        kind = TASKS.get(cfg.task).info.get("model_kind", cfg.task)
        raise UserError(f"--save-detections: the checkpoint is a {kind}; detections exist for detectors only")
    model = task.build_model(cfg)
    weights, use_ema = counted_weights(state, cfg)
    load_weights(model, weights, "model")
    images = f"{len(task.val_set)} validation image{'' if len(task.val_set) == 1 else 's'}"
    print(f"weights  {'EMA' if use_ema else 'raw'} from {path}; evaluating {images}", flush=True)
    metrics, predictions = task.predict(model, cfg.eval.batch, progress=True)
    if save_detections is not None:
        with written.recorded(save_detections):  # the task's atomic write records the file it makes
            task.save_predictions(save_detections, predictions)
        note = getattr(task, "predictions_note", "")  # how the saved categories are numbered
        print(f"{len(predictions)} detections written to {save_detections} ({task.prediction_format} format"
              f"{', ' + note if note else ''})")
    record = {"checkpoint": str(path), "step": state["step"], "split": "val", "weights": "ema" if use_ema else "raw",
              **metrics}
    print(task.report(metrics))
    files.atomic_write(out, lambda f: f.write(json.dumps(record, indent=2) + "\n"), mode="w", record=True)
    print(f"written to {out}")


def _run_record(out: Path) -> bool:
    """Whether ``out``, ``eval-<name>.json`` of a run folder, is a regular file (not a link) of a folder bigbatch
    wrote (``run_dir.is_bigbatch_run``): its name in such a folder is bigbatch's, as ``config.yaml``'s is, also in a
    copy of the run (whose files no record of ``written.py`` names)."""
    from bigbatch.engine.run_dir import is_bigbatch_run

    return out.is_file() and not out.is_symlink() and is_bigbatch_run(out.parent)


NOT_OURS = "bigbatch did not write it, or it changed since: remove it or choose another path"
"""Why an existing ``--save-detections`` file is refused."""


def is_results_file(path: Path) -> bool:
    """Whether ``path`` is a COCO results file ``eval --save-detections`` wrote, unchanged since: its record
    (``written.is_ours``) matches. Its content proves nothing: detectron2's and Ultralytics' results files start
    ``[{"image_id": `` too. Such a file may be replaced by the next one; anything else is the user's."""
    return written.is_ours(path)


def eval_record_path(path: Path) -> Path:
    """Where ``eval`` writes its record: ``eval-<name>.json`` in the run of ``checkpoints/<name>.pt``, else
    ``<checkpoint>.eval.json`` beside it. A file already there is replaced only if it is an earlier record of
    ``eval``, unchanged since (``written.is_ours``), or ``eval-<name>.json`` in a folder bigbatch wrote (a run, or a
    copy of one); anything else is the user's and stops ``eval`` before any work."""
    in_run = path.parent.name == run_files.CHECKPOINTS
    out = path.parent.parent / f"eval-{path.stem}.json" if in_run else path.with_suffix(".eval.json")
    if out.exists() or out.is_symlink():
        if not (written.is_ours(out) or in_run and _run_record(out)):  # its content proves nothing
            raise UserError(f"eval: {out} exists and is not a record bigbatch eval wrote; bigbatch never overwrites "
                            f"a file it did not create: move it away first")
    return out
