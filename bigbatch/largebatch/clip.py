"""Gradient clipping, once per optimizer step, on unscaled gradients (after the backward passes, before the update).

Three kinds (:class:`~bigbatch.config.ClipConfig` admits at most one):

* global norm: with N = sqrt(sum over all gradient elements of g^2), every g <- g * min(1, max_norm / N)
  (``torch.nn.utils.clip_grad_norm_``; Pascanu et al. 2013; MegDet uses 3.0 from step 300);
* value: every element g <- clamp(g, -max_value, max_value) (``torch.nn.utils.clip_grad_value_``);
* adaptive (AGC, Brock et al. 2021, "High-Performance Large-Scale Image Recognition Without Normalization",
  arXiv:2102.06171, sec. 4.1), unit-wise: see :func:`adaptive_clip_grad_`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from bigbatch.config import ClipConfig


def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """The 2-norm of each unit (output row / filter): over all dims but the first; one norm for 0-d and 1-d tensors.

    PyTorch keeps the output dimension first in Linear and ConvNd weights, so the units are ``x[i]``.
    """
    if x.ndim <= 1:
        return torch.linalg.vector_norm(x)
    return torch.linalg.vector_norm(x, dim=tuple(range(1, x.ndim)), keepdim=True)


@torch.no_grad()
def adaptive_clip_grad_(parameters: Iterable[torch.Tensor], clip_factor: float, eps: float = 1e-3) -> None:
    """Adaptive gradient clipping (Brock et al. 2021, eq. 3), in place, as ``timm.utils.agc.adaptive_clip_grad``.

    For each unit i of each parameter W with gradient G (``unitwise_norm``)::

        limit_i = clip_factor * max(||W_i||, eps)
        G_i <- G_i                                  if ||G_i|| < limit_i
        G_i <- G_i * limit_i / max(||G_i||, 1e-6)   otherwise
    """
    for p in parameters:
        if p.grad is None:
            continue
        grad = p.grad.detach()
        limit = unitwise_norm(p.detach()).clamp(min=eps).mul_(clip_factor)
        norm = unitwise_norm(grad)
        clipped = grad * (limit / norm.clamp(min=1e-6))
        grad.copy_(torch.where(norm < limit, grad, clipped))


def clip_gradients(cfg: ClipConfig, parameters: Iterable[torch.Tensor], step: int) -> float | None:
    """Clip the gradients of ``parameters`` as ``cfg`` says, at optimizer step ``step`` (0-based).

    Nothing happens before ``cfg.start_step``. Returns the global gradient 2-norm before clipping when clipping
    by norm (inf or nan if a gradient is not finite; the gradients are then not finite either), else None.
    """
    if step < cfg.start_step:
        return None
    params = [p for p in parameters if p.grad is not None]
    if cfg.max_norm is not None:
        return float(torch.nn.utils.clip_grad_norm_(params, cfg.max_norm))
    if cfg.max_value is not None:
        torch.nn.utils.clip_grad_value_(params, cfg.max_value)
    elif cfg.agc is not None:
        adaptive_clip_grad_(params, cfg.agc, cfg.agc_eps)
    return None
