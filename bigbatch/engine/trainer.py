"""The training loop, top to bottom.

    the batch layout: auto resolved, checked                 engine/preflight.py: resolve_batch (the CLI's, else here)
    the task's data, then the plan: the length in steps     tasks/, batching.py: make_plan
    parts: model, optimizer, scaler, EMA, schedule          engine/parts.py
    progress: the plan in effect, the steps done            engine/progress.py (its batch controller decides)
    state: everything a checkpoint holds                     engine/state.py
    for step in steps:                                       data/pipeline/loader.py: this device's micro-batches
        the step's batch and LR gain                         engine/controllers/ (fixed, scheduled, adaptive)
        set the LR to gain x lr(schedule step)               largebatch/schedule.py
        one optimizer step over the micro-batches            engine/step.py (accumulation, retries, EMA)
        progress.end_step: counted, the controller told      engine/progress.py
        hooks, stage by stage: prepare, measure, record,     engine/hooks/ (base.py: the stages, build_hooks)
               evaluate, checkpoint, guard, write

Everything besides the step and the progress is a hook (``engine/hooks/base.py``): the loop only moves the data,
the progress and the state.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigbatch.batching import BatchLayout, make_plan
from bigbatch.config import RunConfig, config_to_yaml
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import order_of
from bigbatch.engine import host_memory
from bigbatch.engine.controllers.base import BatchController, build_controller
from bigbatch.engine.events import EventStorage, Record
from bigbatch.engine.hooks import Hook, build_hooks
from bigbatch.engine.hooks.base import Hooks, every_steps
from bigbatch.engine.parts import build_parts
from bigbatch.engine.phases import PhaseClock
from bigbatch.engine.preflight import resolve_batch
from bigbatch.engine.progress import Progress
from bigbatch.engine.relaunch import relaunch
from bigbatch.engine.run import LastCheckpoint, Run
from bigbatch.engine.run_dir import check_run_files, claim, keep_model_files, set_aside_unrecorded_best
from bigbatch.engine.state import Best, TrainingState
from bigbatch.engine.step import Interrupted, Terminated, TrainStep
from bigbatch.floor import collector, distributed, files, run_files
from bigbatch.largebatch.optim import set_lr
from bigbatch.tasks import build_task


@dataclass
class TrainResult:
    out_dir: Path
    steps: int
    metrics: dict[str, float]
    best: Best
    memory: dict[str, float]
    """Peak memory (MiB) seen by the sampler: RSS, system, swap, CUDA."""
    report: str = ""
    """The task's printed summary of the final metrics."""


