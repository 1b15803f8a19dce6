"""Cross-device BatchNorm: batch statistics of the whole global batch, one all-reduce per layer and direction.

Seed: MegDet (Peng et al., "MegDet: A Large Mini-Batch Object Detector", CVPR 2018), section "Cross-GPU Batch
Normalization": each device computes its partial sums, one reduction gives the global statistics, every
device normalises with them, and the backward reduces the gradient sums the same way. The backward formulas
follow PyTorch's ``torch.nn.modules._functions.SyncBatchNorm``, re-implemented so that it runs on CPU / Gloo
too: instead of the CUDA-only ``torch.batch_norm_*`` kernels it feeds the global statistics to torch's fused
batch-norm kernels, which exist on every device.

**Forward** (training, per channel c, over the N * prod(spatial) elements of this process's input x, cast to
float32 for the statistics even under autocast; a float64 input is computed in float32 too, and its output and
gradient cast back):

    local  = [ sum_i x_ic  (C values) | sum_i x_ic ** 2  (C values) | n_local  (1 value) ]      (float32)
    global = all_reduce(local, SUM)                                                             (ONE call)
    n = global count,  mean_c = S1_c / n,  var_c = max(S2_c / n - mean_c ** 2, 0)   (biased, for normalising)
    x_hat = (x - mean) * invstd,  invstd = 1 / sqrt(var + eps),  y = weight * x_hat + bias   (y in x.dtype)
    running_mean = (1 - m) * running_mean + m * mean
    running_var  = (1 - m) * running_var  + m * var * n / (n - 1)                          (unbiased, as torch)

``m`` is the layer's momentum, or 1 / num_batches_tracked when the momentum is None (torch's cumulative
average); ``num_batches_tracked`` grows by one per training forward. A process with an EMPTY batch (0 samples)
contributes zeros, still joins both all-reduces, and returns an empty output, so the statistics are exact for
any split of the global batch, equal or not. On CPU, if the whole global batch has at most one value per
channel, every process raises the same ValueError (they all see the same global count, so none is left
waiting). On CUDA the count is never read back to the host, which would stall the stream at every layer, so
there such a batch is not caught (nor is it by torch.nn.SyncBatchNorm).

**Backward** (g = dL/dy, in float32):

    local  = [ sum_i g_ic  (C) | sum_i g_ic * x_hat_ic  (C) ]
    global = all_reduce(local, SUM)                                                             (ONE call)
    dL/dx  = weight * invstd * (g - global_sum_g / n - x_hat * global_sum_g_xhat / n)
    dL/dweight = local sum_i g * x_hat,   dL/dbias = local sum_i g

The parameter gradients are this process's share only: like ``torch.nn.SyncBatchNorm``, their reduction over
processes is left to DDP (or whatever reduces the other parameters' gradients). The backward all-reduce is
skipped when the input needs no gradient, as in torch; every process must then agree on that (they do when
they run the same model). Every process must run the forward and the backward of every layer the same number
of times, or the collectives do not line up.

Numerics: the variance is taken as E[x^2] - mean^2 from fp32 sums, so inputs whose per-channel mean is far
larger than their standard deviation lose precision (the same formula as MegDet's single-reduction scheme;
BN inputs after a conv are usually near zero-mean).

Eval mode uses the running statistics and communicates nothing. Without an initialised
``torch.distributed``, or with a world size of 1, the layer is a plain ``F.batch_norm``.

timm's ``BatchNormAct2d`` (``timm/layers/norm_act.py``: a BatchNorm2d whose forward is BN, then ``self.drop``, then
``self.act``) becomes :class:`CrossDeviceBatchNormAct`, the synced BN followed by the same ``drop`` and ``act``, as
timm's own ``convert_sync_batchnorm`` does for ``SyncBatchNorm``. Any other BatchNorm class that overrides
``forward`` is refused (``UserError``): a converted layer would silently drop what its forward adds.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bigbatch.errors import UserError
from bigbatch.floor import host_all_reduce

__all__ = ["CrossDeviceBatchNormFunction", "CrossDeviceBatchNorm", "CrossDeviceBatchNormAct", "all_reduce_routes",
           "convert_batchnorm", "has_norm_act", "refuse_unconvertible"]

_ROUTES: dict[str, str] = {}
"""How this process's sums went, by route ("shared memory", "torch"): the name to show ("shared memory", or the
process group's backend: "gloo", "nccl"); in the order first taken."""


