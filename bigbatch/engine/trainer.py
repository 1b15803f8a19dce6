"""The training loop, top to bottom.

    parts: model, optimizer, scaler, EMA, schedule          engine/parts.py
    state: everything a checkpoint holds                     engine/state.py
    for step in steps:                                       data/loader.py: this device's micro-batches
        set the LR to lr(step)                               largebatch/schedule.py (adaptive: adascale.py)
        one optimizer step over the micro-batches            engine/step.py (accumulation, retries, EMA)
        hooks, stage by stage: prepare, measure, record,     engine/hooks/ (base.py: the stages, build_hooks)
               evaluate, checkpoint, guard, write

Everything besides the step is a hook (``engine/hooks/base.py``): the loop only moves the data and the state.
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

from bigbatch.batching import make_plan
from bigbatch.config import RunConfig, config_to_yaml
from bigbatch.data.loader import batches_by_step
from bigbatch.data.order import order_of
from bigbatch.engine import checkpoint, distributed, host_memory
from bigbatch.engine.events import EventStorage
from bigbatch.engine.hooks import Hook, build_hooks
from bigbatch.engine.hooks.base import every_steps
from bigbatch.engine.parts import build_parts
from bigbatch.engine.phases import PhaseClock
from bigbatch.engine.run import LastCheckpoint, Run
from bigbatch.engine.run_dir import keep_model_files
from bigbatch.engine.state import Best, TrainingState
from bigbatch.engine.step import Interrupted
from bigbatch.largebatch.adascale import AdaScale
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


def train(cfg: RunConfig, out_dir: Path, resume: bool = False, hooks: Sequence[Hook] = ()) -> TrainResult:
    """Train ``cfg`` into ``out_dir`` (``resume``: from its ``checkpoints/last.pt``); ``hooks``: hooks of the
    caller's own, beside the registered ones, placed by the stage each declares (``engine/hooks/base.py``)."""
    # --- where we run, what we train on, how each batch is cut ------------------------------
    proc = distributed.setup()
    if cfg.memory.keep_freed:
        host_memory.keep_freed()  # a step's pages are faulted in once, not every micro-batch
    if cfg.subdivisions == "auto":
        from bigbatch.engine.planner import resolve_auto_subdivisions

        cfg, _ = resolve_auto_subdivisions(cfg, proc.world)
    seed_everything(cfg.seed)
    task = build_task(cfg, proc.rank)
    plan = make_plan(cfg, proc.world, len(task.train_set))

    # --- the model, the large-batch recipe, and the state a checkpoint holds ----------------
    events = EventStorage()
    last_checkpoint = LastCheckpoint(out_dir / "checkpoints" / "last.pt",
                                     every_steps(cfg.checkpoint.every, plan, "checkpoint.every"))
    parts = build_parts(cfg, task, plan, proc, events, last_good=last_checkpoint.last_good)
    train_step = parts.step  # trains parts.model, wrapped in DDP under torchrun
    state = TrainingState(cfg, parts.model, train_step, parts.ema)
    if resume:
        state.resume(out_dir / "checkpoints" / "last.pt")
        last_checkpoint.step = state.step
    if proc.is_main:
        if resume:
            print(f"resumed from step {state.step} of {plan.steps} ({last_checkpoint.path})", flush=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.atomic_write(out_dir / "config.yaml", lambda f: f.write(config_to_yaml(cfg)), mode="w")
        keep_model_files(out_dir, cfg, parts.model)  # a Darknet run's cfg: the run evaluates after it is moved
        print(plan.describe(), flush=True)

    # --- the hooks: records, evaluation, checkpoints, memory, fault injection ---------------
    plan = train_step.run_plan  # a resumed adaptive run's: with the changes of batch it had made
    run = Run(cfg, plan, proc, task, train_step.model, state, train_step, out_dir, events, last_checkpoint)
    if plan.base is not None:  # batch: {mode: adaptive}: the LR and the run's length follow the measured gain
        run.adascale = AdaScale(plan.base, plan.steps, grow_to=plan.grow_to, unit=proc.world * plan.micro_batch)
    run.hooks = build_hooks(run, hooks)
    run.hooks.load_state_dict(state.hook_states)  # a resumed run's hooks go on from the checkpoint, before before_train
    state.hooks = run.hooks  # from here on, every checkpoint holds the hooks' states
    events.writers.append(run.hooks.write)

    # --- the loop ---------------------------------------------------------------------------
    run.model.train()
    try:
        run.hooks.before_train()
        for step, t_data, micro_batches in step_batches(run, state.step):  # AdaScale: until the base schedule ends
            run.step, run.t_data = step, t_data
            task.observe(micro_batches)
            train_step.enter(step)  # the batch in effect: its subdivisions, EMA decay and BN momentum
            run.hooks.before_step()  # AdaScale's hook: the step's gain r, from the noise measured so far
            # that of the first batch, whatever the batch schedule; AdaScale: r x lr_base(progress in base steps)
            run.lr = parts.lr_at(step) if run.adascale is None else run.adascale.lr(parts.lr_at)
            set_lr(train_step.optimizer, run.lr)
            # moved to the device inside (engine/transfer.py); the hooks are called around each micro-batch
            run.result = train_step(step, micro_batches, run.hooks)
            state.step = step + 1
            run.hooks.after_step()
        metrics = run.metrics or run.evaluate(raw_too=False)[0]  # a finished run resumed: report, log nothing
    except BaseException as error:
        run.hooks.after_train(failing=True)  # the run's own error is the one raised
        state.finish_writes(failing=True)  # the checkpoints saved before the error reach the disk
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C: say where a resume would continue from
            kept = last_checkpoint.step
            raise Interrupted(state.step, run.plan.steps, last_checkpoint.path if kept is not None else None,
                              kept) from None
        raise
    run.hooks.after_train()
    state.finish_writes()  # every checkpoint on disk before the run says it is done
    # Free DDP before the process group goes: a DDP left alive until the interpreter's exit can abort a Gloo
    # process ("terminate called without an active exception": 5 of 20 runs of a minimal torchrun script
    # here, 0 of 20 when it was freed first). The collection catches any reference cycle that would keep it.
    result = TrainResult(out_dir, state.step, metrics, state.best, run.extras.get("memory", {}), task.report(metrics))
    del run, state, parts, train_step, events
    gc.collect()
    distributed.teardown()
    return result


def step_batches(run: Run, start: int) -> Iterator[tuple[int, float, Any]]:
    """(step, seconds waited, this device's micro-batches) of each step from ``start`` (data/loader.py). The data
    order is keyed by image offset (step k: images [images_before(k), + batch_at(k))), so where an adaptive batch
    grows (``run.plan`` gains a phase after a step) the loader is built again from the next step, and no image of
    the order is repeated or skipped. An adaptive run ends where its progress reaches the base schedule's length
    (``run.plan.steps`` is then the steps taken)."""
    cfg, proc, task = run.cfg, run.proc, run.task
    while run.adascale is None or not run.adascale.finished:  # a resumed adaptive run may have finished
        plan = run.plan
        order = order_of(task.train_set, plan, cfg.seed, proc.world)
        loader = batches_by_step(task.train_set, order, start, plan.steps, proc.rank, proc.world,
                                 plan.subdivisions_at, cfg.data.workers, task.sample_keys,
                                 pin_memory=proc.device.type == "cuda",
                                 most_subdivisions=plan.largest_batch // (proc.world * plan.micro_batch))
        for step, (seconds, micro_batches) in enumerate(waited(loader, run.train_step.clock), start=start):
            yield step, seconds, micro_batches
            if step + 1 >= run.plan.steps:  # the last step (an adaptive run's, once AdaScale has ended it)
                return
            if run.plan.phases != plan.phases:  # the batch grew: the next steps are cut from the new plan
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
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
