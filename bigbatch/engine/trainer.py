"""The training loop, top to bottom.

One optimizer step, as in Darknet (seed ``darknet-batch-subdivisions``): each device runs its
``subdivisions`` micro-batches of ``batch / (world * subdivisions)`` images through forward and
backward, each loss scaled by ``1 / subdivisions`` so that the accumulated gradient is the mean
gradient over the whole global batch (DDP averages across devices); then one update.

    for step in steps:
        set the LR to lr(step)                            # recipe/schedule.py
        for micro_batch in this step's micro-batches:   # gradients accumulate
            (loss(micro_batch) / subdivisions).backward()
        clip the gradients; optimizer.step(); optimizer.zero_grad()
        BatchNorm per-step statistics; weight EMA        # recipe/norm.py, recipe/ema.py
        evaluate / checkpoint when due
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch.batching import BatchPlan, make_plan
from bigbatch.config import RunConfig, config_to_yaml, parse_size
from bigbatch.data.loader import split_micro_batches, train_steps
from bigbatch.data.order import GlobalBatchOrder
from bigbatch.engine import checkpoint, distributed
from bigbatch.engine.run_log import RunLog
from bigbatch.errors import UserError
from bigbatch.recipe.clip import clip_gradients
from bigbatch.recipe.ema import WeightEMA
from bigbatch.recipe.norm import RunningStatsSnapshot, configure_batchnorm, running_buffers, set_momentum
from bigbatch.recipe.optim import build_optimizer, set_lr
from bigbatch.recipe.precision import LossScaler, build_scaler, check_precision, first_nonfinite
from bigbatch.recipe.precision import autocast as precision_autocast
from bigbatch.recipe.schedule import build_schedule, length_in_steps
from bigbatch.recipe.sync_bn import convert_batchnorm
from bigbatch.tasks import build_task
from bigbatch.telemetry.memory import MemoryLimitExceeded, MemorySampler, rss_bytes

LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass
class StepResult:
    loss: torch.Tensor
    """Mean micro-batch loss (unscaled)."""
    grad_norm: float | None
    """Global gradient norm before clipping, when clipping by norm."""
    applied: bool
    """False when a gradient was not finite: no update was made."""
    nonfinite_layer: str | None = None
    """The first parameter whose gradient was not finite, when not applied."""


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[Any],
    loss_fn: LossFn,
    clip: Callable[[], float | None] | None = None,
    scaler: LossScaler | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> StepResult:
    """One optimizer step over this device's micro-batches.

    The gradient is sum_i grad(loss_i) / S = the gradient of the mean loss over the S equal
    micro-batches, i.e. of the whole batch. Under DDP, gradients are all-reduced only during the
    last micro-batch's backward (``no_sync`` before it): one synchronisation per step. The forward
    runs under ``autocast``; the loss is multiplied by the scaler's scale before the backward and
    the gradients divided by it after; a step with a non-finite gradient is not applied. ``clip``
    runs on the unscaled, accumulated gradient, before the update, and may return the norm.
    """
    scaler = scaler or LossScaler(1.0)
    subdivisions = len(micro_batches)
    losses = []
    for i, micro_batch in enumerate(micro_batches):
        last = i == subdivisions - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DistributedDataParallel) else model.no_sync()
        with sync:
            with autocast():
                loss = loss_fn(model, micro_batch)
            (loss * (scaler.scale / subdivisions)).backward()
        losses.append(loss.detach())
    finite = scaler.unscale_(model.parameters())
    grad_norm, nonfinite_layer = None, None
    if finite:
        grad_norm = clip() if clip is not None else None
        optimizer.step()
    else:
        nonfinite_layer = first_nonfinite(model)
    scaler.update(finite, unwrap(model))
    optimizer.zero_grad(set_to_none=True)
    return StepResult(torch.stack(losses).float().mean(), grad_norm, finite, nonfinite_layer)


class TrainingStopped(Exception):
    """Training cannot go on (the CLI prints the message and exits with code 1)."""


class NonFiniteTraining(TrainingStopped):
    """Too many optimizer steps in a row had non-finite gradients."""


class OutOfMemory(TrainingStopped):
    """Out of memory with micro-batches that cannot be cut any smaller."""


OUT_OF_MEMORY = (torch.cuda.OutOfMemoryError, MemoryLimitExceeded)


def memory_guarded(loss_fn: LossFn, limit: int | None, inject: bool) -> LossFn:
    """``loss_fn`` that first raises :class:`MemoryLimitExceeded` when the process's RSS is over ``limit``
    (checked before each micro-batch), or at the second micro-batch when ``inject`` (``debug.oom_at_step``)."""
    calls = 0

    def guarded(model: nn.Module, batch: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if inject and calls == 2:
            raise MemoryLimitExceeded("debug.oom_at_step")
        if limit is not None and (rss := rss_bytes()) > limit:
            raise MemoryLimitExceeded(f"the process uses {rss / 2**20:.0f} MiB > memory.limit {limit / 2**20:.0f} MiB")
        return loss_fn(model, batch)

    return guarded


def poisoned(loss_fn: LossFn) -> LossFn:
    """``debug.nonfinite_at_step``: the same loss times NaN, so that every gradient is NaN."""
    return lambda model, batch: loss_fn(model, batch) * float("nan")


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a (nested) batch to ``device``; on the CPU nothing is copied."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def is_due(step: int, every: int, total: int) -> bool:
    return step % every == 0 or step == total


def every_steps(length: int | float | str, plan: BatchPlan) -> int:
    """An interval given in steps, epochs or images, as a whole number of steps (at least 1)."""
    return max(1, round(length_in_steps(length, plan)))


@dataclass
class Best:
    """The best evaluation so far, by one metric."""

    metric: str
    mode: str
    value: float | None = None
    step: int | None = None

    def improves(self, value: float) -> bool:
        if self.value is None:
            return True
        return value > self.value if self.mode == "max" else value < self.value


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
    # --- where we run, what we train on, how each batch is cut ---------------------------
    proc = distributed.setup()
    if cfg.subdivisions == "auto":
        from bigbatch.telemetry.planner import resolve_auto_subdivisions

        cfg, _ = resolve_auto_subdivisions(cfg, proc.world)
    seed_everything(cfg.seed)
    task = build_task(cfg, proc.rank)
    plan: BatchPlan = make_plan(cfg, proc.world, len(task.train_set))

    # --- model and the large-batch recipe -------------------------------------------------
    check_precision(cfg.precision, proc.device)
    model = sync_batchnorm(task.build_model(cfg), cfg.norm.sync, proc).to(proc.device)
    lr_at = build_schedule(cfg, plan)
    running_stats = configure_batchnorm(model, cfg.norm, plan,
                                        reduce=all_reduce_sum if proc.world > 1 and cfg.norm.sync != "none" else None)
    optimizer = build_optimizer(cfg.optim, model, lr_at(0))
    ema = WeightEMA(model, cfg.ema.decay, cfg.ema.warmup) if cfg.ema.decay is not None else None
    scaler = build_scaler(cfg.precision, cfg.schedule.darknet.burn_in if cfg.schedule.preset == "darknet" else 0)
    autocast = lambda: precision_autocast(cfg.precision, proc.device)  # noqa: E731
    parameters = [p for p in model.parameters() if p.requires_grad]
    skipped = 0  # optimizer steps not applied (non-finite gradients), over the whole run
    split = 1  # each micro-batch of the plan is cut into this many: doubled on out-of-memory
    memory_limit = parse_size(cfg.memory.limit) if cfg.memory.limit is not None else None
    has_batchnorm = bool(running_buffers(model))
    best = Best(cfg.eval.metric, cfg.eval.better)
    start_step = 0
    last_checkpoint: int | None = None  # the step of checkpoints/last.pt, once there is one

    # --- resume: weights, optimizer, RNGs and the position in the data order -------------
    ckpt_dir = out_dir / "checkpoints"
    if resume:
        state = checkpoint.load(ckpt_dir / "last.pt", checkpoint.RESUME_KEYS)
        check_resumable(cfg, state["config"])
        load_weights(model, state["model"], "model")
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise UserError(f"optim: the checkpoint's optimizer state does not fit this config ({e})") from None
        checkpoint.restore_rng_state(state["rng"])
        scaler.load_state_dict(state["scaler"])
        skipped = state["skipped"]
        # A run that ran out of memory resumes with the subdivisions it had reached.
        reached = state["data"].get("subdivisions", cfg.subdivisions)
        if reached > cfg.subdivisions and reached % cfg.subdivisions == 0:
            split = reached // cfg.subdivisions
            set_momentum(model, cfg.norm, dataclasses.replace(plan, subdivisions=reached))
        if ema is not None:
            if state.get("ema") is None:
                raise UserError("ema.decay: the checkpoint has no weight EMA to resume; unset ema.decay")
            ema.load_state_dict(state["ema"])
        start_step = last_checkpoint = state["data"]["step"]
        best = Best(**state["best"])

    if proc.world > 1:
        model = DistributedDataParallel(model, device_ids=[proc.device] if proc.device.type == "cuda" else None)

    def save(path: Path, step: int) -> None:
        checkpoint.atomic_save(
            {
                "format": checkpoint.FORMAT,
                "step": step,
                "model": unwrap(model).state_dict(),
                "ema": ema.state_dict() if ema is not None else None,
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "skipped": skipped,
                "rng": checkpoint.rng_state(),
                "data": {"step": step, "seed": cfg.seed, "batch": cfg.batch, "subdivisions": plan.subdivisions * split},
                "best": vars(best).copy(),
                "config": cfg.model_dump(mode="json"),
            },
            path,
        )

    log, memory = None, None
    if proc.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.atomic_write(out_dir / "config.yaml", lambda f: f.write(config_to_yaml(cfg)), mode="w")
        print(plan.describe(), flush=True)
        log = RunLog(out_dir, plan.steps, start_step, plan.batch, cfg.log.tensorboard)
        memory = MemorySampler(out_dir / "memory.csv", cfg.memory.interval, proc.device)
        memory.step = start_step
        memory.start()

    # --- the loop -------------------------------------------------------------------------
    order = GlobalBatchOrder(len(task.train_set), plan.batch, cfg.seed)
    steps = train_steps(task.train_set, order, start_step, plan.steps, proc.rank, proc.world,
                        plan.subdivisions, cfg.data.workers, getattr(task, "sample_keys", None))
    eval_every, checkpoint_every = every_steps(cfg.eval.every, plan), every_steps(cfg.checkpoint.every, plan)

    def evaluate(done: int) -> dict[str, float]:
        """Metrics of the weights that count (the EMA when enabled), the raw ones logged as well."""
        raw = task.evaluate(model, cfg.eval.batch, proc.rank, proc.world)
        if ema is None or not cfg.ema.evaluate:
            if log is not None:
                log.evaluation(done, "val", raw)
            return raw
        averaged = task.evaluate(ema.module, cfg.eval.batch, proc.rank, proc.world)
        if log is not None:
            log.evaluation(done, "val", averaged)
            log.evaluation(done, "val_raw", raw)
        return averaged

    def forget_step(bn_before: RunningStatsSnapshot | None) -> None:
        """Undo what a step that is not applied did: gradients, BN running statistics, pooled BN sums."""
        optimizer.zero_grad(set_to_none=True)
        if bn_before is not None:  # the failed forwards must not count in the running statistics
            bn_before.restore()
        if running_stats is not None:
            running_stats.discard_step()

    def double_subdivisions(step: int, error: BaseException) -> None:
        """Out of memory: cut every micro-batch in two (the global batch stays) and re-run the step."""
        nonlocal split
        micro = plan.micro_batch // split
        if proc.world > 1:  # the other ranks wait in a collective: recovering in place would need them to agree
            raise OutOfMemory(f"out of memory at step {step} on rank {proc.rank} ({error}); with several processes "
                              f"bigbatch does not re-cut micro-batches in place: relaunch with subdivisions="
                              f"{plan.subdivisions * split * 2} (the run resumes from its last checkpoint)")
        if micro % 2:
            raise OutOfMemory(f"out of memory at step {step} with micro-batches of {micro} image(s), which cannot "
                              f"be halved ({error}); lower the batch or the input size")
        split *= 2
        set_momentum(model, cfg.norm, dataclasses.replace(plan, subdivisions=plan.subdivisions * split))
        if proc.device.type == "cuda":
            torch.cuda.empty_cache()
        if log is not None:
            log.event(step, "out_of_memory", {"subdivisions": plan.subdivisions * split, "micro_batch": micro // 2,
                                              "reason": str(error).splitlines()[0][:200]})

    def apply_step(step: int, micro_batches: list[Any], clip: Callable[[], float | None]) -> StepResult:
        """``train_step`` until it is applied: a step with non-finite gradients changes nothing (weights,
        BN statistics, LR, EMA, step) and is re-run on the same images at the scaler's new scale."""
        nonlocal skipped
        in_a_row, oom_injected = 0, False
        while True:
            inject = step == cfg.debug.nonfinite_at_step and in_a_row < cfg.debug.nonfinite_repeats
            loss_fn = poisoned(task.loss) if inject else task.loss
            inject_oom = step == cfg.debug.oom_at_step and not oom_injected
            if memory_limit is not None or inject_oom:
                loss_fn = memory_guarded(loss_fn, memory_limit, inject_oom)
            bn_before = RunningStatsSnapshot(model) if has_batchnorm else None
            try:
                result = train_step(model, optimizer, split_micro_batches(micro_batches, split), loss_fn, clip,
                                    scaler, autocast)
            except OUT_OF_MEMORY as error:
                oom_injected = oom_injected or inject_oom
                forget_step(bn_before)
                double_subdivisions(step, error)
                continue
            if result.applied:
                return result
            skipped, in_a_row = skipped + 1, in_a_row + 1
            forget_step(bn_before)
            if log is not None:
                log.skipped(step, skipped, scaler.scale, result.nonfinite_layer)
            if in_a_row >= cfg.precision.max_skipped:
                if last_checkpoint is not None:  # a step with non-finite gradients is never applied
                    kept = (f"The last checkpoint, {ckpt_dir / 'last.pt'} at step {last_checkpoint}, holds finite "
                            f"weights: resume from it with a lower optim.lr or another precision")
                else:
                    kept = f"No checkpoint had been written yet (the first was due at step {checkpoint_every})"
                raise NonFiniteTraining(
                    f"{in_a_row} optimizer steps in a row had non-finite gradients at step {step}; the first "
                    f"parameter with one: {result.nonfinite_layer}. {kept}."
                )

    metrics: dict[str, float] = {}
    observe = getattr(task, "observe", None)  # detection: counts data problems the loader's workers found
    model.train()
    try:
        for step, micro_batches in enumerate(steps, start=start_step):
            if observe is not None:
                observe(micro_batches)
            lr = lr_at(step)
            set_lr(optimizer, lr)
            micro_batches = to_device(micro_batches, proc.device)
            clip = lambda step=step: clip_gradients(cfg.clip, parameters, step)  # noqa: E731
            result = apply_step(step, micro_batches, clip)
            loss, grad_norm = result.loss, result.grad_norm
            if running_stats is not None:
                running_stats.end_step()
            if ema is not None:
                ema.update(unwrap(model))
            done = step + 1  # optimizer steps completed; every record and checkpoint counts these
            if memory is not None:
                memory.step = done

            if log is not None:
                log.progress(done)
                if is_due(done, cfg.log.every, plan.steps) or done == start_step + 1:
                    extra = {"grad_norm": grad_norm} if grad_norm is not None else {}
                    if type(scaler) is not LossScaler or scaler.scale != 1.0:
                        extra["loss_scale"] = scaler.scale
                    log.train(done, plan.epoch_at(done), lr, loss.item(), skipped=skipped, **extra)

            if is_due(done, eval_every, plan.steps):
                metrics = evaluate(done)
                if best.improves(metrics[best.metric]):
                    best.value, best.step = metrics[best.metric], done
                    if proc.is_main:
                        save(ckpt_dir / "best.pt", done)

            if is_due(done, checkpoint_every, plan.steps):
                if proc.is_main:
                    save(ckpt_dir / "last.pt", done)
                last_checkpoint = done

        if not metrics:  # resumed a run that had already finished: report, log nothing new
            weights = ema.module if ema is not None and cfg.ema.evaluate else model
            metrics = task.evaluate(weights, cfg.eval.batch, proc.rank, proc.world)

    finally:
        peaks = memory.stop() if memory is not None else {}
        if log is not None:
            if peaks:
                log.event(memory.step, "memory", peaks)
            log.close()
    # Free DDP before the process group goes: a DDP left alive until the interpreter's exit can abort a Gloo
    # process ("terminate called without an active exception": 5 of 20 runs of a minimal torchrun script
    # here, 0 of 20 when it was freed first). The collection catches any reference cycle that would keep it.
    model = None
    gc.collect()
    distributed.teardown()
    return TrainResult(out_dir, plan.steps, metrics, best, peaks, task.report(metrics))


def sync_batchnorm(model: nn.Module, sync: str, proc: distributed.Process) -> nn.Module:
    """``norm.sync``: BatchNorm statistics over all devices (``bigbatch`` or torch's SyncBatchNorm)."""
    if sync == "torch" and proc.device.type != "cuda":
        raise UserError("norm.sync: torch.nn.SyncBatchNorm runs on CUDA only; on the CPU use norm.sync=bigbatch")
    if sync == "none" or proc.world == 1:
        return model
    if sync == "torch":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_batchnorm(model)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    torch.distributed.all_reduce(tensor)
    return tensor


def load_weights(model: nn.Module, state: dict[str, Any], key: str) -> None:
    """Load a state dict; a checkpoint of another architecture is a user mistake naming ``key``."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise UserError(f"{key}: the checkpoint does not fit this model ({first})") from None


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def check_resumable(cfg: RunConfig, saved: dict[str, Any]) -> None:
    """The data order depends on the seed and the global batch: resuming must keep both."""
    for key in ("batch", "seed"):
        if saved.get(key) != getattr(cfg, key):
            raise UserError(f"{key}: the checkpoint was trained with {key} {saved.get(key)}, not {getattr(cfg, key)}; "
                            f"resuming needs the same {key}")
