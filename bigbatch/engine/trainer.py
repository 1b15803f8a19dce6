"""The training loop, top to bottom.

    parts: model, optimizer, scaler, EMA, schedule          engine/parts.py
    state: everything a checkpoint holds                     engine/state.py
    for step in steps:                                       data/loader.py: this device's micro-batches
        set the LR to lr(step)                               recipe/schedule.py
        one optimizer step over the micro-batches            engine/step.py (accumulation, retries, EMA)
        hooks: training record, evaluation, checkpoints,     engine/hooks/
               memory, writers (metrics.jsonl, TensorBoard, progress)

Everything besides the step is a hook (``engine/hooks/base.py``): the loop only moves the data and the state.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from bigbatch.batching import make_plan
from bigbatch.config import RunConfig, config_to_yaml
from bigbatch.data.loader import train_steps
from bigbatch.data.order import order_of
from bigbatch.engine import checkpoint, distributed
from bigbatch.engine.events import EventStorage
from bigbatch.engine.hooks import build_hooks
from bigbatch.engine.parts import build_parts
from bigbatch.engine.phases import PhaseClock
from bigbatch.engine.run import Run
from bigbatch.engine.state import Best, TrainingState
from bigbatch.recipe.optim import set_lr
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


def train(cfg: RunConfig, out_dir: Path, resume: bool = False) -> TrainResult:
    # --- where we run, what we train on, how each batch is cut ------------------------------
    proc = distributed.setup()
    if cfg.subdivisions == "auto":
        from bigbatch.engine.planner import resolve_auto_subdivisions

        cfg, _ = resolve_auto_subdivisions(cfg, proc.world)
    seed_everything(cfg.seed)
    task = build_task(cfg, proc.rank)
    plan = make_plan(cfg, proc.world, len(task.train_set))

    # --- the model, the large-batch recipe, and the state a checkpoint holds ----------------
    events = EventStorage()
    model, train_step, ema, lr_at = build_parts(cfg, task, plan, proc, events)
    state = TrainingState(cfg, model, train_step, ema)
    if resume:
        state.resume(out_dir / "checkpoints" / "last.pt")
    if proc.world > 1:
        model = train_step.model = DistributedDataParallel(
            model, device_ids=[proc.device] if proc.device.type == "cuda" else None)
    if proc.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.atomic_write(out_dir / "config.yaml", lambda f: f.write(config_to_yaml(cfg)), mode="w")
        print(plan.describe(), flush=True)

    # --- the hooks: records, evaluation, checkpoints, memory, fault injection ---------------
    run = Run(cfg, plan, proc, task, model, state, train_step, out_dir, events)
    run.hooks = hooks = build_hooks(run)
    hooks.load_state_dict(state.hook_states)  # a resumed run's hooks go on from the checkpoint, before before_train
    state.hooks = hooks  # from here on, every checkpoint holds the hooks' states
    events.writers.append(hooks.write)
    if hooks.uses("before_forward"):
        train_step.before_forward = hooks.before_forward
    if hooks.uses("after_backward"):
        train_step.after_backward = hooks.after_backward

    # --- the loop ---------------------------------------------------------------------------
    order = order_of(task.train_set, plan.batch, cfg.seed, proc.world)
    steps = train_steps(task.train_set, order, state.step, plan.steps, proc.rank, proc.world, plan.subdivisions,
                        cfg.data.workers, task.sample_keys, pin_memory=proc.device.type == "cuda")
    model.train()
    try:
        hooks.before_train()
        for step, (run.t_data, micro_batches) in enumerate(waited(steps, train_step.clock), start=state.step):
            run.step = step
            task.observe(micro_batches)
            hooks.before_step()
            run.lr = lr_at(step)
            set_lr(train_step.optimizer, run.lr)
            run.result = train_step(step, micro_batches)  # moved to the device inside (engine/transfer.py)
            state.step = step + 1
            hooks.after_step()
        metrics = run.metrics or run.evaluate(raw_too=False)[0]  # a finished run resumed: report, log nothing
    except BaseException:
        hooks.after_train(failing=True)  # the run's own error is the one raised
        raise
    hooks.after_train()
    # Free DDP before the process group goes: a DDP left alive until the interpreter's exit can abort a Gloo
    # process ("terminate called without an active exception": 5 of 20 runs of a minimal torchrun script
    # here, 0 of 20 when it was freed first). The collection catches any reference cycle that would keep it.
    run.model = train_step.model = model = None
    gc.collect()
    distributed.teardown()
    return TrainResult(out_dir, plan.steps, metrics, state.best, run.extras.get("memory", {}), task.report(metrics))


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