def all_reduce_routes(clear: bool = False) -> list[str]:
    """How this process's cross-device BN sums went since the last ``clear``: ``shared memory``
    (``floor/host_all_reduce.py``) and/or the process group's backend (``gloo``, ``nccl``). The route is decided
    for the whole group at its first sum (the same on every rank); a sum too large for the shared-memory channel takes
    the backend's. ``clear``: forget them after (a run starts)."""
    routes = list(_ROUTES.values())
    if clear:
        _ROUTES.clear()
    return routes


def _taken(route: str, group) -> None:
    if route not in _ROUTES:
        _ROUTES[route] = route if route == "shared memory" else dist.get_backend(group)


def _channel_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Shape a per-channel vector (C,) to broadcast against an input of ``dim`` dimensions (N, C, *)."""
    return t.view(1, -1, *([1] * (dim - 2)))


def _all_reduce_sum(packed: torch.Tensor, group) -> None:
    """Sum ``packed`` (float32) over the process group in place, by the quickest exact route there is.

    A BN all-reduce is a few hundred floats that every process waits for, so its latency is what counts.
    On CPU, where every process of the group is on this machine, it goes through shared memory
    (:mod:`bigbatch.floor.host_all_reduce`, tens of microseconds; ``BIGBATCH_HOST_ALL_REDUCE=off`` turns it off, and
    ``host_all_reduce.channel_for`` says how one machine is told). Otherwise on CPU it is Gloo's all-reduce,
    awaited by polling and yielding the core rather than sleeping in ``wait()``: a core woken from idle takes
    a large part of a sub-millisecond collective to come back. On CUDA it is queued on the stream as usual.
    """
    if packed.device.type != "cpu" or not hasattr(os, "sched_yield"):
        _taken("torch", group)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
        return
    channel = host_all_reduce.channel_for(group)
    if channel is not None and channel.fits(packed):
        _taken("shared memory", group)
        channel.sum_(packed)
        return
    _taken("torch", group)
    work = dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group, async_op=True)
    while not work.is_completed():
        os.sched_yield()
    work.wait()  # raises the collective's error, if any


def _timed(timer, fn, *args):
    """``fn(*args)``, through ``timer`` (the phase clock's ``bn_sync`` sub-phase) where the layer has one."""
    return fn(*args) if timer is None else timer(fn, *args)


class CrossDeviceBatchNormFunction(torch.autograd.Function):
    """Batch norm over the global batch of a process group: one packed all-reduce forward, one backward.

    The element-wise work runs in torch's fused batch-norm kernels (CPU and CUDA), fed the global statistics:
    ``torch.batch_norm`` in inference form normalises in the forward; in the backward
    ``native_batch_norm_backward`` (parameter-gradient outputs only) computes the two gradient sums, and the
    input gradient, rewritten as

        dL/dx = weight * invstd * (g - mean_g) + q * (mean - x),   q = weight * invstd**2 * mean_g_xhat,

    is the inference kernel again (statistics mean_g and var, bias q * mean) plus one fused multiply-add.
    Every other operation is on per-channel vectors: a layer is a fixed, small number of torch calls, which is
    what the smallest layers of a network cost.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, process_group,  # noqa: D102
                timer=None):
        with torch.autocast(device_type=input.device.type, enabled=False):
            x = input.float()  # the same tensor when it is float32 already
            c = x.shape[1]
            n_local = x.numel() // c if c > 0 else 0
            reduce_dims = [0, *range(2, x.dim())]
            packed = x.new_empty(2 * c + 1)  # [sum x | sum x**2 | n_local]
            torch.sum(x, reduce_dims, out=packed[:c])
            torch.sum(x * x, reduce_dims, out=packed[c:2 * c])
            packed[2 * c] = n_local
            _timed(timer, _all_reduce_sum, packed, process_group)
            count = packed[2 * c:]  # the global count stays a tensor: on CUDA, reading it would stall the stream
            if count.device.type == "cpu" and float(count) <= 1:
                raise ValueError(f"Expected more than 1 value per channel when training, got {int(count)} in "
                                 f"the global batch")
            moments = packed[:2 * c].div_(count)  # [E x | E x**2]
            mean = moments[:c]
            var = torch.addcmul(moments[c:], mean, mean, value=-1.0).clamp_min_(0.0)  # biased, for normalising

            if running_mean is not None:
                running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            if running_var is not None:
                unbiased = var * (count / (count - 1.0))  # as torch's running variance
                running_var.lerp_(unbiased.to(running_var.dtype), momentum)

            w = None if weight is None else weight.float()
            # y = (x - mean) / sqrt(var + eps) * weight + bias: the fused kernel, fed the global statistics
            if n_local == 0:  # the fused kernels divide by the element count: an empty input stays empty
                y = x.clone()
            else:
                y = torch.batch_norm(x, w, None if bias is None else bias.float(), mean, var, False, 0.0, eps,
                                     False)

        ctx.save_for_backward(x, w, mean, var, count)
        ctx.eps = eps
        ctx.process_group = process_group
        ctx.timer = timer
        ctx.input_dtype = input.dtype
        ctx.weight_dtype = None if weight is None else weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: D102
        x, w, mean, var, count = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        with torch.autocast(device_type=grad_output.device.type, enabled=False):
            g = grad_output.float().contiguous()
            c = g.shape[1]
            invstd = (var + ctx.eps).rsqrt_()
            # sum_g = sum_i g,  sum_g_xhat = sum_i g * (x - mean) * invstd  (this process's share)
            if g.numel() == 0:
                sum_g_xhat = sum_g = g.new_zeros(c)
            else:
                # a weight is passed even without one: the CUDA kernels need it, the two sums do not depend on it
                _, sum_g_xhat, sum_g = torch.ops.aten.native_batch_norm_backward(
                    g, x, torch.ones_like(mean) if w is None else w, None, None, mean, invstd, True, ctx.eps,
                    [False, True, True])

            if ctx.needs_input_grad[1]:
                grad_weight = sum_g_xhat.to(ctx.weight_dtype)
            if ctx.needs_input_grad[2]:
                grad_bias = sum_g.to(ctx.bias_dtype)

            if ctx.needs_input_grad[0]:
                packed = torch.cat([sum_g, sum_g_xhat])
                _timed(ctx.timer, _all_reduce_sum, packed, ctx.process_group)
                means = packed.div_(count)
                mean_g, mean_g_xhat = means[:c], means[c:]
                q = mean_g_xhat.mul_(invstd).mul_(invstd)
                if w is not None:
                    q.mul_(w)
                if g.numel() == 0:
                    grad_input = g.clone()
                else:
                    grad_input = torch.batch_norm(g, w, q * mean, mean_g, var, False, 0.0, ctx.eps, False)
                    grad_input.addcmul_(x, _channel_view(q, g.dim()), value=-1.0)
                grad_input = grad_input.to(ctx.input_dtype)

        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


class CrossDeviceBatchNorm(_BatchNorm):
    """BatchNorm over the global batch of all processes (input (N, C, *), any number of spatial dims).

    In training with an initialised ``torch.distributed`` of world size > 1 it normalises with the statistics
    of all processes' inputs together (see the module docstring); otherwise it is ``F.batch_norm``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group
        self.sync_timer = None
        """Times the all-reduces as the step's ``t_bn_sync`` (``engine/phases.py``'s ``SubPhase``), or None."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                exponential_average_factor = 1.0 / float(self.num_batches_tracked)
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_buffers = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_buffers else None
        running_var = self.running_var if use_buffers else None

        need_sync = bn_training and self.training and dist.is_available() and dist.is_initialized()
        if need_sync:
            group = self.process_group if self.process_group is not None else dist.group.WORLD
            need_sync = dist.get_world_size(group) > 1
        if not need_sync:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training,
                                exponential_average_factor, self.eps)
        return _synced(input, self.weight, self.bias, running_mean, running_var, self.eps, exponential_average_factor,
                       group, self.sync_timer)


@torch.compiler.disable
def _synced(*args):
    """:class:`CrossDeviceBatchNormFunction` run eagerly where the model is compiled (``model.compile``): its
    all-reduces and their timers are Python that dynamo would trace, and under torchrun it broke the order of the
    collectives ("Received data size doesn't match expected size", 2 processes on the CPU): a graph break instead."""
    return CrossDeviceBatchNormFunction.apply(*args)


class CrossDeviceBatchNormAct(CrossDeviceBatchNorm):
    """timm's ``BatchNormAct2d`` over the global batch: ``act(drop(bn(x)))`` with the cross-device BN, as
    ``BatchNormAct2d.forward`` (timm/layers/norm_act.py). ``drop`` and ``act`` are the converted layer's own modules
    (same state-dict keys)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drop: nn.Module = nn.Identity()  # replaced by the converted layer's (in its order: drop, then act)
        self.act: nn.Module = nn.Identity()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(super().forward(input)))


