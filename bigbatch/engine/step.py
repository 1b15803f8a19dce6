"""One optimizer step: accumulation over micro-batches, one DDP sync, autocast and loss scale, clipping, the
update, and the retries.

As in Darknet (pjreddie/darknet ``src/network.c``, ``train_network``), each device runs its ``subdivisions``
micro-batches of ``batch / (world * subdivisions)`` images through forward and backward, each loss scaled by
``1 / subdivisions``, so that the accumulated gradient is the mean gradient over the whole global batch
(DDP averages across devices); then one update:

    for each micro-batch i:  (loss_i * scale / S).backward()     # DDP all-reduces during the last one only
    unscale (g /= scale); finite? -> clip, optimizer.step()       # largebatch/precision.py, largebatch/clip.py
    BatchNorm per-step statistics; weight EMA                     # largebatch/norm.py, largebatch/ema.py

Retries: a step whose gradient is not finite changes nothing (weights, BatchNorm statistics, EMA, step) and
is run again on the same images at the loss scaler's new scale; after ``precision.max_skipped`` in a row the
run stops. An out-of-memory step is cut finer (each micro-batch in two: the global batch and the update stay
the same) and run again. A step whose ``model.compile`` compilation fails is undone and run again in eager mode
(``engine/compile.py``). :class:`TrainStep` owns the subdivisions in effect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch.batching import BatchPlan
from bigbatch.config import NormConfig
from bigbatch.data.pipeline.loader import split_micro_batches
from bigbatch.engine.compile import CompiledModel, compile_failure
from bigbatch.engine.events import EventStorage
from bigbatch.engine.phases import PhaseClock
from bigbatch.errors import TrainingStopped
from bigbatch.largebatch.ema import WeightEMA
from bigbatch.largebatch.norm import (
    PerStepRunningStats,
    RunningStatsSnapshot,
    batchnorm_layers,
    running_buffers,
    set_momentum,
)
from bigbatch.largebatch.precision import LossScaler, first_nonfinite
from bigbatch.telemetry.memory import MemoryLimitExceeded

LossFn = Callable[[nn.Module, Any], torch.Tensor | Mapping[str, torch.Tensor]]
"""A micro-batch's mean loss (a scalar), or its terms by name: the loss is their sum, and the training record shows
each (``Task.loss``, ``tasks/base.py``)."""
MicroBatchHook = Callable[[int], None]
"""Called with a micro-batch's index: before its forward, or after its backward."""


class Interrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, SIGINT; or SIGTERM in one process, :func:`terminate_as_interrupt`) after
    ``done`` of its ``steps`` steps; ``checkpoint``, the last one written (None: none yet), holds step
    ``checkpoint_step``: what a resume continues from. ``signal``: the signal's number (the exit code is 128 + it)."""

    def __init__(self, done: int, steps: int, checkpoint: Path | None, checkpoint_step: int | None,
                 signal: int = 2) -> None:
        super().__init__(done)
        self.done, self.steps, self.checkpoint, self.checkpoint_step = done, steps, checkpoint, checkpoint_step
        self.signal = signal


class Terminated(KeyboardInterrupt):
    """SIGTERM received while a run of one process trains (:func:`terminate_as_interrupt`)."""

    def __init__(self, signal: int = 15) -> None:
        super().__init__(signal)
        self.signal = signal


@contextlib.contextmanager
def terminate_as_interrupt(enabled: bool) -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, ``timeout``, a scheduler's stop, which sends SIGKILL only after a grace
    period) stops the run as Ctrl-C does: the checkpoints written reach the disk and the run says what is kept,
    where Python's default is to die at once and silently. Only where ``enabled`` (one process: under torchrun the
    agent stops the other workers with SIGTERM when one fails, and a worker waiting in a collective would hold the
    signal until the grace period ends) and in the main thread (the only one that may set a handler)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class NonFiniteTraining(TrainingStopped):
    """Too many optimizer steps in a row had non-finite gradients."""


class OutOfMemory(TrainingStopped):
    """Out of memory with micro-batches that cannot be cut any smaller."""


OUT_OF_MEMORY = (torch.cuda.OutOfMemoryError, MemoryLimitExceeded)


@dataclass
class StepResult:
    loss: torch.Tensor
    """Mean micro-batch loss (unscaled) over this process's micro-batches (the training record averages ``means`` over
    every process's)."""
    grad_norm: float | None
    """Global gradient norm before clipping, when clipping by norm."""
    applied: bool
    """False when a gradient was not finite: no update was made."""
    nonfinite_layer: str | None = None
    """The first parameter whose gradient was not finite, when not applied."""
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    """Each loss term's mean over this process's micro-batches, when the loss came as terms (their sum is ``loss``)."""
    micro_batches: int = 1
    """How many micro-batches ``loss`` and ``terms`` are the means of (on this process)."""

    def means(self) -> dict[str, torch.Tensor]:
        """``loss``, then the terms: what the training record averages over every process's micro-batches
        (``floor/distributed.py``'s ``global_means``)."""
        return {"loss": self.loss, **self.terms}


