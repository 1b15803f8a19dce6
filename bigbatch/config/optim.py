"""The ``optim`` and ``clip`` sections: the optimizer and gradient clipping, and the keys each built-in optimizer
adds to ``optim`` (:data:`OPTIMIZER_KEYS`; ``largebatch/optim.py`` registers each with its entry)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from bigbatch.config.section import PartSection, Section, registered
from bigbatch.config.values import StepCount
from bigbatch.registry import OPTIMIZERS


def _tuple_from_list(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# The keys each optimizer adds to ``optim`` (a key several optimizers share is the same field in each).
MOMENTUM = {"momentum": (Annotated[float, Field(ge=0, lt=1)], 0.9)}
"""``optim.momentum``: the momentum coefficient m."""
NESTEROV = {"nesterov": (bool, False)}
EPS = {"eps": (Annotated[float, Field(gt=0)] | None, None)}
"""``optim.eps``: epsilon; unset: the optimizer's default (rmsprop_tf 1.0 as in Cloud TPU's Inception v3 recipe,
adamw and lars 1e-8, lamb 1e-6 as timm)."""
BETAS = {"betas": (Annotated[tuple[float, float], BeforeValidator(_tuple_from_list)], (0.9, 0.999))}
"""``optim.betas``: Adam-style moment decays (adamw, lamb)."""
RMSPROP_DECAY = {"rmsprop_decay": (Annotated[float, Field(gt=0, lt=1)], 0.9)}
"""``optim.rmsprop_decay``: RMSProp's mean-square decay (TF's ``decay``; Cloud TPU's Inception v3 recipe: 0.9)."""
FUSED = {"fused": (bool, False)}
"""``optim.fused``: torch's fused AdamW, one kernel over all the parameters (CPU and CUDA) instead of the
multi-tensor ``foreach`` one: the same update, rounded differently (its results differ in the last bits)."""
TRUST_COEFFICIENT = {"trust_coefficient": (Annotated[float, Field(gt=0)], 0.001)}
"""``optim.trust_coefficient``: LARS's trust coefficient."""

OPTIMIZER_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    "sgd": {**MOMENTUM, **NESTEROV},
    "momentum": {**MOMENTUM, **NESTEROV},
    "rmsprop_tf": {**MOMENTUM, **EPS, **RMSPROP_DECAY},
    "adamw": {**EPS, **BETAS, **FUSED},
    "lars": {**MOMENTUM, **NESTEROV, **EPS, **TRUST_COEFFICIENT},
    "lamb": {**EPS, **BETAS},
}
"""The keys each built-in optimizer adds to ``optim``, by name."""


class OptimConfig(PartSection):
    """The optimizer. ``lr`` is stated for ``ref_batch`` images per step and scaled to the global batch."""

    parts = OPTIMIZERS
    builtin_keys = OPTIMIZER_KEYS
    layout = ("name", "lr", "ref_batch", "scaling", "momentum", "nesterov", "weight_decay", "no_decay_norm_bias",
              "eps", "betas", "rmsprop_decay", "trust_coefficient", "momentum_correction", "backbone_lr_scale")
    """The order config.yaml has always written these keys in, the optimizers' own (``largebatch/optim.py``:
    momentum, betas, eps, ...) among the shared ones."""

    name: Annotated[str, registered(OPTIMIZERS)] = "sgd"
    """``sgd``: torch.optim.SGD (LR outside the momentum buffer); ``momentum``: Caffe2's momentum SGD, Goyal et al.
    eq. 10 (v = m v + lr g; w -= v: LR inside the buffer); ``rmsprop_tf``: TF RMSProp; ``adamw``; ``lars``;
    ``lamb`` (as timm's: it also clips the global gradient norm at 1.0, and like ``lars`` applies its trust ratio
    only to parameters with weight decay)."""
    lr: float = Field(0.1, gt=0)
    """Learning rate for ``ref_batch`` images per step (for the global batch itself when ``ref_batch`` is unset)."""
    ref_batch: int | None = Field(None, gt=0)
    """The batch ``lr`` is stated for; unset: ``lr`` is used as it is, whatever the batch."""
    scaling: Literal["linear", "sqrt", "none"] = "linear"
    """How ``lr`` follows the batch: lr * (batch / ref_batch) (Goyal et al. 2017), its square root, or not at all."""
    weight_decay: float = Field(0.0, ge=0)
    no_decay_norm_bias: bool = False
    """No weight decay on normalisation layers' parameters and on biases (1-d parameters), nor on what a module's
    own ``no_weight_decay()`` names (a timm ViT's position embedding and class token), as timm's optimizer factory
    splits them."""
    backbone_lr_scale: float = Field(1.0, gt=0)
    """The backbone's LR as a fraction of the rest's (the head learns faster when fine-tuning: 0.1 is common); the
    backbone is ``model.freeze: backbone``'s (``largebatch/freeze.py``). Multiplies the LR of every step, inside
    LARS's and LAMB's trust ratio, AdaScale's gain and the warmup alike; the weight-decay groups stay as they are."""
    momentum_correction: bool = False
    """For optimizers with the LR inside the momentum buffer (momentum, rmsprop_tf): when the LR changes from
    lr_old to lr_new, scale the buffer by lr_new / lr_old (Goyal et al. 2017, remark 2); a no-op for the others."""


class ClipConfig(Section):
    """Gradient clipping, at most one kind; applied to unscaled gradients, once per optimizer step."""

    max_norm: float | None = Field(None, gt=0)
    """Clip the global 2-norm of all gradients to this (MegDet: 3.0 from step 300)."""
    max_value: float | None = Field(None, gt=0)
    """Clip every gradient element to [-max_value, max_value]."""
    agc: float | None = Field(None, gt=0)
    """Adaptive gradient clipping factor (Brock et al. 2021): unit-wise ||g|| <= agc * max(||w||, eps)."""
    agc_eps: float = Field(1e-3, gt=0)
    start_step: StepCount = Field(0, ge=0)
    """Clip from this optimizer step on (0-based)."""

    @model_validator(mode="after")
    def _one_kind(self) -> ClipConfig:
        kinds = [k for k in ("max_norm", "max_value", "agc") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"clip.{kinds[1]}: give one of clip.max_norm, clip.max_value, clip.agc, not several")
        return self
