"""Before any work: refuse a run that cannot fit on this machine whatever the layout.

Only what is known before the run and what no out-of-memory recovery (cutting micro-batches finer down to one image)
and no ``subdivisions: auto`` can shrink is counted, so a run refused here could never have run:

    data order      8 bytes x batch               the int64 dataset indices of one global batch, on every process, at
                                                  the largest batch the run may reach (``batching.largest_batch``: a
                                                  batch schedule's, a growing adaptive batch's ``batch.max``)
    training set    held_in_memory(cfg)           what the dataset format registered it holds in memory (digits:
                                                  images x size² x 4 bytes, float32 grey images)
    one image       3 x size x size x 4 bytes     the input tensor of a micro-batch of one (float32), at the
                                                  largest size the run uses (detection: multi-scale sizes), square
    parameters      count x 4 bytes               the float32 weights, counted on torch's ``meta`` device
                                                  (built without allocating anything)

The host's memory is the machine's physical memory; the input and the parameters are compared with the CUDA
device's memory when training runs there. Each over-large size is a ``UserError`` naming the key and the
estimate (exit 2); anything that could still fit is left to the run, its recovery and ``bigbatch plan``.
Counts that must fit a 64-bit integer (images seen over the run) are checked too.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from bigbatch.batching import INT64_MAX, check_image_count, largest_batch
from bigbatch.config import RunConfig
from bigbatch.errors import UserError
from bigbatch.registry import DATASETS

FLOAT32 = 4


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def host_memory() -> int:
    import psutil

    return psutil.virtual_memory().total


def device_memory() -> int | None:
    """The CUDA device's memory when training will run there (one process per device), else None."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory


def largest_input(cfg: RunConfig) -> tuple[int, int]:
    """(height, width) of an input every run of ``cfg`` must hold: its largest size (multi-scale sizes, and
    ``data.size`` for evaluation) on a square image. That is the smallest input that size gives: with shorter-side
    resizing an elongated image is larger (up to ``max_size``), so refusing on this never refuses a run that fits."""
    data = cfg.data
    if not data.is_detection:
        return data.size, data.size
    sizes = data.multiscale.sizes
    if sizes == "auto":
        from bigbatch.data.transforms.multiscale import darknet_sizes

        try:
            sizes = darknet_sizes(data.size, data.multiscale.range)
        except ValueError:  # no size to draw from: the run says so itself
            sizes = None
    training = max(sizes or [data.size])
    if data.crop_size is not None:  # training inputs are cropped; evaluation's (at data.size) are not
        training = min(training, data.crop_size)
    largest = max(data.size, training)
    return largest, largest


def parameter_count(cfg: RunConfig) -> int | None:
    """The model's parameter count, built on the meta device (no memory); None when it cannot be counted so.
    A model too large to describe at all (torch's size arithmetic overflows) is a ``UserError``."""
    from bigbatch.models import build_model

    key = cfg.model.part().info.get("size_key", "model.name")
    model_cfg = cfg.model.model_copy(update={"weights": None})  # the size only: no weights file is read
    guessed = cfg.data.classes is None  # the dataset's classes are known once it is read: a count is guessed
    if cfg.task == "detection":
        classes, shape = len(cfg.data.classes or ["object"]), {"min_size": cfg.data.size,
                                                               "max_size": max(largest_input(cfg))}
    else:
        classes, shape = 10, {"in_channels": 3, "size": cfg.data.size}
    try:
        with torch.device("meta"):
            model = build_model(model_cfg, classes, **shape)
    except RuntimeError as e:
        if "overflow" in str(e).lower():
            raise UserError(f"{key}: the model would have more than 2^63 bytes of parameters "
                            f"({str(e).splitlines()[0][:120]})") from None
        return None
    except UserError as e:
        if guessed and "classes" in str(e):  # the guessed class count (a cfg's counters_per_class): left to the run
            return None
        raise
    except Exception:  # a model that cannot be built on the meta device: its size is left to the run
        return None
    return sum(p.numel() for p in model.parameters())