def _loss_and_terms(out: torch.Tensor | Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A loss function's result as (the loss, its terms): terms by name sum to the loss; a scalar has none."""
    if isinstance(out, Mapping):
        terms = dict(out)
        return sum(terms.values()), terms
    return out, {}


def _nothing(index: int) -> None:
    pass


def attempt_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Any],
    loss_fn: LossFn,
    clip: Callable[[], float | None] | None = None,
    scaler: LossScaler | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    before_forward: MicroBatchHook = _nothing,
    after_backward: MicroBatchHook = _nothing,
    clock: PhaseClock | None = None,
) -> StepResult:
    """One attempt at an optimizer step over this device's micro-batches.

    The gradient is sum_i grad(loss_i) / S = the gradient of the mean loss over the S equal micro-batches,
    i.e. of the whole batch. Under DDP, gradients are all-reduced only during the last micro-batch's
    backward (``no_sync`` before it): one synchronisation per step. The forward runs under ``autocast``; the
    loss is multiplied by the scaler's scale before the backward and the gradients divided by it after; a
    step with a non-finite gradient is not applied. ``clip`` runs on the unscaled, accumulated gradient,
    before the update, and may return the norm. ``after_backward(i)`` sees the gradient accumulated up to
    micro-batch ``i`` (still scaled, and still local for every micro-batch but the last).
    """
    scaler = scaler or LossScaler(1.0)
    clock = clock or PhaseClock("off")
    subdivisions = len(micro_batches)
    distributed = isinstance(model, DistributedDataParallel)
    losses, terms = [], []
    for i, micro_batch in enumerate(micro_batches):
        last = i == subdivisions - 1
        sync = contextlib.nullcontext() if last or not distributed else model.no_sync()
        before_forward(i)
        with sync:
            clock.switch("forward")
            with autocast():
                loss, parts = _loss_and_terms(loss_fn(model, micro_batch))
            clock.switch("last_backward" if last and distributed and subdivisions > 1 else "backward")
            (loss * (scaler.scale / subdivisions)).backward()
            clock.switch("other")
        after_backward(i)
        losses.append(loss.detach())
        terms.append({name: value.detach() for name, value in parts.items()})
    clock.switch("update")
    finite = scaler.unscale_(model.parameters())
    grad_norm, nonfinite_layer = None, None
    if finite:
        grad_norm = clip() if clip is not None else None
        optimizer.step()
    else:
        nonfinite_layer = first_nonfinite(model)
    scaler.update(finite, unwrap(model))
    optimizer.zero_grad(set_to_none=True)
    term_means = {name: torch.stack([t[name] for t in terms]).float().mean() for name in terms[0]}
    return StepResult(torch.stack(losses).float().mean(), grad_norm, finite, nonfinite_layer, term_means,
                      subdivisions)


class MicroBatchHooks(Protocol):
    """What a step calls around each micro-batch (the run's hooks, ``engine/hooks/base.py``)."""

    def before_forward(self, index: int) -> None: ...

    def after_backward(self, index: int) -> None: ...


class NoHooks:
    def before_forward(self, index: int) -> None:
        pass

    def after_backward(self, index: int) -> None:
        pass


