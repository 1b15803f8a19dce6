"""``model.compile``: ``torch.compile`` on the training forward and backward, with an eager fallback.

**What is compiled.** A *region*: the model's ``compile_regions()`` where it has that method (a detector: the network
or backbone that maps a batch of images to features; its loss, target assignment and post-processing stay eager),
else the whole model. Each region is compiled in place: its ``forward`` becomes a dispatch that calls the compiled
forward while the module trains with gradients on, and its plain forward otherwise (evaluation, ``torch.no_grad``):

    region(x) -> compiled(x)   if region.training and torch.is_grad_enabled() and no fallback happened
              -> plain(x)      otherwise

so the module stays itself: its state dict keeps the plain keys (``torch.compile(module)`` returns an
``OptimizedModule`` whose keys start with ``_orig_mod.``; ``module.compile()`` keeps them plain, but its compiled call
is copied by reference into a ``copy.deepcopy``, which would then run the original's weights; both checked with torch
2.14), DDP wraps the model as before (``engine/parts.py``; DDP calls the region inside its forward, so dynamo's
DDPOptimizer splits the graph at DDP's buckets), and the weight EMA, built before the regions are compiled, is a
plain copy. A deep copy of a compiled module gets the plain forward.

**Modes** (``torch.compile(mode=...)``): ``default``; ``max-autotune`` (inductor tries more kernels: longer
compilations); ``reduce-overhead`` replays CUDA graphs on a CUDA device; CUDA graphs do not exist on the CPU, where
``reduce-overhead`` is compiled as ``default``. (CUDA graphs with several micro-batches a step were not run here:
no GPU; ``benchmarks/gpu_check.sh`` compares their losses with eager's.)

**Sizes.** Detection's multi-scale training (``data.multiscale.sizes``) changes the input size every few steps, and a
torchvision detector pads each batch to a size of its own (its ``compile_sizes_vary``). Their regions take images of
every size from the first call: the height and width of each 4-D input are marked dynamic
(``torch._dynamo.maybe_mark_dynamic``), so one compilation serves the sizes that follow. A classifier's size does not
change: it compiles once, for its size (dynamo recompiles at a new micro-batch, after an out-of-memory re-cut or in a
batch schedule's next phase). On torch 2.14's CPU inductor, sizes that vary need two things (measured: every size
compiled again without them):

- channels-last tensors in the region (its weights and its inputs): with NCHW ones, the backward's saved activations
  come back from oneDNN with fixed channels-last strides, which pin the sizes;
- the backward convolution run by ATen (``aten.convolution_backward``, as inductor did before 2.14): inductor 2.14's
  own lowering of it fixes the strides of its result to the first size (``guard_int_seq`` in
  ``torch/_inductor/kernel/conv.py``). :func:`setup` registers ATen's kernel in its place, once per process; on a
  CUDA device (and on the CPU, which has no Triton templates) 2.14's lowering runs ATen's kernel too.

A size that takes a BatchNorm sum over more than 4,096 elements per channel, where another size took fewer, is
compiled once more (inductor's CPU code accumulates long sums in chunks: ``need_use_acc_helper``, ``cpp.py``).

**Fallback.** An error of dynamo or inductor (``torch._dynamo.exc.TorchDynamoException``: no C++ compiler, a
failed compilation, an unsupported construct) during a step is caught by the step (``engine/step.py``), which undoes
the attempt and runs it again in eager mode, from then on, after one warning line that says why. Under torchrun each
process falls back by itself (every process compiles the same graphs, so they fail alike; tested in one process).

**Cross-device BatchNorm** (``norm.sync: bigbatch``) runs its all-reduces eagerly, between compiled graphs
(``largebatch/sync_bn.py``).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

BACKEND: str | Callable[..., Any] = "inductor"
"""torch.compile's backend (tests put a failing one here to check the fallback)."""


def torch_mode(mode: str, device: torch.device) -> str | None:
    """torch.compile's ``mode`` for ``model.compile``: CUDA graphs (``reduce-overhead``) only on a CUDA device, else
    ``default`` (None)."""
    if mode == "default" or (mode == "reduce-overhead" and device.type != "cuda"):
        return None
    return mode


