"""The advisor's measurement: a few training steps of the config on the device at hand, in this process, and what
the model (``model.py``) needs from them. It trains nothing past them and writes nothing.

Each step is training's own (``engine/parts.py``'s step, the run's data order and loader), with the phase clock
read at every step (``engine/phases.py``: data, forward, backward, sync, update, other) and the micro-batch
gradients measured (``telemetry/noise_scale.py``): per step the unbiased estimates of |G|^2 and tr(Sigma) at
B_small = the micro-batch and B_big = the step's batch. The first step is a warm-up (allocations, kernels chosen)
and is not counted. A step needs two micro-batches for the noise estimate: the measured batch is cut so.

From them: the forward and backward of one micro-batch (mean and spread over the steps), its backward, the rest of
the step, the input pipeline's seconds per image (the wait for the data; with ``data.workers`` the pipeline alone,
timed over as many steps after the measurement), the gradient's bytes, the BatchNorm layers and the bytes of one's
statistics all-reduce, and B_simple with its bootstrap spread (``model.noise_scale_of_steps``).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from bigbatch.advisor.model import StepMeasurement, noise_scale_of_steps
from bigbatch.advisor.pair import PairMeasured
from bigbatch.advisor.session import Session, batchnorm_sizes
from bigbatch.config import RunConfig
from bigbatch.errors import UserError


@dataclass(frozen=True)
class Measured:
    step: StepMeasurement
    batch: int
    """The measured step's global batch (one device)."""
    subdivisions: int
    steps: int
    """Steps measured (the warm-up not counted)."""
    noise_scale: float | None
    noise_scale_sd: float | None
    device: str
    pair: PairMeasured | None = None
    """The two-process measurement (``pair.py``) whose overlap, wait and BN sums ``step`` holds; None: not made."""
    pair_note: str = ""
    """Why there is no pair measurement ("" where there is one, or where one device only was asked for)."""

    def to_json(self) -> dict[str, Any]:
        plain = {k: v for k, v in asdict(self).items() if k not in ("step", "pair")}
        return {**plain, "step": asdict(self.step), "pair": self.pair.to_json() if self.pair else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measured:
        pair = PairMeasured(**data["pair"]) if data.get("pair") else None
        return cls(**{**data, "step": StepMeasurement(**data["step"]), "pair": pair})

    def with_pair(self, pair: PairMeasured) -> Measured:
        """The measurement with the pair's overlap, wait and BN sums in its step."""
        step = replace(self.step, overlap=pair.overlap, overlap_sd=pair.overlap_sd, wait_s=pair.wait_s,
                       wait_sd=pair.wait_sd, bn_collective_s=pair.bn_collective_s,
                       bn_collective_sd=pair.bn_collective_sd)
        return replace(self, step=step, pair=pair, pair_note="")


def measured_layout(batch: int, largest_micro_batch: int) -> tuple[int, int]:
    """(micro-batch, subdivisions) of the measured step: the largest micro-batch that fits and divides the batch,
    cut to two micro-batches at least (the noise estimate needs two)."""
    from bigbatch.advisor.model import micro_batch_for

    if batch < 2:
        raise UserError(f"batch: {batch} image(s) cannot be cut into the 2 micro-batches the noise scale needs")
    micro = micro_batch_for(batch, 1, min(largest_micro_batch, batch // 2))
    if micro is None:  # pragma: no cover - micro_batch_for(b, 1, >= 1) always has 1
        raise UserError(f"batch: {batch} cannot be cut into micro-batches")
    return micro, batch // micro


class _NoiseHooks:
    """The step's micro-batch hooks: the noise scale's tracker around each micro-batch (as the noise-scale hook)."""

    def __init__(self, tracker: Any, train_step: Any) -> None:
        self.tracker, self.train_step = tracker, train_step

    def before_forward(self, index: int) -> None:
        if index == 0:
            self.tracker.begin_step(self.train_step.scaler.scale, self.train_step.attempt_micro_batches)

    def after_backward(self, index: int) -> None:
        self.tracker.after_backward(index)


def measure(cfg: RunConfig, micro_batch: int, steps: int) -> Measured:
    """``steps`` training steps (after one warm-up) at the config's batch in micro-batches of ``micro_batch`` (two
    at least per step), on this process's device."""
    from bigbatch.floor.distributed import setup
    from bigbatch.telemetry.noise_scale import (
        MicroBatchGradients,
        batch_sizes,
        gradient_sq_estimate,
        trace_sigma_estimate,
    )

    proc = setup()
    micro, subdivisions = measured_layout(cfg.batch, micro_batch)
    batch = micro * subdivisions
    total = steps + 1
    # the pipeline's own timing (data.workers) reads as many steps again after the measured ones
    session = Session(cfg, proc, batch, micro, total + steps)
    cfg = session.cfg
    tracker = MicroBatchGradients(world=1)
    tracker.attach(session.parts.model.parameters())
    hooks = _NoiseHooks(tracker, session.parts.step)
    small, big = batch_sizes(micro, subdivisions, 1)
    times: list[dict[str, float]] = []
    gradient_sq: list[float] = []
    trace_sigma: list[float] = []
    batches = session.loader(0, total)
    try:
        for step in range(total):
            measured = session.step(step, batches, hooks)
            norms = tracker.end_step()
            if step == 0:
                continue  # the warm-up
            if measured is not None:
                times.append(measured)
            if norms is not None:
                gradient_sq.append(gradient_sq_estimate(norms.small_sq, small, norms.big_sq, big))
                trace_sigma.append(trace_sigma_estimate(norms.small_sq, small, norms.big_sq, big))
    finally:
        tracker.detach()
        del batches
    data_s = statistics.fmean(t["t_data"] for t in times) / batch
    if cfg.data.workers > 0:  # the pipeline alone: how fast the workers make batches, training or not
        start = time.perf_counter()
        for _ in session.loader(total, total + steps):
            pass
        data_s = (time.perf_counter() - start) / (steps * batch)
    per_step = [(t["t_forward"] + t["t_backward"]) / subdivisions for t in times]
    spread = statistics.stdev(per_step) * math.sqrt(subdivisions) if len(per_step) > 1 else 0.0
    model = session.parts.model
    bn_layers, bn_bytes = batchnorm_sizes(model)
    step = StepMeasurement(
        micro_batch=micro,
        compute_s=statistics.fmean(per_step),
        compute_sd=spread,
        backward_s=statistics.fmean(t["t_backward"] for t in times) / subdivisions,
        update_s=statistics.fmean(t["t_update"] + t["t_other"] + t["t_sync"] for t in times),
        data_s_per_image=data_s,
        data_workers=cfg.data.workers,
        gradient_bytes=sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
        bn_layers=bn_layers,
        bn_bytes=bn_bytes,
        bn_sync=cfg.norm.sync != "none",
    )
    noise = noise_scale_of_steps(gradient_sq, trace_sigma)
    device = torch.cuda.get_device_name(proc.device) if proc.device.type == "cuda" else "cpu"
    return Measured(step, batch, subdivisions, len(times), noise[0] if noise else None, noise[1] if noise else None,
                    device)
