"""Memory planning: measure the peak memory of a training step per micro-batch size, pick the layout.

Each measurement runs in a fresh process (``python -m bigbatch.engine.planner``) so that no
allocator cache or earlier peak leaks into the next: it builds the model and optimizer from the
config with the training run's own parts and step (``engine/parts.py``, ``engine/step.py``: EMA copy, loss
scaler, BatchNorm statistics, clipping), and times two training steps on random images of the largest
training input size, in the configured precision; four on the CPU with ``memory.keep_freed``, whose heap takes
a few passes to settle (ResNet-18 at micro-batch 64 peaked at 1,784 MiB over two, 1,956 over four, 1,952 over
six). It runs as one process, so what only several processes have is not measured: ``norm.sync``'s
cross-device BatchNorm layers and DDP's gradient buckets (about one more copy of the gradients). The peak is
the process's maximum RSS on the CPU (``ru_maxrss``: what ``memory.limit`` compares against) and
``torch.cuda.max_memory_reserved`` on CUDA (what the allocator holds at its worst).

The planner measures micro-batches 1, 2, 4, ... (those that divide the per-device batch) until one
no longer fits, fits peak = a + b * micro-batch by least squares, and picks the largest measured
micro-batch that fits the budget, that is the smallest ``subdivisions``. The budget is
``--memory-limit``, else ``memory.limit``, else the device's free memory (CUDA) or the system's
available memory (CPU), less a 10 % margin.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from bigbatch.batching import reachable_batches
from bigbatch.config import RunConfig, validate_config
from bigbatch.errors import UserError

MiB = 2**20
MARGIN = 0.10


@dataclass
class Measurement:
    micro_batch: int
    peak_bytes: int
    images_per_s: float


def measure_in_this_process(cfg: RunConfig, micro_batch: int) -> Measurement:
    """Two training steps on random images (four on the CPU with ``memory.keep_freed``); the peak memory of this
    process, and the speed of the last.

    The parts and the step are training's own (``engine/parts.py``): the weight EMA's copy, the loss scaler,
    BatchNorm's per-step statistics and the clipping are all in the measured peak. On the CPU, where the device's
    memory is the process's, so is a checkpoint: training serializes one at its step and the background writer
    holds the bytes while the next steps run (``TrainingState.save``), so the later steps run beside one."""
    from bigbatch.batching import BatchPlan
    from bigbatch.engine.checkpoint import serialized
    from bigbatch.engine.controllers.base import BatchController
    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.host_memory import keep_freed
    from bigbatch.engine.parts import build_parts
    from bigbatch.engine.progress import Progress
    from bigbatch.engine.state import TrainingState
    from bigbatch.floor.distributed import setup
    from bigbatch.tasks import build_task

    proc = setup()
    if cfg.memory.keep_freed:
        keep_freed()  # as training does: the peak is the one training reaches
    task = build_task(cfg)
    # kept memory (memory.keep_freed) settles its layout over the first few passes
    steps = 4 if cfg.memory.keep_freed and proc.device.type == "cpu" else 2
    plan = BatchPlan(batch=micro_batch, world=1, subdivisions=1, steps=steps, train_images=len(task.train_set))
    parts = build_parts(cfg, task, plan, proc, EventStorage(), recut_on_oom=False)  # out of memory: does not fit
    model, train_step = parts.model, parts.step
    model.train()
    batch = task.synthetic_batch(cfg, micro_batch, proc.device)
    seconds, held = 0.0, None
    for step in range(steps):
        start = time.perf_counter()
        train_step(step, [batch])
        if proc.device.type == "cuda":
            torch.cuda.synchronize(proc.device)
        seconds = time.perf_counter() - start
        if step == 0 and proc.device.type == "cpu":
            progress = Progress(plan, BatchController(cfg, plan, proc), EventStorage())  # the fixed batch it measures
            held = serialized(TrainingState(cfg, model, train_step, parts.ema, progress).state_dict())
    del held
    if proc.device.type == "cuda":
        peak = torch.cuda.max_memory_reserved(proc.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return Measurement(micro_batch, int(peak), micro_batch / seconds)


def measure(cfg: RunConfig, micro_batch: int) -> Measurement:
    """One measurement in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "bigbatch.engine.planner", json.dumps(cfg.model_dump(mode="json")), str(micro_batch)],
        capture_output=True, text=True, env=env,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        if "out of memory" in result.stderr.lower() or result.returncode in (-9, 137):
            return Measurement(micro_batch, 2**62, 0.0)  # did not fit at all
        raise RuntimeError(f"measuring micro-batch {micro_batch} failed: {last}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return Measurement(**data)


def default_budget(cfg: RunConfig) -> int:
    from bigbatch.config import parse_size

    if cfg.memory.limit is not None:
        return parse_size(cfg.memory.limit)
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free * (1 - MARGIN))
    import psutil

    return int(psutil.virtual_memory().available * (1 - MARGIN))