@functools.cache
def setup() -> None:
    """Once per process, before the first compilation: ATen's backward convolution in place of inductor 2.14's
    lowering (which fixes the input size: the module's docstring), and torch's warning that a CPU build finds no CUDA
    runtime at ``CUDA_HOME`` (printed when inductor first loads its C++ builder) kept off the console."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        from torch._inductor import lowering
        from torch._inductor.kernel import conv
    except ImportError:  # a torch without inductor: torch.compile will fail, and the step falls back
        return
    op = torch.ops.aten.convolution_backward.default
    own = getattr(conv, "convolution_backward_lowering", None)
    if own is None or lowering.lowerings.get(op) is not own:
        return  # a torch without that lowering (before 2.14) runs ATen's kernel already
    lowering.add_layout_constraint(op, lowering.constrain_to_fx_strides)
    lowering.register_lowering(op, type_promotion_kind=None)(lowering.fallback_handler(op))


def compile_failure(error: BaseException) -> bool:
    """Whether ``error`` is torch.compile's own (dynamo's or inductor's), not the model's."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(error, TorchDynamoException)


def failure_reason(error: BaseException) -> str:
    """One line: the inner error of a failed backend (inductor's), else the error's first line."""
    inner = getattr(error, "inner_exception", None) or error
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"[:300]


class CompiledForward:
    """A region's ``forward`` (the module docstring's dispatch)."""

    def __init__(self, module: nn.Module, compiled: Callable[..., Any], owner: CompiledModel) -> None:
        self.module, self.compiled, self.owner = module, compiled, owner
        self.plain = type(module).forward.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.owner.eager or not (self.module.training and torch.is_grad_enabled()):
            return self.plain(*args, **kwargs)
        if self.owner.sizes_vary:
            args = tuple(_any_size(a) for a in args)
        return self.compiled(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., Any]:
        """The copy of a compiled module (a weight EMA made later, ...) gets its own plain forward."""
        copy = memo[id(self.module)]
        return type(copy).forward.__get__(copy)


def _any_size(x: Any) -> Any:
    """A 4-D image batch (or a list of them: feature maps) as the region takes it when sizes vary: channels-last, its
    height and width dynamic."""
    if isinstance(x, (list, tuple)):
        return type(x)(_any_size(item) for item in x)
    if isinstance(x, torch.Tensor) and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
        torch._dynamo.maybe_mark_dynamic(x, 2)
        torch._dynamo.maybe_mark_dynamic(x, 3)
    return x


class CompiledModel:
    """The compiled regions of a model, and the switch back to eager (``fall_back``)."""

    def __init__(self, model: nn.Module, mode: str, device: torch.device, sizes_vary: bool = False,
                 warn: Callable[[str], None] | None = None) -> None:
        setup()
        self.mode, self.sizes_vary = mode, sizes_vary or getattr(model, "compile_sizes_vary", False)
        self.eager = False
        """True once a compilation failed: every region runs its plain forward."""
        self.reason: str | None = None
        """Why it fell back (one line), once it did."""
        self.warn = warn if warn is not None else _print_warning
        regions = model.compile_regions() if hasattr(model, "compile_regions") else [model]
        options = {"mode": torch_mode(mode, device)} if BACKEND == "inductor" else {}
        self.regions: list[nn.Module] = []
        for region in regions:
            if self.sizes_vary:
                region.to(memory_format=torch.channels_last)
            plain = type(region).forward.__get__(region)
            region.forward = CompiledForward(region, torch.compile(plain, backend=BACKEND, **options), self)
            self.regions.append(region)

    def fall_back(self, error: BaseException) -> None:
        """From now on every region runs eager; say why, once."""
        self.eager = True
        self.reason = failure_reason(error)
        self.warn(f"model.compile: torch.compile failed ({self.reason}); training goes on in eager mode")


def _print_warning(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def compile_model(model: nn.Module, mode: str | bool, device: torch.device, sizes_vary: bool = False,
                  warn: Callable[[str], None] | None = None) -> CompiledModel | None:
    """Compile ``model``'s regions in place for ``model.compile`` ``mode`` (False: nothing, None returned).
    ``sizes_vary``: the input size changes during the run (multi-scale training; a model whose ``compile_sizes_vary``
    is true says so itself); ``warn``: says the fallback's line
    (default: ``warning: ...`` on stderr)."""
    if mode is False:
        return None
    return CompiledModel(model, str(mode), device, sizes_vary, warn)
