"""Mixed precision: autocast to bf16 or fp16 with fp32 master weights, and loss scalers.

The weights, gradients and optimizer state stay fp32; only the forward (and so the backward)
runs in the lower precision under ``torch.autocast``. fp16's small range needs the loss scaled
up before the backward and the gradients scaled back down before clipping and the update:

- ``static``: a fixed scale;
- ``dynamic``: torch.amp.GradScaler's rule. Start at ``init_scale`` (2**16); a step with an inf/NaN
  gradient is skipped and the scale multiplied by ``backoff_factor`` (0.5); after
  ``growth_interval`` (2000) clean steps in a row it is multiplied by ``growth_factor`` (2).
  ``hysteresis`` H: back off only at the H-th overflow since the last growth or backoff (H = 1
  is GradScaler's rule; Megatron-LM calls the same idea hysteresis). ``min_scale`` / ``max_scale``
  bound it;
- ``update_ratio``: the rule of the write-up "Darknet/YOLO optimized for Jetson" (docs/references.md),
  read as follows where its text is ambiguous:
    * "halve on NaN or Inf in dW": a step whose gradients are not finite is skipped and the base
      scale s0 halved;
    * "until burn_in, set from max magnitude of the current iteration / max magnitude of all
      iterations so far": with u_t the largest |gradient| (unscaled) of any convolution's weight
      this step (of any parameter if the model has no convolution) and U_t = max(u_1..u_t), the
      scale for the next step is s0 * U_t / u_t rounded down to a power of two (a power of two
      keeps the scaling exact in binary): when the updates shrink by 2**10 from their peak, the
      scale grows by 2**10, quickly, as the write-up wants;
    * "after burn_in, doubled every 1000 iterations": from then on the scale is multiplied by 2
      after every ``double_every`` clean steps in a row (and halved on an overflow), as ``dynamic``;
    * burn_in is ``precision.burn_in`` (default: the Darknet schedule's burn_in, else 1000).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn

from bigbatch.config import PrecisionConfig, ScheduleConfig
from bigbatch.errors import UserError
from bigbatch.registry import SCHEDULES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP32_MAX = torch.finfo(torch.float32).max


def autocast(cfg: PrecisionConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward's autocast context (a no-op in fp32)."""
    if cfg.dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[cfg.dtype])


def check_precision(cfg: PrecisionConfig, device: torch.device) -> None:
    """fp16 needs a device with fp16 arithmetic: refuse it on the CPU with a clear message."""
    if cfg.dtype == "fp16" and device.type == "cpu":
        raise UserError("precision.dtype: fp16 needs a CUDA device (this run is on the CPU); use bf16 on the CPU")
    if cfg.dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("precision.dtype: this CUDA device has no bf16 support; use fp16")


def grads_are_finite(parameters: Iterable[torch.Tensor]) -> bool:
    """True when no gradient holds an inf or NaN. The check is torch's own for its ``GradScaler``
    (``torch._amp_foreach_non_finite_check_and_unscale_``, a fused pass over each device's and dtype's gradients)
    with an unscale factor of 1, which leaves every value as it is: ResNet-18's 11.7 M gradients in 4 ms on the
    2-core CPU, against 32 ms for an ``isfinite(g).all()`` per tensor (a sparse gradient takes that path)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if any(g.is_sparse for g in grads):
        return bool(torch.stack([torch.isfinite(g.coalesce().values()).all() for g in grads]).all())
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    found = []
    for (device, _), group in groups.items():
        found_inf, one = torch.zeros(1, device=device), torch.ones(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, one)
        found.append(found_inf)
    return not found or not bool(torch.cat([f.cpu() for f in found]).any())


def first_nonfinite(model: nn.Module) -> str | None:
    """The name of the first parameter (in module order) whose gradient holds an inf or NaN."""
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return name
    return None


class LossScaler:
    """Scales the loss before backward; unscales gradients and decides whether the step is applied. This class: a fixed
    scale (``precision.loss_scale`` none: 1, or a number: static)."""

    def __init__(self, scale: float = 1.0):
        self.scale = float(scale)

    @property
    def kind(self) -> str:
        """``precision.loss_scale``'s name for this scaler, kept in its state: a resume loads a state of its own kind
        only (:meth:`resume`)."""
        return "none" if self.scale == 1.0 else "static"

    def describe(self) -> str:
        return self.kind if self.kind == "none" else f"static (scale {self.scale:g})"

    def unscale_(self, parameters: Iterable[torch.Tensor]) -> bool:
        """Divide the gradients by the scale; True when they are all finite (the step may be applied)."""
        parameters = list(parameters)
        if self.scale != 1.0:
            for p in parameters:
                if p.grad is not None:
                    p.grad.div_(self.scale)
        return grads_are_finite(parameters)

    def update(self, finite: bool, model: nn.Module | None = None) -> None:
        """After a step: adjust the scale (a static scaler keeps it)."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = state["scale"]

    def fits(self, state: dict[str, Any]) -> bool:
        """Whether a saved state is this scaler's to go on from: the same kind (a fixed scale: the same scale, which is
        all its state)."""
        return saved_kind(state) == self.kind and (self.kind != "static" or state["scale"] == self.scale)

    def resume(self, state: dict[str, Any]) -> str | None:
        """Go on from a checkpoint's scaler state when it :meth:`fits` (returns None); else keep this scaler as
        configured, fresh, and return the line that says so (a run resumed with another ``precision.loss_scale``,
        as the non-finite stop suggests: loading a dynamic state into a fixed scaler kept its scale, the other way
        round it had no ``clean_steps``)."""
        if not isinstance(state, dict) or not isinstance(state.get("scale"), (int, float)):
            held = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise UserError(f"checkpoint: 'scaler' holds no loss scale ({held})")
        if not self.fits(state):
            return (f"the checkpoint's loss scaler is {describe_state(state)}, this run's {self.describe()}: it starts "
                    f"fresh at scale {self.scale:g}")
        try:
            self.load_state_dict(state)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"checkpoint: 'scaler' ({saved_kind(state)}) lacks or mistypes {e}") from None
        return None


