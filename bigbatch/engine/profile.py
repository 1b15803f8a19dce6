"""``bigbatch profile``: a few training steps under ``torch.profiler``, a Chrome trace and a table by operator kind.

The steps are training's own (the run's parts, ``engine/parts.py``, and its data through the loader), in this process:
one warm-up step (allocations, first kernels), then ``steps`` profiled with the CPU activity and, on a GPU, the CUDA
one. ``trace.json`` (open it in ``chrome://tracing`` or Perfetto) goes into the output folder, and the table sums
each operator's self time by kind, so that the question the Darknet-on-Jetson write-up (docs/references.md) answers
with nvprof, where does mixed precision spend its extra time, is one command run at ``precision.dtype=fp32``
and again at ``bf16`` / ``fp16``.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bigbatch.config import RunConfig

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl|gloo|all_?reduce|all_?gather|broadcast|c10d|reduce_scatter", re.I)),
    ("convolution", re.compile(r"conv|cudnn_convolution|winograd|implicit_gemm|depthwise", re.I)),
    ("matmul", re.compile(r"\b(aten::)?(mm|addmm|bmm|baddbmm|matmul|linear)\b|gemm|cublas|cutlass", re.I)),
    ("normalisation", re.compile(r"norm|batch_norm|bn_fw|bn_bw|welford", re.I)),
    ("copies", re.compile(r"copy|_to_copy|aten::to\b|contiguous|clone|memcpy|memset|cat\b|stack\b|index", re.I)),
    ("elementwise", re.compile(r"add|mul|div|sub|relu|leaky|sigmoid|tanh|exp|log|pow|sqrt|where|clamp|fill|zero|"
                               r"neg|abs|max|min|sum|mean|elementwise|vectorized|reduce|lerp|foreach|softmax|"
                               r"cross_entropy|nll|threshold|hardtanh|mish|silu|gelu|dropout", re.I)),
)
"""Operator kinds, first match wins: communication, convolution, matmul, normalisation, copies, elementwise."""


def kind_of(name: str) -> str:
    """The kind of an operator or kernel name (``other`` when none matches)."""
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def kinds_table(events: Any) -> tuple[dict[str, dict[str, float]], str]:
    """Self time (ms) per kind on the CPU and the device, from ``profiler.key_averages()``; -> (sums, table)."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_ms": 0.0, "device_ms": 0.0, "calls": 0})
    for event in events:
        entry = sums[kind_of(event.key)]
        entry["cpu_ms"] += event.self_cpu_time_total / 1000
        entry["device_ms"] += getattr(event, "self_device_time_total", 0.0) / 1000
        entry["calls"] += event.count
    cpu = sum(e["cpu_ms"] for e in sums.values()) or 1.0
    device = sum(e["device_ms"] for e in sums.values())
    lines = [f"{'kind':<14} {'CPU ms':>10} {'share':>7} {'device ms':>10} {'share':>7} {'calls':>8}"]
    order = [kind for kind, _ in KINDS] + ["other"]
    for kind in order:
        if kind not in sums:
            continue
        e = sums[kind]
        device_share = f"{100 * e['device_ms'] / device:6.1f}%" if device else "      -"
        lines.append(f"{kind:<14} {e['cpu_ms']:10.1f} {100 * e['cpu_ms'] / cpu:6.1f}% {e['device_ms']:10.1f} "
                     f"{device_share} {int(e['calls']):8d}")
    return dict(sums), "\n".join(lines)


def make_trace_dir(out: Path) -> None:
    """The folder for ``profile``'s trace: new or empty (anything else is the user's), made, and writable; else one
    ``UserError`` naming ``--out``."""
    from bigbatch.errors import UserError
    from bigbatch.floor.outputs import check_utf8_name, probe_writable

    check_utf8_name(out, "--out", "torch's trace writer")
    if out.is_symlink() and not out.exists():
        raise UserError(f"--out: {out} is a link to nothing; give a new or empty folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out: {out} exists and is not an empty folder; bigbatch writes its trace into a new or "
                        "empty one")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out: cannot make {out}: {e.strerror}") from None
    probe_writable(out, "--out")


def profile(cfg: RunConfig, steps: int, out_dir: Path) -> tuple[Path, str]:
    """Profile ``steps`` training steps of ``cfg`` after one warm-up step; -> (the trace's path, the table)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # Kineto's own log: errors about absent GPUs, on a CPU machine
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from bigbatch.batching import make_plan
    from bigbatch.data.pipeline.loader import batches_by_step
    from bigbatch.data.pipeline.order import order_of
    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.host_memory import keep_freed
    from bigbatch.engine.parts import build_parts
    from bigbatch.engine.trainer import seed_everything
    from bigbatch.floor.distributed import setup
    from bigbatch.largebatch.optim import set_lr
    from bigbatch.tasks import build_task

    proc = setup()
    if cfg.memory.keep_freed:
        keep_freed()
    seed_everything(cfg.seed)
    # the first batch only: a batch schedule's later phases are more micro-batches of the same size
    first = cfg.model_copy(update={"steps": steps + 1, "epochs": None,
                                   "schedule": cfg.schedule.model_copy(update={"batch": []})})
    task = build_task(cfg)
    task.set_plan(make_plan(cfg, 1, len(task.train_set)))  # the whole run's: what is drawn per step, as training
    plan = make_plan(first, 1, len(task.train_set))
    parts = build_parts(cfg, task, plan, proc, EventStorage())
    model, train_step, lr_at = parts.model, parts.step, parts.lr_at
    order = order_of(task.train_set, plan.batch, cfg.seed, 1)
    batches = batches_by_step(task.train_set, order, 0, plan.steps, 0, 1, plan.subdivisions, cfg.data.workers,
                              task.sample_keys, pin_memory=proc.device.type == "cuda")
    model.train()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if proc.device.type == "cuda" else [])

    def one_step(step: int, micro_batches: list[Any]) -> None:
        task.observe(micro_batches)
        set_lr(train_step.optimizer, lr_at(step))
        train_step(step, micro_batches)
        if proc.device.type == "cuda":
            torch.cuda.synchronize(proc.device)

    one_step(0, next(batches))  # warm-up: not profiled
    with torch_profile(activities=activities) as prof:
        for step, micro_batches in enumerate(batches, start=1):
            one_step(step, micro_batches)
    trace = out_dir / "trace.json"
    prof.export_chrome_trace(str(trace))
    _, table = kinds_table(prof.key_averages())
    return trace, table