def train(cfg: RunConfig, out_dir: Path, resume: bool = False, hooks: Sequence[Hook] = (),
          layout: BatchLayout | None = None) -> TrainResult:
    """Train ``cfg`` into ``out_dir`` (``resume``: from its ``checkpoints/last.pt``); ``hooks``: hooks of the
    caller's own, beside the registered ones, placed by the stage each declares (``engine/hooks/base.py``).
    ``layout``: the batch layout ``engine/preflight.py``'s ``resolve_batch`` settled for ``cfg`` (the CLI's); None:
    settled here."""
    # --- where we run, how each batch is cut, what we train on -------------------------------
    proc = distributed.setup()
    if cfg.memory.keep_freed:
        host_memory.keep_freed()  # a step's pages are faulted in once, not every micro-batch
    if layout is None:
        if resume:
            cfg = relaunch(cfg, out_dir, proc.world)
        cfg, layout = resolve_batch(cfg, proc.world)
    seed_everything(cfg.seed)
    task = build_task(cfg, proc.rank)
    plan = make_plan(cfg, layout, len(task.train_set))  # the steps, from the loaded set's size
    task.set_plan(plan)  # what the task draws per step ends with the run (detection's multi-scale sizes)

    # --- the model, the large-batch recipe, the progress and the state a checkpoint holds ---
    events = EventStorage()
    last_checkpoint = LastCheckpoint(run_files.last_checkpoint(out_dir),
                                     every_steps(cfg.checkpoint.every, plan, "checkpoint.every"))
    parts = build_parts(cfg, task, plan, proc, events, last_good=last_checkpoint.last_good, start=not resume)
    seed_rank(cfg.seed, proc.rank)  # the parts were built alike on every rank; from here each draws its own
    train_step = parts.step  # trains parts.model, wrapped in DDP under torchrun
    progress = Progress(plan, build_controller(cfg, plan, proc), events)
    state = TrainingState(cfg, parts.model, train_step, parts.ema, progress, classes=task.class_names)
    if resume:
        state.resume(run_files.last_checkpoint(out_dir))
        last_checkpoint.step = progress.step
    if proc.is_main:
        if resume:
            print(f"resumed from step {progress.step} of {plan.steps} ({last_checkpoint.path})", flush=True)
            for note in state.resume_notes:
                print(note, flush=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        check_run_files(out_dir)  # config.yaml and the logs: replaced only in a folder bigbatch wrote, never a user's
        claim(out_dir)  # the lock file now proves the folder a run's
        if resume and (note := set_aside_unrecorded_best(out_dir, progress.step, state.best.step)) is not None:
            print(note, flush=True)
        files.atomic_write(out_dir / run_files.CONFIG, lambda f: f.write(config_to_yaml(cfg)), mode="w")
        keep_model_files(out_dir, cfg, parts.model)  # a Darknet run's cfg: the run evaluates after it is moved
        print(plan.describe(), flush=True)

    # --- the hooks: records, evaluation, checkpoints, memory, fault injection ---------------
    run = Run(cfg, progress, proc, task, state, train_step, out_dir, events, last_checkpoint)
    run.hooks = build_hooks(run, hooks)
    run.hooks.load_state_dict(state.hook_states)  # a resumed run's hooks go on from the checkpoint, before before_train
    state.hooks = run.hooks  # from here on, every checkpoint holds the hooks' states
    events.writers.append(run.hooks.write)
    outcome = Outcome()  # the last evaluation's metrics and the memory peaks, as the records put them
    events.writers.append(outcome.write)
    controller = progress.controller  # one that measures the gradients (AdaScale) is called around each micro-batch
    micro_batch_hooks = MeasuredBy(controller, train_step, run.hooks) if controller.measures else run.hooks

    # --- the loop ---------------------------------------------------------------------------
    collector.settle()  # the command's start-up is over: its objects are frozen out of the run's collections
    run.model.train()
    progress.attach(run.model)  # a controller that measures the gradients (AdaScale) hooks the parameters
    try:
        run.hooks.before_train()
        if parts.started is not None and proc.is_main:  # said once every writer is open: metrics.jsonl keeps it
            events.event(0, "weights", parts.started.event(), parts.started.line())
        for step, t_data, micro_batches in step_batches(run, progress.step):  # until the controller is done
            run.step, run.t_data = step, t_data
            task.observe(micro_batches)
            decided = progress.begin_step()  # the batch and LR gain of this step (AdaScale: r, from the noise so far)
            run.hooks.before_step()
            run.lr = decided.gain * parts.lr_at(progress.schedule_step)  # the first batch's LR; AdaScale: r x base
            set_lr(train_step.optimizer, run.lr)
            # moved to the device inside (engine/transfer.py); the hooks are called around each micro-batch
            run.result = train_step(step, micro_batches, micro_batch_hooks, plan=progress.step_plan(),
                                    ema_power=decided.ema_power)
            progress.end_step(train_step)  # counted; the controller measures, and may grow the batch
            run.hooks.after_step()
        metrics = outcome.metrics or run.evaluate(raw_too=False)[0]  # a finished run resumed: report, log nothing
    except BaseException as error:
        run.hooks.after_train(failing=True)  # the run's own error is the one raised
        progress.detach()
        state.finish_writes(failing=True)  # the checkpoints saved before the error reach the disk
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C (or SIGTERM): say where a resume would continue from
            # the writer's (rank 0): a checkpoint whose write failed is not kept; the other ranks know what was saved
            kept = state.written_step(last_checkpoint.path) if proc.is_main else last_checkpoint.step
            raise Interrupted(progress.step, run.plan.steps, last_checkpoint.path if kept is not None else None,
                              kept, signal=15 if isinstance(error, Terminated) else 2) from None
        raise
    run.hooks.after_train()
    progress.detach()
    state.finish_writes()  # every checkpoint on disk before the run says it is done
    # Free DDP before the process group goes: a DDP left alive until the interpreter's exit can abort a Gloo
    # process ("terminate called without an active exception": 5 of 20 runs of a minimal torchrun script
    # here, 0 of 20 when it was freed first). The collection catches any reference cycle that would keep it.
    result = TrainResult(out_dir, progress.step, metrics, state.best, outcome.memory, task.report(metrics))
    del run, state, parts, train_step, events, progress
    if proc.world > 1:
        collector.thaw()  # the wrapper was built before the start-up's objects were frozen (floor/collector.py)
    gc.collect()
    distributed.teardown()
    return result


class Outcome:
    """A writer of the run's own: the last evaluation of the weights that count (``val``) and the memory peaks, as
    the evaluation and memory hooks recorded them, for the run's result."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.memory: dict[str, float] = {}

    def write(self, record: Record) -> None:
        values = record.values
        if record.kind == "eval" and values["split"] == "val":
            self.metrics = {k: v for k, v in values.items() if k not in ("step", "split")}
        elif record.kind == "event" and values["event"] == "memory":
            self.memory = {k: v for k, v in values.items() if k not in ("step", "event")}


class MeasuredBy:
    """The micro-batch moments of a step for a controller that measures them (AdaScale), then for the run's hooks."""

    def __init__(self, controller: BatchController, train_step: TrainStep, hooks: Hooks) -> None:
        self.controller, self.train_step, self.hooks = controller, train_step, hooks

    def before_forward(self, index: int) -> None:
        self.controller.before_forward(index, self.train_step)
        self.hooks.before_forward(index)

    def after_backward(self, index: int) -> None:
        self.controller.after_backward(index)
        self.hooks.after_backward(index)


def step_batches(run: Run, start: int) -> Iterator[tuple[int, float, Any]]:
    """(step, seconds waited, this device's micro-batches) of each step from ``start`` (data/pipeline/loader.py). The
    data order is keyed by image offset (step k: images [images_before(k), + batch_at(k))), so where an adaptive batch
    grows (the progress's plan gains a phase after a step) the loader is built again from the next step, and no image of
    the order is repeated or skipped. The run ends where its controller says so (an adaptive run: once its progress
    reaches the base schedule's length; ``run.plan.steps`` is then the steps taken)."""
    cfg, proc, task, progress = run.cfg, run.proc, run.task, run.progress
    while not progress.finished:  # a resumed run may have finished
        plan = progress.plan
        order = order_of(task.train_set, plan, cfg.seed, proc.world)
        loader = batches_by_step(task.train_set, order, start, plan.steps, proc.rank, proc.world,
                                 plan.subdivisions_at, cfg.data.workers, task.sample_keys,
                                 pin_memory=proc.device.type == "cuda",
                                 most_subdivisions=plan.largest_batch // (proc.world * plan.micro_batch))
        for step, (seconds, micro_batches) in enumerate(waited(loader, run.train_step.clock), start=start):
            yield step, seconds, micro_batches
            if step + 1 >= progress.plan.steps:  # the last step (an adaptive run's, once its controller ended it)
                return
            if progress.plan.phases != plan.phases:  # the batch grew: the next steps are cut from the new plan
                start = step + 1
                break
        else:
            return


def waited(items: Iterator[Any], clock: PhaseClock | None = None) -> Iterator[tuple[float, Any]]:
    """Each item with the seconds spent waiting for it (the data loader's share of a step: ``t_data``); a step's
    ``clock`` starts with that wait."""
    while True:
        if clock is not None:
            clock.begin("data")
        start = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            return
        seconds = time.perf_counter() - start
        if clock is not None:
            clock.switch("other")
        yield seconds, item


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (``seed mod 2^32``) and torch's generators (the CPU's and every CUDA device's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_rank(seed: int, rank: int) -> None:
    """After the parts are built, give each rank generators of its own: rank r >= 1 is seeded again with ``seed + r``,
    as timm's train.py (``random_seed(seed, rank)``) and detectron2's ``default_setup`` (``seed_all_rng(seed +
    rank)``) seed theirs; rank 0 keeps the streams ``seed_everything(seed)`` started (a single process runs as it
    always did). Otherwise every rank would draw the same dropout and drop-path masks (and torchvision's proposal
    samples) for its micro-batch j. The model is built before, with the shared seed: the EMA copies it before DDP
    broadcasts rank 0's weights. Data order and augmentation are keyed per sample (``sample_seed``), untouched."""
    if rank:
        seed_everything(seed + rank)