def check_capacity(cfg: RunConfig, world: int = 1) -> None:
    """Refuse (``UserError``, exit 2) what cannot fit on this machine at any micro-batch (see the module doc)."""
    key, largest = largest_batch(cfg)  # every batch the run may reach: a schedule's, a growing adaptive batch's
    if cfg.steps is not None:
        check_image_count(cfg, cfg.steps, "steps")
    if cfg.epochs is not None and cfg.epochs > INT64_MAX:  # at least one image an epoch; the plan checks exactly
        raise UserError(f"epochs: {cfg.epochs:.3g} epochs are more images than a 64-bit count holds "
                        f"({INT64_MAX:.3g})")
    host = host_memory()
    device = device_memory()
    memory, where = (device, "this GPU's") if device is not None else (host, "this machine's")

    order = 8 * largest
    if order > host:
        raise UserError(f"{key}: {largest} images per step need {format_bytes(order)} for the data order alone "
                        f"(8 bytes an image), more than this machine's {format_bytes(host)} of memory")
    held_in_memory = DATASETS.get(cfg.data.name).info.get("held_in_memory")
    if held_in_memory is not None:
        held, what = held_in_memory(cfg)
        if held > host:
            raise UserError(f"data.size: the {cfg.data.name} set at {cfg.data.size} px needs {format_bytes(held)} in "
                            f"memory ({what}), more than this machine's {format_bytes(host)}")
    height, width = largest_input(cfg)
    image = 3 * height * width * FLOAT32
    if image > memory:
        raise UserError(f"data.size: one {height}x{width} input image needs {format_bytes(image)} (3 x {height} x "
                        f"{width} float32), more than {where} {format_bytes(memory)} of memory, even in micro-batches "
                        f"of one image")
    count = parameter_count(cfg)
    if count is not None:
        check_parameters_fit(count, cfg.model.part().info.get("size_key", "model.name"), cfg.model.name, image)


def check_memory_limit(cfg: RunConfig) -> None:
    """Refuse a ``memory.limit`` that this process's RSS passes already, before any data or model: every micro-batch
    would start over it, count as out of memory and double ``subdivisions`` until none is left."""
    if cfg.memory.limit is None:
        return
    from bigbatch.config.values import parse_size
    from bigbatch.telemetry.memory import rss_bytes

    limit, used = parse_size(cfg.memory.limit), rss_bytes()
    if limit <= used:
        raise UserError(f"memory.limit: {format_bytes(limit)} is less than this process uses already, before any data "
                        f"or model ({format_bytes(used)}): no micro-batch could start under it")


def check_parameters_fit(count: int, key: str, what: str, image: int = 0) -> None:
    """Refuse (``UserError`` naming ``key``) ``count`` float32 parameters that, with ``image`` bytes of one input,
    cannot fit this machine's memory (the GPU's, when training runs on one)."""
    device = device_memory()
    memory, where = (device, "this GPU's") if device is not None else (host_memory(), "this machine's")
    weights = count * FLOAT32
    if weights + image > memory:
        with_image = f" (with one input image {format_bytes(weights + image)})" if image else ""
        raise UserError(f"{key}: {what} has {count:.3g} parameters, {format_bytes(weights)} of float32 weights"
                        f"{with_image}, more than {where} {format_bytes(memory)} of memory")


def check_built_fits(build: Callable[[], torch.nn.Module], key: str, what: str) -> None:
    """Build a network with ``build`` on torch's ``meta`` device (nothing allocated), count its parameters and refuse
    what cannot fit (:func:`check_parameters_fit`); what cannot be built on the meta device is left to the real
    build. For every command that builds a network outside ``train``'s checks (``export``, ``eval``)."""
    try:
        with torch.device("meta"):
            network = build()
    except RuntimeError as e:
        if "overflow" in str(e).lower():
            raise UserError(f"{key}: {what} would have more than 2^63 bytes of parameters "
                            f"({str(e).splitlines()[0][:120]})") from None
        return
    check_parameters_fit(sum(p.numel() for p in network.parameters()), key, what)