_CONVERTIBLE = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _norm_act_type() -> type | None:
    """timm's ``BatchNormAct2d`` where timm is loaded, else None (a model holding one has loaded it: this module
    never imports timm)."""
    return getattr(sys.modules.get("timm.layers.norm_act"), "BatchNormAct2d", None)


def has_norm_act(model: nn.Module) -> bool:
    """Whether ``model`` holds a timm ``BatchNormAct2d``."""
    norm_act = _norm_act_type()
    return norm_act is not None and any(isinstance(m, norm_act) for m in model.modules())


def refuse_unconvertible(model: nn.Module, kept: tuple[type, ...] = ()) -> None:
    """``norm.sync``: a ``UserError`` naming the first BatchNorm layer of ``model`` whose class overrides
    ``forward`` (with neither ``_BatchNorm``'s nor timm's ``BatchNormAct2d``'s): a synced layer would not run what
    its forward adds. Layers of exactly a type in ``kept`` (already synced) pass."""
    norm_act = _norm_act_type()
    faithful = (_BatchNorm.forward, None if norm_act is None else norm_act.forward)
    for name, m in model.named_modules():
        if isinstance(m, _BatchNorm) and type(m) not in kept and type(m).forward not in faithful:
            raise UserError(f"norm.sync: cannot synchronise layer {name or '(the model)'} ({type(m).__qualname__}): "
                            f"its class overrides BatchNorm's forward, which a synced BatchNorm would not run; "
                            f"use norm.sync=none")


