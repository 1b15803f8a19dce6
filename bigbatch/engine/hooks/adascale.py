"""``batch: {mode: adaptive, ...}``: AdaScale's measurement, gain and progress (``largebatch/adascale.py``).

On every process: before each step the gain r from the estimates so far (and the EMA's decay per step, ``d ** r``);
where that step finishes the base schedule, the run's last step is that one. Each micro-batch's gradient norms are
taken as autograd hands them over (hooks on the parameters, ``telemetry/noise_scale.py``); after the step every
process's sums are all-reduced in one fixed collective, so that every process updates the same estimates and takes
the same steps. The training record gets ``gain`` (r), ``scale`` (B / B0), ``batch`` and ``progress`` (base steps
done). The estimates and the progress are the hook's state: a resumed run goes on from the checkpoint's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS
from bigbatch.state_schema import Schema
from bigbatch.telemetry.noise_scale import MicroBatchGradients, batch_sizes


class AdaScaleHook(Hook):
    stage = "measure"

    def __init__(self, run: Run) -> None:
        assert run.adascale is not None
        self.adascale = run.adascale
        self.tracker = MicroBatchGradients(world=run.plan.world)
        self.reduce = torch.distributed.all_reduce if run.plan.world > 1 else None

    def state_dict(self) -> dict[str, Any]:
        return self.adascale.state_dict()

    def state_schema(self) -> Schema:
        return self.adascale.state_schema()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adascale.load_state_dict(state)

    def before_step(self, run: Run) -> None:
        adascale = self.adascale
        r = adascale.begin_step(run.train_step.plan.batch)
        if run.state.ema is not None:
            run.state.ema.per_step_power = r  # the EMA's decay per base step, over r base steps
        if adascale.last_step:  # the run's last step: the last evaluation and checkpoint are due after it
            run.plan = dataclasses.replace(run.plan, steps=run.step + 1)

    def before_train(self, run: Run) -> None:
        self.tracker.attach(run.model.parameters())

    def before_forward(self, run: Run, index: int) -> None:
        if index == 0:  # every attempt starts afresh: a re-run or re-cut step measures its own gradients
            self.tracker.begin_step(run.train_step.scaler.scale, run.train_step.attempt_micro_batches)

    def after_backward(self, run: Run, index: int) -> None:
        self.tracker.after_backward(index)

    def after_step(self, run: Run) -> dict[str, Any]:
        norms = self.tracker.end_step(self.reduce)
        step = run.train_step
        small, big = batch_sizes(step.plan.micro_batch // step.split, step.subdivisions, run.plan.world)
        adascale = self.adascale
        adascale.end_step(norms, small, big)
        values = {"gain": round(adascale.gain, 6), "scale": round(adascale.scale, 6), "batch": adascale.batch,
                  "progress": round(adascale.progress, 6)}
        grown = adascale.grown_batch()  # grow: true, the same on every process (all-reduced measurements)
        if grown is not None and not adascale.finished:
            run.plan = run.plan.grown(run.state.step, grown)
            step.replan(run.plan)
            run.events.event(run.state.step, "batch_grown", {"batch": grown, "noise_scale": adascale.noise.b_simple},
                             f"step {run.state.step}: the gradient noise scale, ~{adascale.noise.b_simple:,.0f} "
                             f"images, is at least twice the batch: the batch doubles to {grown} (AdaScale scale "
                             f"{grown / adascale.base:g})")
        return values

    def after_train(self, run: Run) -> None:
        self.tracker.detach()
        adascale = self.adascale
        if run.plan.world > 1 and adascale.finished:  # every process took the same steps (else they diverged)
            mine = torch.tensor([float(run.state.step), adascale.progress], dtype=torch.float64,
                                device=run.proc.device)  # NCCL gathers device tensors only
            gathered = [torch.empty_like(mine) for _ in range(run.plan.world)]
            torch.distributed.all_gather(gathered, mine)
            if any(not torch.equal(g, gathered[0]) for g in gathered):
                raise RuntimeError(f"AdaScale: the processes disagree on (steps, progress): "
                                   f"{[g.tolist() for g in gathered]}")
        run.events.event(run.state.step, "adascale", {"steps": run.state.step, "progress": adascale.progress,
                                                      "base_steps": adascale.total},
                         f"AdaScale: {run.state.step} steps of {adascale.batch} images made {adascale.progress:.1f} "
                         f"base steps of {adascale.base} (the base recipe's {adascale.total}): "
                         f"{adascale.progress / max(run.state.step, 1):.2f} base steps per step")


HOOKS.register("adascale", lambda run: AdaScaleHook(run) if run.adascale is not None else None)