class DynamicLossScaler(LossScaler):
    """torch.amp.GradScaler's rule, with hysteresis and bounds (see the module docstring)."""

    @property
    def kind(self) -> str:
        return "dynamic"

    def describe(self) -> str:
        return self.kind

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, hysteresis: int = 1, min_scale: float = 0.0,
                 max_scale: float = math.inf):
        super().__init__(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self.min_scale, self.max_scale = min_scale, max_scale
        self.clean_steps = 0
        self.overflows = 0

    def update(self, finite: bool, model: nn.Module | None = None) -> None:
        if finite:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                grown = self.scale * self.growth_factor
                if grown <= FP32_MAX:  # GradScaler keeps its scale in fp32 and never lets it become inf
                    self.scale = min(grown, self.max_scale)
                self.clean_steps, self.overflows = 0, 0
            return
        self.clean_steps = 0
        self.overflows += 1
        if self.overflows >= self.hysteresis:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.overflows = 0

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "scale": self.scale, "clean_steps": self.clean_steps, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.clean_steps, self.overflows = state["scale"], state["clean_steps"], state["overflows"]


def max_update_magnitude(model: nn.Module) -> float:
    """Largest |gradient| over the convolutions' weights (over all parameters without convolutions)."""
    convs = [m.weight for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    params = [p for p in (convs or list(model.parameters())) if p.grad is not None]
    if not params:
        return 0.0
    return float(torch.stack([p.grad.detach().abs().max() for p in params]).max())


class UpdateRatioLossScaler(DynamicLossScaler):
    """The Darknet-on-Jetson write-up's rule (see the module docstring): ratio-driven until burn_in, then doubling."""

    @property
    def kind(self) -> str:
        return "update_ratio"

    def __init__(self, init_scale: float = 1.0, burn_in: int = 1000, double_every: int = 1000,
                 min_scale: float = 0.0, max_scale: float = 2.0**24):
        super().__init__(init_scale, growth_interval=double_every, min_scale=min_scale, max_scale=max_scale)
        self.base = float(init_scale)
        self.burn_in = burn_in
        self.applied = 0
        self.peak = 0.0

    def update(self, finite: bool, model: nn.Module | None = None) -> None:
        if self.applied >= self.burn_in:
            if finite:
                self.applied += 1
            super().update(finite)
            return
        if not finite:
            self.base = max(self.base * 0.5, self.min_scale)
            self.scale = max(self.scale * 0.5, self.min_scale)
            return
        self.applied += 1
        assert model is not None, "update_ratio needs the model to read its gradient magnitudes"
        current = max_update_magnitude(model)
        self.peak = max(self.peak, current)
        if current > 0:
            ratio = self.peak / current  # >= 1: how far the updates have shrunk from their peak
            self.scale = min(2.0 ** math.floor(math.log2(self.base * ratio)), self.max_scale)
            self.scale = max(self.scale, self.min_scale)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "base": self.base, "applied": self.applied, "peak": self.peak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.base, self.applied, self.peak = state["base"], state["applied"], state["peak"]


def saved_kind(state: dict[str, Any]) -> str:
    """The kind of scaler a saved state is of: its ``kind``; in a checkpoint written before scalers kept it, read from
    its keys (``base``: update_ratio; ``clean_steps``: dynamic; a scale alone: none at 1, else static)."""
    kind = state.get("kind")
    if isinstance(kind, str):
        return kind
    if "base" in state:
        return "update_ratio"
    if "clean_steps" in state:
        return "dynamic"
    return "none" if state.get("scale") == 1.0 else "static"


def describe_state(state: dict[str, Any]) -> str:
    """A saved scaler state in words: its kind, with its scale where it has one."""
    kind = saved_kind(state)
    return kind if kind == "none" else f"{kind} (scale {state.get('scale'):g})"


def schedule_burn_in(schedule: ScheduleConfig) -> int:
    """The steps of the schedule's burn-in, ``update_ratio``'s default: what the preset registered as its ``burn_in``
    (Darknet's ``burn_in``), else 0."""
    burn_in = SCHEDULES.get(schedule.preset).info.get("burn_in")
    return burn_in(schedule) if burn_in is not None else 0


def build_scaler(cfg: PrecisionConfig, schedule_burn_in: int = 0) -> LossScaler:
    """The scaler ``precision.loss_scale`` asks for; ``auto``: dynamic for fp16, none otherwise."""
    kind = cfg.loss_scale
    if kind == "auto":
        kind = "dynamic" if cfg.dtype == "fp16" else "none"
    if kind == "none":
        return LossScaler(1.0)
    if kind == "dynamic":
        return DynamicLossScaler(cfg.init_scale, cfg.growth_factor, cfg.backoff_factor, cfg.growth_interval,
                                 cfg.hysteresis, cfg.min_scale, cfg.max_scale)
    if kind == "update_ratio":
        burn_in = cfg.burn_in if cfg.burn_in is not None else (schedule_burn_in or 1000)
        init = cfg.init_scale if "init_scale" in cfg.model_fields_set else 1.0
        return UpdateRatioLossScaler(init, burn_in, cfg.double_every, cfg.min_scale, cfg.max_scale)
    return LossScaler(float(kind))  # a number: static
