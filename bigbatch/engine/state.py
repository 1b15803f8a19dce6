"""The training state: everything a run needs to go on exactly where it stopped, gathered in one object.

Each part that has a state (the model, the optimizer, the loss scaler, the weight EMA, the step with its
subdivisions reached and skipped count, every random generator, the run's progress: the position in the data
order and what its batch controller learned, the best evaluation, what the hooks learned) is read by
:meth:`TrainingState.state_dict` and restored by :meth:`TrainingState.load_state_dict` (the hooks' states are
handed to the hooks once the trainer has built them). Saving and resuming both go through them, so the
checkpoint's layout is written down once, here:

    format      ``checkpoint.FORMAT`` (checkpoints of a newer format are refused, older ones read)
    step        optimizer steps completed
    model       the model's state dict (the raw weights; ``bigbatch eval`` and exports read this key)
    ema         the weight EMA's state (``module``: its weights; ``updates``), or None
    optimizer   the optimizer's state dict
    scaler      the loss scaler's state, with its ``kind`` (``precision.loss_scale``'s name: none, static, dynamic,
                update_ratio; older checkpoints lack it, their kind is read from the keys). A resume with another
                kind starts the configured scaler fresh and says so in one line
    skipped     optimizer steps not applied (non-finite gradients) over the whole run
    rng         torch (CPU and CUDA), Python and NumPy generators: rank 0's at the top, as older checkpoints hold
                them, and every rank's in rank order under ``ranks`` (each rank draws its own dropout masks,
                ``engine/trainer.py``'s ``seed_rank``), the CUDA state of each rank's own device only. A resume on
                as many ranks restores each rank's own; on another world size each rank's generators start afresh
                from (seed, rank, step) (``checkpoint.restore_rng``)
    data        the position in the data order: step, seed, batch (the order is a function of them and of
                ``schedule.batch``), the subdivisions in effect (more than configured after an out-of-memory
                re-cut, or in a later phase of a batch schedule), the images seen (for the record; absent in
                older checkpoints), an adaptive batch's changes (``grown``): step, images and grown are the
                progress's (``engine/progress.py``), and the world size and planned micro-batch it was cut to (a
                resume on another world size keeps the micro-batch: ``engine/relaunch.py``; absent in older
                checkpoints)
    best        the best evaluation so far: metric, mode, value, step
    hooks       what the hooks learned, by hook name (``engine/hooks/base.py``: the noise scale's averages, the
                memory log's baseline), and the batch controller's state under its ``state_key`` (AdaScale's:
                ``adascale``); absent in older checkpoints, whose runs resume with fresh hooks
    config      the resolved run config (JSON)
    classes     the names of the model's classes, in label order (``bigbatch predict`` and ``bigbatch.load`` name
                what they find without the data); absent in older checkpoints

The file is read with ``torch.load(weights_only=True)`` (``engine/checkpoint.py``): plain containers and tensors.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.nn as nn

from bigbatch.config import RunConfig
from bigbatch.engine import checkpoint
from bigbatch.errors import TrainingStopped, UserError
from bigbatch.floor import files, run_files
from bigbatch.largebatch.optim import apply_settings, group_settings

if TYPE_CHECKING:
    from bigbatch.engine.hooks.base import Hooks
    from bigbatch.engine.progress import Progress
    from bigbatch.engine.step import TrainStep
    from bigbatch.largebatch.ema import WeightEMA


@dataclass
class Best:
    """The best evaluation so far, by one metric."""

    metric: str
    mode: str
    value: float | None = None
    step: int | None = None

    def improves(self, value: float) -> bool:
        """Whether ``value`` is better than the best so far. A NaN (a diverged evaluation) is never the best, and a
        NaN best (a checkpoint of a version that kept one) gives way to any number: every comparison with NaN is
        false, so a first NaN used to stay the best for the whole run."""
        if math.isnan(value):
            return False
        if self.value is None or math.isnan(self.value):
            return True
        return value > self.value if self.mode == "max" else value < self.value


class CheckpointWriteFailed(TrainingStopped):
    """A checkpoint could not be written (the disk full, ...): the message names the file, the checkpoint kept whole
    (``atomic_write``: the previous file is untouched, the temporary one removed) and the command that resumes."""


class TrainingState:
    """The state of a run's parts: ``state_dict()`` is a checkpoint, ``load_state_dict()`` resumes from one."""

    def __init__(self, cfg: RunConfig, model: nn.Module, train_step: TrainStep, ema: WeightEMA | None,
                 progress: Progress, classes: list[str] | None = None) -> None:
        self.cfg = cfg
        self.classes = classes
        """The class names, in label order (the task's)."""
        self.progress = progress
        """The run's progress: the step, the plan with its batch changes, the batch controller's state."""
        self.model = model
        """The bare model (never the DDP wrapper): its state dict keys carry no ``module.`` prefix."""
        self.train_step = train_step
        """Owns the optimizer, the loss scaler, the subdivisions in effect and the skipped count."""
        self.ema = ema
        self.best = Best(cfg.eval.metric, cfg.eval.better)
        self.hooks: Hooks | None = None
        """The run's hooks, once built (the trainer sets them): their states are a checkpoint's ``hooks``."""
        self.writer = checkpoint.BackgroundWriter()
        """Writes the checkpoints off the training thread (``finish_writes`` waits for them)."""
        self._saved: tuple[int, Path, memoryview] | None = None  # (step, path, bytes) of this step's last save
        self._identities: dict[Path, tuple[int, int, int, int]] = {}  # of each file as the writer left it
        self._steps: dict[Path, int] = {}  # the step of each file as the writer left it (or the resume read it)
        self.resume_notes: list[str] = []
        """What a resume changed from the checkpoint, one line each, said after the run's ``resumed from`` line."""
        self.hook_states: dict[str, Any] = {}
        """The hooks' states a resumed checkpoint holds, by hook name: read before the hooks exist, handed to them
        by the trainer once they are built."""

    def state_dict(self, rng: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The checkpoint. ``rng``: every rank's generator states, in rank order (``save`` gathers them); None: this
        process's alone."""
        step, owned = self.train_step, self.progress.state_dict()
        hooks = self.hooks.state_dict() if self.hooks is not None else dict(self.hook_states)
        controller = self.progress.controller_state()
        if controller is not None:  # kept where the AdaScale hook kept it, after the hooks before it
            hooks[controller[0]] = controller[1]
        return {
            "format": checkpoint.FORMAT,
            "step": owned["step"],
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizer": step.optimizer.state_dict(),
            "scaler": step.scaler.state_dict(),
            "skipped": step.skipped,
            "rng": checkpoint.rng_part(rng if rng is not None else [checkpoint.rng_state()]),
            "data": {"step": owned["step"], "seed": self.cfg.seed, "batch": self.cfg.batch,
                     "subdivisions": step.subdivisions, "split": step.split,
                     # how the batch was cut: a resume on another world size keeps the micro-batch (relaunch.py)
                     "world": self.progress.plan.world, "micro_batch": self.progress.plan.micro_batch,
                     **{key: value for key, value in owned.items() if key != "step"}},
            "best": vars(self.best).copy(),
            "hooks": hooks,
            "config": self.cfg.model_dump(mode="json"),
            "classes": list(self.classes) if self.classes is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore every part from a checkpoint read by ``checkpoint.load(path, checkpoint.RESUME_KEYS)``; a
        checkpoint that does not fit this config is one ``UserError`` naming the key to change."""
        check_resumable(self.cfg, state["config"])
        self._saved = None  # a file written before is not this state
        load_weights(self.model, state["model"], "model")
        step = self.train_step
        configured = group_settings(step.optimizer)
        try:
            step.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise UserError(f"optim: the checkpoint's optimizer state does not fit this config ({e}): its parameter "
                            "groups split the parameters otherwise (optim.no_decay_norm_bias, optim.weight_decay 0 or "
                            "not, optim.backbone_lr_scale 1 or not, another optim.name, or a timm model's "
                            "no_weight_decay() names, exempt since 2026-12-06); resume with the run's own settings, "
                            "or start from its weights (model.weights)") from None
        changed = apply_settings(step.optimizer, configured)  # the checkpoint's buffers, this config's settings
        if changed:
            self.resume_notes.append(f"optim: this config's settings replace the checkpoint's: {', '.join(changed)}")
        note = step.scaler.resume(state["scaler"])  # None: loaded; else why this run's scaler starts fresh
        if note is not None:
            self.resume_notes.append(f"precision.loss_scale: {note}")
        data = state["data"]
        hooks = state.get("hooks", {})  # absent in checkpoints written before hooks kept state: they start fresh
        if not isinstance(hooks, dict):
            raise UserError(f"checkpoint: 'hooks' is a {type(hooks).__name__}, not a dict")
        self.progress.load_state_dict(data, hooks)
        split, saved_micro = data.get("split"), data.get("micro_batch")
        if isinstance(saved_micro, int) and saved_micro != self.progress.plan.micro_batch:
            split = 1  # a micro-batch other than the checkpoint's asked for (--set subdivisions=...): it replaces the
            # out-of-memory re-cut, which a relaunch on another world size, keeping the micro-batch, keeps
        step.load_state_dict({"skipped": state["skipped"],
                              "subdivisions": data.get("subdivisions", self.progress.plan.subdivisions),
                              "split": split if isinstance(split, int) and not isinstance(split, bool) else None},
                             self.progress.step_plan())
        if self.ema is not None:
            if state.get("ema") is None:
                raise UserError("ema.decay: the checkpoint has no weight EMA to resume; unset ema.decay")
            self.ema.load_state_dict(state["ema"])
        checkpoint.restore_rng(state["rng"], self.cfg.seed, state["step"])
        self.best = Best(**state["best"])
        self.hook_states = hooks

    def save(self, path: Path, may_link: bool = False) -> None:
        """Write the state to ``path`` atomically (a crash leaves the previous file whole), on the writer's thread:
        the state is serialized now, the bytes reach the disk while training goes on (``finish_writes``).

        Under torchrun every rank calls it (the hooks do, at the same step): each rank's generator states are gathered
        to rank 0 (a collective), which alone writes; the other ranks return once theirs are sent.

        ``may_link``: the caller knows nothing changed the state since the last save of this step (``last.pt`` right
        after ``best.pt``, hooks/checkpointing.py): that file, if it is still the one written and the filesystem has
        hard links, gets ``path`` as a second name instead of the same bytes written again."""
        rng = checkpoint.gathered_rng_states()
        if rng is None:  # not rank 0: its part, its generators' states, is with rank 0 now
            return
        saved = self._saved
        if saved is not None and saved[0] != self.progress.step:
            saved = self._saved = None  # the bytes of the last save serve a link at the same step only: let them go
        step = self.progress.step
        if may_link and saved is not None and saved[1] != path:
            source, data = saved[1], saved[2]

            def write() -> None:  # after the source's own write (the writer keeps the order)
                if not files.atomic_link(source, path, self._identities.get(source)):
                    self._write(path, data)
        else:
            data = checkpoint.serialized(self.state_dict(rng))

            def write() -> None:
                self._write(path, data)

        def job() -> None:
            try:
                write()
            except OSError as e:  # the disk full, gone, read-only: one line, not the writer thread's traceback
                raise self._failed(path, e) from None
            self._steps[path] = step

        self._saved = (step, path, data)
        self.writer.submit(job)

    def _write(self, path: Path, data: memoryview) -> None:
        files.atomic_write(path, lambda f: f.write(data))
        self._identities[path] = files.identity(path)

    def _failed(self, path: Path, error: OSError) -> CheckpointWriteFailed:
        """What a failed write of the checkpoint ``path`` says: the file and why, the run's last checkpoint kept
        whole (``atomic_write`` never leaves part of one) and the command that resumes from it."""
        from bigbatch.engine.run_dir import run_dir_of

        failed = f"checkpoint: cannot write {path}: {error.strerror or error}"
        last = path.parent / run_files.LAST
        run_dir = run_dir_of(path)
        resume = (f"; resume with: bigbatch train --resume {shlex.quote(str(run_dir))}" if run_dir is not None
                  else "")
        if last in self._steps:
            return CheckpointWriteFailed(f"{failed}; kept: {last} at step {self._steps[last]}, intact{resume}")
        if last.is_file():  # a file this run did not write (train called on a folder holding one): left as it was
            return CheckpointWriteFailed(f"{failed}; {last}, written before this run, is left as it was")
        return CheckpointWriteFailed(f"{failed}; no checkpoint had been written yet, so nothing is kept: the same "
                                     f"command starts the run again")

    def finish_writes(self, failing: bool = False) -> None:
        """Wait until every checkpoint saved so far is on disk. A failed write is raised, unless the run is
        ``failing`` already: then it is printed as a warning, so that the run's own error is the one the user sees."""
        try:
            self.writer.wait()
        except Exception as e:
            if not failing:
                raise
            print(f"warning: a checkpoint write failed: {e}", file=sys.stderr, flush=True)

    def written_step(self, path: Path) -> int | None:
        """The step of the checkpoint at ``path`` as this process last wrote it (or resumed from it), None where it
        wrote none there: after :meth:`finish_writes`, what is on the disk, a failed write not counted."""
        return self._steps.get(path)

    def resume(self, path: Path) -> None:
        state = checkpoint.load(path, checkpoint.RESUME_KEYS)
        self.load_state_dict(state)
        self._steps[path] = state["step"]


def check_resumable(cfg: RunConfig, saved: dict[str, Any]) -> None:
    """The data order depends on the seed and the global batch: resuming must keep both (an adaptive batch: its
    whole ``batch: {mode: adaptive, ...}``)."""
    dumped = cfg.model_dump(mode="json")
    for key in ("batch", "seed"):
        if saved.get(key) != dumped[key]:
            raise UserError(f"{key}: the checkpoint was trained with {key} {saved.get(key)}, not {dumped[key]}; "
                            f"resuming needs the same {key}")


def load_weights(model: nn.Module, state: dict[str, Any], key: str) -> None:
    """Load a state dict; a checkpoint of another architecture is a user mistake naming ``key``."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{key}: the checkpoint does not fit this model ({files.mismatch_detail(e)})") from None