def convert_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """Replace every BatchNorm1d/2d/3d in ``module`` (recursively) by :class:`CrossDeviceBatchNorm`, and every
    timm ``BatchNormAct2d`` by :class:`CrossDeviceBatchNormAct`.

    Like ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: the new layers reuse the old parameters and buffers
    (weight, bias, running mean/var, num_batches_tracked) and copy momentum, eps, affine,
    track_running_stats and the training flag; children (a ``BatchNormAct2d``'s ``drop`` and ``act``) move over
    under their names, so the state-dict keys stay those of ``module``. Returns the converted module (a new object
    when ``module`` itself is a BatchNorm; children are replaced in place otherwise). A BatchNorm class overriding
    ``forward`` otherwise is refused before anything changes (:func:`refuse_unconvertible`).
    """
    refuse_unconvertible(module, kept=(CrossDeviceBatchNorm, CrossDeviceBatchNormAct))
    return _convert(module, process_group, _norm_act_type())


def _convert(module: nn.Module, process_group, norm_act: type | None) -> nn.Module:
    out = module
    if isinstance(module, _CONVERTIBLE) and not isinstance(module, CrossDeviceBatchNorm):
        new = CrossDeviceBatchNormAct if norm_act is not None and isinstance(module, norm_act) else CrossDeviceBatchNorm
        out = new(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                  process_group)
        if module.affine:
            with torch.no_grad():
                out.weight = module.weight
                out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, _convert(child, process_group, norm_act))
    return out