class TrainStep:
    """A training step that is always applied: :func:`attempt_step`, re-run until its gradient is finite, re-cut
    when out of memory; then the per-step BatchNorm statistics and the weight EMA. Owns the subdivisions in
    effect (``subdivisions``) and the count of steps not applied (``skipped``).

    Complete when built: everything it uses is a keyword argument here, and nothing outside the class sets its
    attributes (the run's hooks are handed to each call)."""

    def __init__(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, scaler: LossScaler,
                 autocast: Callable[[], contextlib.AbstractContextManager], clip: Callable[[int], float | None],
                 plan: BatchPlan, norm: NormConfig, running_stats: PerStepRunningStats | None,
                 ema: WeightEMA | None, max_skipped: int, events: EventStorage, clock: PhaseClock,
                 feed: Callable[[Sequence[Any]], Sequence[Any]], recut_on_oom: bool = True,
                 last_good: Callable[[], str] = lambda: "", wrap: Callable[[nn.Module], nn.Module] | None = None,
                 compiled: CompiledModel | None = None) -> None:
        self._model, self._optimizer, self.loss_fn, self._scaler = model, optimizer, loss_fn, scaler
        self._wrap = wrap
        """Builds the model that trains from the bare one (DDP under torchrun; None: the bare model trains)."""
        self.autocast, self.clip, self.norm = autocast, clip, norm
        self.first = plan.at(0)
        """The plan of the first step's batch: the micro-batch, and what per-step rules scale from."""
        self.plan = self.first
        """The plan of the batch in effect (the step's, handed to each call): its batch and subdivisions."""
        self._layer_momentum = {layer: layer.momentum for layer in batchnorm_layers(unwrap(model))}
        """Each BN layer's momentum at the first batch (what a per-step correction starts from)."""
        self.running_stats, self.ema, self.max_skipped, self.events = running_stats, ema, max_skipped, events
        self.has_batchnorm = bool(running_buffers(unwrap(model)))
        self._clock = clock
        """Times the phases of each step (``engine/phases.py``; ``log.timing``)."""
        self.feed = feed
        """Puts an attempt's micro-batches on the model's device (``engine/transfer.py``'s ``DeviceFeed``)."""
        self.recut_on_oom = recut_on_oom
        """Out of memory: cut finer and re-run (else the error propagates, as ``bigbatch plan`` wants)."""
        self.last_good = last_good
        """Where the last finite weights are (the run's checkpoints say), for the message of a stopped run."""
        self._split = 1
        """Each micro-batch of the plan is cut into this many (multiplied on out-of-memory: ``_cut_finer``)."""
        self._skipped = 0
        """Optimizer steps not applied (non-finite gradients), over the whole run."""
        self._attempt_micro_batches = 0
        """Micro-batches of the attempt being run (the subdivisions, unless an out-of-memory re-cut is pending)."""
        self.compiled = compiled
        """The model's regions compiled by ``model.compile`` (``engine/compile.py``; None: eager): a step whose
        compilation fails is undone and run again in eager mode."""

    # What others read; only the step changes them.
    model = property(lambda self: self._model, doc="The model that trains (wrapped in DDP under torchrun).")
    optimizer = property(lambda self: self._optimizer)
    scaler = property(lambda self: self._scaler)
    clock = property(lambda self: self._clock)
    split = property(lambda self: self._split, doc="Each micro-batch of the plan is cut into this many.")
    skipped = property(lambda self: self._skipped, doc="Optimizer steps not applied, over the whole run.")
    attempt_micro_batches = property(lambda self: self._attempt_micro_batches,
                                     doc="Micro-batches of the attempt being run.")

    def trained_set_changed(self) -> None:
        """The parameters that require gradients changed (a freeze began or ended: ``largebatch/freeze.py``): under
        torchrun the DDP wrapper is built again, since DDP reduces the gradients of the parameters that required
        them when it was built. Every process changes the same set at the same step."""
        if self._wrap is not None:
            bare = unwrap(self._model)
            self._model = None  # the old wrapper's reducer (and its gradient hooks) go before the new one is built
            gc.collect()
            self._model = self._wrap(bare)

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps of the step: the skipped count, the subdivisions in effect and the split an
        out-of-memory re-cut reached."""
        return {"skipped": self._skipped, "subdivisions": self.subdivisions, "split": self._split}

    def load_state_dict(self, state: dict[str, int | None], plan: BatchPlan) -> None:
        """A resumed run goes on with the skipped count and the split an out-of-memory re-cut reached, at ``plan``,
        its next step's (a checkpoint without ``split``: from the subdivisions it reached)."""
        self._skipped = state["skipped"]
        self._enter(plan)
        split, reached = state.get("split"), state["subdivisions"]
        if split is None and reached > self.plan.subdivisions and reached % self.plan.subdivisions == 0:
            split = reached // self.plan.subdivisions
        if isinstance(split, int) and split > 1:
            self._set_split(split)

    @property
    def subdivisions(self) -> int:
        """Micro-batches per device per step, as run now."""
        return self.plan.subdivisions * self.split

    def _enter(self, plan: BatchPlan) -> None:
        """The step's batch is ``plan``'s: where it differs from the one in effect (a batch schedule's milestone, an
        adaptive batch that grew), its subdivisions, and BN momentum with per-step statistics follows it (a batch
        ``N`` times the first: ``1 - (1 - m) ** N``, the Inception TPU guide's beta = alpha ** N)."""
        if plan.batch == self.plan.batch:
            return
        self.plan = plan
        self._set_momentum()

    def _set_split(self, split: int) -> None:
        self._split = split
        self._set_momentum()

    def _set_momentum(self) -> None:
        """BN momentum for the subdivisions in effect. Per micro-batch statistics keep the momentum of each update
        at the first batch's (more micro-batches are more updates); per-step statistics take the per-step rule."""
        model = unwrap(self.model)
        if self.norm.running_stats == "per_step":
            growth = self.plan.batch / self.first.batch
            set_momentum(model, self.norm, dataclasses.replace(self.plan, subdivisions=self.subdivisions),
                         growth=growth, layer_momentum=self._layer_momentum)
        else:
            first = self.first
            set_momentum(model, self.norm, dataclasses.replace(first, subdivisions=first.subdivisions * self.split))

    def __call__(self, step: int, micro_batches: list[Any], hooks: MicroBatchHooks | None = None,
                 plan: BatchPlan | None = None, ema_power: float | None = None) -> StepResult:
        """Optimizer step ``step`` (0-based) on this device's micro-batches (on the host, or already on the
        device), applied; ``hooks`` are called around each micro-batch of each attempt. ``plan``: the step's (its
        batch and subdivisions; default: the one in effect); ``ema_power``: the weight EMA's decay this step is
        ``d ** ema_power`` (``engine/controllers/``: the batch over the first under a batch schedule, AdaScale's
        gain; default: as the step before)."""
        hooks = hooks or NoHooks()
        if plan is not None:
            self._enter(plan)
        if ema_power is not None and self.ema is not None:
            self.ema.per_step_power = ema_power
        in_a_row = 0
        while True:
            bn_before = RunningStatsSnapshot(unwrap(self.model)) if self.has_batchnorm else None
            self._clock.switch("other")
            cut = self.feed(split_micro_batches(micro_batches, self._split))  # cut on the host, then moved
            self._attempt_micro_batches = len(cut)
            try:
                result = attempt_step(self._model, self._optimizer, cut, self.loss_fn, lambda: self.clip(step),
                                      self._scaler, self.autocast, hooks.before_forward, hooks.after_backward,
                                      self._clock)
            except OUT_OF_MEMORY as error:
                if not self.recut_on_oom:
                    raise
                self._forget(bn_before)
                self._cut_finer(step, error)
                continue
            except Exception as error:
                if self.compiled is None or self.compiled.eager or not compile_failure(error):
                    raise
                self._forget(bn_before)
                self.compiled.fall_back(error)  # one warning line; the attempt runs again, eager
                continue
            if result.applied:
                break
            self._skipped, in_a_row = self._skipped + 1, in_a_row + 1
            self._forget(bn_before)
            self.events.event(step + 1, "skipped", {"skipped": self.skipped, "loss_scale": self.scaler.scale,
                                                "nonfinite": result.nonfinite_layer},
                              f"step {step + 1}: non-finite gradient (first in {result.nonfinite_layer}); "
                              f"not applied, loss scale now {self.scaler.scale:g}")
            if in_a_row >= self.max_skipped:
                raise NonFiniteTraining(f"{in_a_row} optimizer steps in a row had non-finite gradients at step "
                                        f"{step + 1}; the first parameter with one: {result.nonfinite_layer}. "
                                        f"{self.last_good()}.")
        if self.running_stats is not None:
            self.running_stats.end_step()
        if self.ema is not None:
            self.ema.update(unwrap(self.model))
        return result

    def _forget(self, bn_before: RunningStatsSnapshot | None) -> None:
        """Undo what a step that is not applied did: gradients, BN running statistics, pooled BN sums."""
        self.optimizer.zero_grad(set_to_none=True)
        if bn_before is not None:  # the failed forwards must not count in the running statistics
            bn_before.restore()
        if self.running_stats is not None:
            self.running_stats.discard_step()

    def _cut_finer(self, step: int, error: BaseException) -> None:
        """Out of memory: cut every micro-batch into ``p`` equal ones, ``p`` the smallest prime factor of its size
        (two where it is even; three for 3, 9 or 15 images), so the global batch stays, before the step is
        re-run."""
        micro = self.plan.micro_batch // self.split
        parts = smallest_prime_factor(micro)
        if self.plan.world > 1:  # the other ranks wait in a collective: recovering in place would need them to agree
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            raise OutOfMemory(f"out of memory at step {step + 1} on rank {rank} ({error}); with several processes "
                              f"bigbatch does not re-cut micro-batches in place: relaunch with subdivisions="
                              f"{self.first.subdivisions * self.split * parts} (the run resumes from its last "
                              "checkpoint)")
        if micro == 1:
            raise OutOfMemory(f"out of memory at step {step + 1} with micro-batches of 1 image, which cannot be cut "
                              f"further ({error}); lower the batch or the input size")
        self._set_split(self.split * parts)
        if next(unwrap(self.model).parameters()).is_cuda:
            torch.cuda.empty_cache()
        self.events.event(step + 1, "out_of_memory", {"subdivisions": self.subdivisions, "micro_batch": micro // parts,
                                                  "reason": str(error).splitlines()[0][:200]})


def smallest_prime_factor(n: int) -> int:
    """The smallest prime that divides ``n`` (``n`` itself when prime; 1 for 1)."""
    return next((p for p in range(2, math.isqrt(n) + 1) if n % p == 0), n)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model