def candidates(per_device_batch: int) -> list[int]:
    """Micro-batches 1, 2, 4, ... that divide the per-device batch (and the batch itself)."""
    sizes, m = [], 1
    while m <= per_device_batch:
        if per_device_batch % m == 0:
            sizes.append(m)
        m *= 2
    if per_device_batch not in sizes:
        sizes.append(per_device_batch)
    return sizes


def fit_line(points: list[Measurement]) -> tuple[float, float]:
    """Least squares peak = a + b * micro_batch over the measured points (b = 0 with one point)."""
    xs = [float(p.micro_batch) for p in points]
    ys = [float(p.peak_bytes) for p in points]
    if len(points) < 2:
        return ys[0], 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


@dataclass
class Plan:
    measurements: list[Measurement]
    budget: int
    micro_batch: int
    subdivisions: int
    fit: tuple[float, float]

    def table(self) -> str:
        a, b = self.fit
        lines = [f"{'micro-batch':>11s}  {'peak MiB':>9s}  {'images/s':>9s}  fits"]
        for m in self.measurements:
            fits = "yes" if m.peak_bytes <= self.budget else "no"
            peak = "failed" if m.peak_bytes >= 2**62 else f"{m.peak_bytes / MiB:9.0f}"
            lines.append(f"{m.micro_batch:11d}  {peak:>9s}  {m.images_per_s:9.1f}  {fits}")
        lines.append(f"fit: peak = {a / MiB:.0f} MiB + {b / MiB:.2f} MiB per image; budget {self.budget / MiB:.0f} MiB")
        return "\n".join(lines)


def plan_layout(cfg: RunConfig, world: int, budget: int | None = None) -> Plan:
    """Measure, fit, and choose the smallest subdivisions whose micro-batch fits under the budget."""
    budget = budget if budget is not None else default_budget(cfg)
    per_device = cfg.batch // world
    if cfg.batch % world:
        raise UserError(f"batch: {cfg.batch} is not divisible by world size {world}")
    # every batch the run may reach (a batch schedule's, a growing adaptive batch's largest) is a whole number of
    # the same micro-batch: it divides each of them
    every_batch = math.gcd(*(batch for _, batch in reachable_batches(cfg)))
    sizes = candidates(every_batch // world if every_batch % world == 0 else per_device)
    if cfg.adaptive is not None:  # AdaScale measures the gradient noise from 2 micro-batches or more per process
        sizes = [m for m in sizes if m <= per_device // 2]
        if not sizes:
            raise UserError(f"batch: an adaptive batch of {cfg.batch} on {world} process(es) cannot be cut into 2 "
                            "micro-batches per process, which AdaScale needs")
    measurements: list[Measurement] = []
    for m in sizes:
        measurements.append(measure(cfg, m))
        if measurements[-1].peak_bytes > budget:
            break  # larger micro-batches need more memory still
    fitting = [p for p in measurements if p.peak_bytes <= budget]
    valid = [p for p in measurements if p.peak_bytes < 2**62]
    fit = fit_line(valid) if valid else (0.0, 0.0)
    if not fitting:
        need = measurements[0].peak_bytes / MiB
        raise UserError(f"memory.limit: even a micro-batch of 1 image needs {need:.0f} MiB, over the budget of "
                        f"{budget / MiB:.0f} MiB")
    best = max(fitting, key=lambda p: p.micro_batch)
    return Plan(measurements, budget, best.micro_batch, per_device // best.micro_batch, fit)


def resolve_auto_subdivisions(cfg: RunConfig, world: int) -> tuple[RunConfig, Plan | None]:
    """``subdivisions: auto`` -> the planner's choice (a config with a number); other configs unchanged."""
    if cfg.subdivisions != "auto":
        return cfg, None
    plan = plan_layout(cfg, world)
    data = cfg.model_dump(mode="json")
    data["subdivisions"] = plan.subdivisions
    return validate_config(data), plan


def _main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    config["subdivisions"] = 1
    cfg = validate_config(config)
    result = measure_in_this_process(cfg, int(argv[1]))
    print(json.dumps(vars(result)))


if __name__ == "__main__":
    _main(sys.argv[1:])
