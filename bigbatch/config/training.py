"""The sections of how each step trains besides the optimizer: weight EMA (``ema``), BatchNorm statistics
(``norm``), mixed precision and loss scaling (``precision``), the classification loss (``loss``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from bigbatch.config.section import Section
from bigbatch.config.values import COMPLEMENT, POWER, PerStep


class EMAConfig(Section):
    """Exponential moving average of the weights, updated once per applied optimizer step."""

    decay: Annotated[float, PerStep(POWER)] | None = Field(None, gt=0, lt=1)
    """EMA decay per optimizer step (Cloud TPU's Inception v3 recipe: 0.995); unset: no EMA."""
    warmup: bool = False
    """Use min(decay, (1 + n) / (10 + n)) at the n-th update (TensorFlow's num_updates rule)."""
    evaluate: bool = True
    """Evaluate the EMA weights (and pick ``best.pt`` by them); the raw weights are evaluated too."""


class NormConfig(Section):
    """BatchNorm running statistics."""

    running_stats: Literal["per_microbatch", "per_step"] = "per_microbatch"
    """``per_microbatch``: PyTorch's update after every forward; ``per_step``: the step's micro-batch sums and
    counts are pooled and the running mean and variance updated once per optimizer step."""
    momentum: Annotated[float, PerStep(COMPLEMENT)] | None = Field(None, gt=0, lt=1)
    """BN momentum per optimizer step (PyTorch convention: running = (1 - m) running + m batch_stat);
    converted to each update with beta = alpha ** (1 / updates per step). Unset: the model's own."""
    half_life_images: float | None = Field(None, gt=0)
    """Alternatively, the number of images after which an observation's weight halves, counted as the images the
    running statistics average: every device's under ``norm.sync``, rank 0's without (a window of world x H
    training images)."""
    sync: Literal["none", "bigbatch", "torch"] = "none"
    """Cross-device BatchNorm under torchrun: ``bigbatch`` (one packed fp32 all-reduce per layer and direction,
    CPU and GPU), ``torch`` (torch.nn.SyncBatchNorm, CUDA only), ``none`` (each device its own statistics)."""
    freeze_during_warmup: bool = False
    """BatchNorm layers in eval mode (normalising with the running statistics, which stay as they are) until the
    schedule's warmup ends, as MegDet's training loop (``if iter < warmup_iters: bn.eval()``); the scales and
    shifts still learn."""

    @model_validator(mode="after")
    def _one_momentum(self) -> NormConfig:
        if self.momentum is not None and self.half_life_images is not None:
            raise ValueError("norm.momentum: give norm.momentum or norm.half_life_images, not both")
        return self


class PrecisionConfig(Section):
    """Mixed precision (autocast, fp32 master weights) and loss scaling; see ``largebatch/precision.py``."""

    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    loss_scale: Literal["auto", "none", "dynamic", "update_ratio"] | float = "auto"
    """``auto`` (dynamic for fp16, none otherwise), ``none``, a number (static), ``dynamic``
    (torch.amp.GradScaler's rule) or ``update_ratio`` (the rule of the Darknet-on-Jetson write-up,
    docs/references.md)."""
    init_scale: float = Field(2.0**16, gt=0)
    """The first scale (``update_ratio``: its base scale, 1.0 unless given)."""
    growth_factor: float = Field(2.0, gt=1)
    backoff_factor: float = Field(0.5, gt=0, lt=1)
    growth_interval: int = Field(2000, gt=0)
    """Clean steps in a row before the scale grows (dynamic)."""
    hysteresis: int = Field(1, gt=0)
    """Overflows tolerated before backing off (dynamic; 1 is GradScaler's rule)."""
    min_scale: float = Field(0.0, ge=0)
    max_scale: float = Field(2.0**24, gt=0)
    burn_in: int | None = Field(None, ge=0)
    """update_ratio: steps ruled by the update ratio (default: the Darknet schedule's burn_in, else 1000)."""
    double_every: int = Field(1000, gt=0)
    """update_ratio: after burn_in, double the scale after this many clean steps in a row."""
    max_skipped: int = Field(20, gt=0)
    """Stop the run (exit code 1) after this many non-finite steps in a row."""

    @model_validator(mode="before")
    @classmethod
    def _from_dtype(cls, value: Any) -> Any:
        return {"dtype": value} if isinstance(value, str) else value  # ``precision: bf16`` shorthand

    @field_validator("loss_scale")
    @classmethod
    def _positive_scale(cls, value: Any) -> Any:
        if isinstance(value, float) and value <= 0:
            raise ValueError(f"precision.loss_scale: expected a positive number, got {value}")
        return value


class LossConfig(Section):
    """Classification loss: cross-entropy with label smoothing, plus an auxiliary head's
    (``tasks/classification.py``)."""

    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """s: the target puts 1 - s on the true class and s / classes on each (Inception v3 TPU recipe: 0.1)."""
    aux_weight: float = Field(0.4, ge=0)
    """Weight of the auxiliary head's loss, for models built with one (``model.aux_logits``; Inception v3: 0.4)."""
