"""Memory planning: measure the peak memory of a short run per micro-batch size, pick the layout.

Each measurement runs in a fresh process (``python -m bigbatch.engine.planner``) so that no
allocator cache or earlier peak leaks into the next: it builds the model and optimizer from the
config with the training run's own parts and step (``engine/parts.py``, ``engine/step.py``: EMA copy, loss
scaler, BatchNorm statistics, clipping), and times two training steps on random images of the largest
training input size, in the configured precision, each accumulating as many micro-batches as the run's step (at
most 4); four steps on the CPU with ``memory.keep_freed``, whose heap takes
a few passes to settle (ResNet-18 at micro-batch 64, the steps alone, peaked at 1,784 MiB over two, 1,956 over
four, 1,952 over six). Beside the steps it has what a run has beside them, in the run's order, as a run that
evaluates and checkpoints every step: after each step an evaluation batch (``eval.batch`` images through the weights
that are evaluated, without gradients), then a checkpoint's serialized bytes, taken while the last ones are still
held and held through the next step and evaluation as the background writer holds them (with kept memory each
evaluation beside them needed more: ResNet-18 at 4 x 16, +171, +104, +61 and +0 MiB over four; a run of that
layout had reached 1.16x a measurement that evaluated once); with ``log.updates`` the update sizes' float32 copy of the
weights; and on the CPU each step's micro-batches of the run's own data for a whole per-device step, read by its
loader with its workers.
It runs as one process, so what only several processes have is not measured: ``norm.sync``'s
cross-device BatchNorm layers and DDP's gradient buckets (about one more copy of the gradients).

The peak is the process's maximum RSS on the CPU (``ru_maxrss``, taken by ``wait4`` when the process has ended:
what ``memory.limit`` compares against, and a process's exit is part of its run), plus the most private memory
its data workers held together (``telemetry/children.py``); on CUDA ``torch.cuda.max_memory_reserved`` (what the
allocator holds at its worst). On a unified-memory GPU (a Jetson, :func:`unified_memory`: the GPU allocates from
the host's RAM) the host's memory is the device's: the measurement holds the run's data, workers and checkpoint
bytes as on the CPU, and the peak is the process's RSS plus the allocator's reserved peak. A run of the same layout
is planned for that peak plus ``RUN_MARGIN`` (15 %): what varies from one process to the next (the heap's layout,
the workers' timing) and what a longer run adds; measured against complete runs of three recipes at three limits
each in docs/benchmarks.md (benchmarks/plan_holds.py).

The planner measures micro-batches 1, 2, 4, ... (those that divide the per-device batch) until one
no longer fits, fits peak = a + b * micro-batch by least squares, and picks the largest measured
micro-batch whose planned peak fits the budget, that is the smallest ``subdivisions``. The budget is
``--memory-limit``, else ``memory.limit``, else the device's free memory (CUDA) or the system's
available memory (CPU, unified memory) divided among the machine's processes of the run (``LOCAL_WORLD_SIZE``),
less a 10 % margin. Under torchrun one rank plans for all (:func:`resolve_auto_on_ranks`).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from bigbatch.batching import BatchPlan, reachable_batches
from bigbatch.config import RunConfig, validate_config
from bigbatch.errors import UserError

if TYPE_CHECKING:
    from bigbatch.tasks.base import Task

MiB = 2**20
MARGIN = 0.10
"""Of the system's available (CPU) or the device's free (CUDA) memory, left out of the default budget."""
RUN_MARGIN = 0.15
"""Added to a micro-batch's measured whole-run peak before it is compared with the budget (docs/memory.md)."""
MEASURED_ACCUMULATION = 4
"""At most this many micro-batches in a measured step (fewer when the run's step has fewer)."""


@dataclass
class Measurement:
    micro_batch: int
    peak_bytes: int
    """The measuring process's own peak: its maximum RSS on the CPU, the device's reserved memory on CUDA, both
    together on a unified-memory GPU."""
    images_per_s: float
    workers_bytes: int = 0
    """The most private memory its data workers held together (the CPU and unified memory; 0 without workers, and
    on a discrete CUDA GPU, whose budget is the device's)."""
    device_bytes: int = 0
    """Of ``peak_bytes``, the CUDA allocator's reserved peak (all of it on a discrete GPU; 0 on the CPU)."""

    @property
    def run_bytes(self) -> int:
        """The whole run's measured peak at this micro-batch: the process's and its workers'."""
        return self.peak_bytes + self.workers_bytes

    @property
    def failed(self) -> bool:
        return self.peak_bytes >= FAILED


FAILED = 2**62
"""The peak of a measurement that ran out of memory: fits no budget."""


def measure_in_this_process(cfg: RunConfig, micro_batch: int, per_device: int | None = None) -> Measurement:
    """The memory of a short run at ``micro_batch`` in this process, in the order a run takes its parts: training
    steps on random images of the largest training input (two; four on the CPU with ``memory.keep_freed``), each of
    ``measured_micro_batches`` micro-batches, with an evaluation and a checkpoint after each (a run that evaluates
    and checkpoints every step: the most a run has beside its steps); the peak memory of this process, and the speed
    of the last step.

    The parts and the step are training's own (``engine/parts.py``): the weight EMA's copy, the loss scaler,
    BatchNorm's per-step statistics and the clipping are all in the measured peak, and with ``log.updates`` the float32
    copy of the weights that the run's update sizes keep (``telemetry/update_sizes.py``). The evaluation forwards
    ``eval.batch`` random images (at most the validation set) through the model, and through the EMA's when its
    weights count, in eval mode without gradients, as the run's evaluation does. On the CPU, where the device's memory
    is the process's, so are the rest of a run: the checkpoint (training serializes one at its step and the background
    writer holds the bytes while the next steps run, ``TrainingState.save``, and its thread still holds them as the
    next step's are taken), and the data: each step's micro-batches
    for a per-device batch of ``per_device`` (default: ``micro_batch``) as the run's own loader makes them, with its
    workers, are held while the step runs, as training holds them."""
    from bigbatch.engine.checkpoint import serialized
    from bigbatch.engine.controllers.base import BatchController
    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.host_memory import keep_freed
    from bigbatch.engine.parts import build_parts
    from bigbatch.engine.progress import Progress
    from bigbatch.engine.state import TrainingState
    from bigbatch.floor.distributed import setup
    from bigbatch.largebatch.ema import ema_counts
    from bigbatch.tasks import build_task
    from bigbatch.telemetry.update_sizes import UpdateSizes

    proc = setup()
    if cfg.memory.keep_freed:
        keep_freed()  # as training does: the peak is the one training reaches
    task = build_task(cfg)
    on_host = host_counts(proc.device)  # the CPU, or a GPU that allocates from the host's RAM
    # kept memory (memory.keep_freed) settles its layout over the first few passes
    steps = 4 if cfg.memory.keep_freed and on_host else 2
    accumulated = measured_micro_batches(micro_batch, per_device or micro_batch)
    plan = BatchPlan(batch=micro_batch * accumulated, world=1, subdivisions=accumulated, steps=steps,
                     train_images=len(task.train_set))
    parts = build_parts(cfg, task, plan, proc, EventStorage(), recut_on_oom=False)  # out of memory: does not fit
    model, train_step = parts.model, parts.step
    model.train()
    batch = task.synthetic_batch(cfg, micro_batch, proc.device)
    data = run_data(cfg, task, per_device or micro_batch, micro_batch, steps) if on_host else None
    seconds, held, step_data = 0.0, None, None
    evaluated = [model, parts.ema.module] if ema_counts(parts.ema, cfg) else [model]
    progress = Progress(plan, BatchController(cfg, plan, proc), EventStorage())  # the fixed batch
    state = TrainingState(cfg, model, train_step, parts.ema, progress)
    sizes = UpdateSizes() if cfg.log.updates else None
    for step in range(steps):
        if data is not None:
            step_data = None  # as the run's loop: the step before is let go as the next one arrives
            step_data = next(data)
        if sizes is not None:
            sizes.before(model)  # log.updates: its float32 copy of the weights, kept for the run
        start = time.perf_counter()
        train_step(step, [batch] * accumulated)
        if proc.device.type == "cuda":
            torch.cuda.synchronize(proc.device)
        seconds = time.perf_counter() - start
        if sizes is not None:
            sizes.after(model)
        evaluate(cfg, task, evaluated, proc.device)  # beside the last checkpoint's bytes, from the second step on
        if on_host:  # the new bytes are taken while the last ones are still held, as the writer's thread holds them
            held = serialized(state.state_dict())
    del held, step_data, data, sizes
    host, device = peak_parts(proc.device, on_host)
    return Measurement(micro_batch, host + device, micro_batch * accumulated / seconds, device_bytes=device)


def unified_memory() -> bool:
    """Whether this machine's GPU allocates from the host's RAM (a Jetson): CUDA, and ``NvMapMemUsed`` in
    ``/proc/meminfo`` (``telemetry/memory.py``). There a run's host memory (its process, its data workers, the
    checkpoint's bytes) and its device memory come out of the one RAM."""
    from bigbatch.telemetry.memory import MEMINFO, unified_gpu_mib

    return torch.cuda.is_available() and unified_gpu_mib(MEMINFO) is not None


def host_counts(device: torch.device) -> bool:
    """Whether the host's memory is measured against the budget: on the CPU, and on a unified-memory GPU."""
    return device.type == "cpu" or (device.type == "cuda" and unified_memory())


def peak_parts(device: torch.device, on_host: bool) -> tuple[int, int]:
    """This process's peak so far as (host, device) bytes: its maximum RSS where the host counts (``on_host``, else
    0), and on CUDA the allocator's reserved peak (else 0). On unified memory the two are added: what the CUDA
    allocator reserves is the driver's (NvMap) memory, which the RSS is not known to count; were some counted in
    both, the plan would err toward a smaller micro-batch."""
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if on_host else 0  # KiB on Linux
    cuda = int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else 0
    return int(host), cuda


def measured_micro_batches(micro_batch: int, per_device: int) -> int:
    """How many micro-batches a measured step accumulates: the run's own count up to ``MEASURED_ACCUMULATION``.
    A step of one micro-batch reads lower than a step that adds several into the gradients: ResNet-18 runs of 4 x 16
    and 2 x 32 images a step reached 1.16x and 1.19x a one-micro-batch measurement (docs/benchmarks.md)."""
    return max(1, min(per_device // micro_batch, MEASURED_ACCUMULATION))


def run_data(cfg: RunConfig, task: Task, per_device: int, micro_batch: int, steps: int) -> Iterator[list[Any]]:
    """The first ``steps`` steps' micro-batches of this process (``per_device // micro_batch`` each), read as
    training reads them: its order, sample keys (the first steps of a multi-scale run are at the largest size) and
    ``data.workers``, whose prefetch holds the next step's."""
    from bigbatch.data.pipeline.loader import batches_by_step
    from bigbatch.data.pipeline.order import order_of

    subdivisions = per_device // micro_batch
    plan = BatchPlan(batch=per_device, world=1, subdivisions=subdivisions, steps=steps,
                     train_images=len(task.train_set))
    task.set_plan(plan)
    order = order_of(task.train_set, plan, cfg.seed, 1)
    return batches_by_step(task.train_set, order, 0, steps, 0, 1, subdivisions, cfg.data.workers, task.sample_keys,
                           most_subdivisions=subdivisions)


@torch.no_grad()
def evaluate(cfg: RunConfig, task: Task, models: list[torch.nn.Module], device: torch.device) -> None:
    """One evaluation batch through each of ``models`` as the run's evaluation takes it: ``eval.batch`` images (at most
    the validation set's), in eval mode, without gradients, in full precision."""
    images = task.synthetic_batch(cfg, min(cfg.eval.batch, max(len(task.val_set), 1)), device)[0]
    for model in models:
        was_training = model.training
        model.eval()
        model(images)
        model.train(was_training)


def measure(cfg: RunConfig, micro_batch: int, per_device: int | None = None) -> Measurement:
    """One measurement in a fresh process; its data workers' memory sampled from here (``telemetry/children.py``)."""
    from bigbatch.telemetry.children import ChildrenSampler

    # one process of world 1; LOCAL_RANK stays, so that it measures on this rank's GPU (floor/distributed.setup)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    command = [sys.executable, "-m", "bigbatch.engine.planner", json.dumps(cfg.model_dump(mode="json")),
               str(micro_batch), str(per_device or micro_batch)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        workers = ChildrenSampler(child.pid).start()
        _, status, usage = os.wait4(child.pid, 0)  # its peak up to its very end, not just up to its last line
        child.returncode = returncode = os.waitstatus_to_exitcode(status)
        workers_peak = workers.stop()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        if "out of memory" in stderr.lower() or returncode in (-9, 137):
            return Measurement(micro_batch, FAILED, 0.0)  # did not fit at all
        raise RuntimeError(f"measuring micro-batch {micro_batch} failed: {last}")
    data = json.loads(stdout.strip().splitlines()[-1])
    return Measurement(data["micro_batch"], whole_peak(data, usage.ru_maxrss * 1024), data["images_per_s"],
                       workers_bytes=workers_peak, device_bytes=data["device_bytes"])


def whole_peak(reported: dict[str, Any], exit_rss: int) -> int:
    """The measuring process's peak from what it ``reported`` of itself (``_main``: its host and device bytes, and
    whether the host counts) and its maximum RSS read by ``wait4`` once it has ended (``exit_rss``).

    Where the host counts (the CPU, unified memory): the kernel's high-water mark over the whole process, its exit
    included (ru_maxrss from wait4: the larger of the process's and its reaped children's). The measuring process
    ends as a run does (floor/process_exit.py): without the interpreter's teardown or the libraries' static
    destructors, which fault in pages of their code (130 MiB of file-backed RSS after the digits recipe's run) where
    they run."""
    host = max(reported["host_bytes"], exit_rss) if reported["host"] else 0
    return host + reported["device_bytes"]


def default_budget(cfg: RunConfig) -> int:
    """One process's budget: ``memory.limit``; else on a discrete GPU its free memory (the current device: this
    rank's once ``floor/distributed.setup`` has run), less ``MARGIN``; else (the CPU, a unified-memory GPU) the host's
    available memory less ``MARGIN``, shared by the run's processes on this machine (torchrun's
    ``LOCAL_WORLD_SIZE``; 1 outside torchrun)."""
    from bigbatch.config import parse_size

    if cfg.memory.limit is not None:
        return parse_size(cfg.memory.limit)
    if torch.cuda.is_available() and not unified_memory():
        free, _ = torch.cuda.mem_get_info()
        return int(free * (1 - MARGIN))
    import psutil

    return int(psutil.virtual_memory().available * (1 - MARGIN)) // local_processes()


def default_budget_source(cfg: RunConfig) -> tuple[str, str]:
    """Where :func:`default_budget` took its number, as an error line names it: the key (``memory.limit``, or
    ``memory`` where it is unset) and, for the free memory, which memory and what was left out of it."""
    if cfg.memory.limit is not None:
        return "memory.limit", ""
    if torch.cuda.is_available() and not unified_memory():
        return "memory", f"the device's free memory less {MARGIN:.0%}; memory.limit unset"
    shared = f", shared by {local_processes()} processes" if local_processes() > 1 else ""
    return "memory", f"this machine's available memory less {MARGIN:.0%}{shared}; memory.limit unset"


def local_processes() -> int:
    """The run's processes on this machine, which share its host memory: torchrun's ``LOCAL_WORLD_SIZE`` (1 without
    it, or where it is not a positive number)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


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


def needed(measurement: Measurement, margin: float = RUN_MARGIN) -> float:
    """The memory a run at this micro-batch is planned for: its measured whole-run peak, plus ``margin`` of it."""
    return math.inf if measurement.failed else measurement.run_bytes * (1 + margin)


def fit_line(points: list[Measurement]) -> tuple[float, float]:
    """Least squares peak = a + b * micro_batch over the measured points' whole-run peaks (b = 0 with one point)."""
    xs = [float(p.micro_batch) for p in points]
    ys = [float(p.run_bytes) for p in points]
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
        lines = [f"{'micro-batch':>11s}  {'peak MiB':>9s}  {'workers':>7s}  {'planned':>7s}  {'images/s':>9s}  fits"]
        for m in self.measurements:
            fits = "yes" if needed(m) <= self.budget else "no"
            if m.failed:
                lines.append(f"{m.micro_batch:11d}  {'failed':>9s}  {'':>7s}  {'':>7s}  {m.images_per_s:9.1f}  {fits}")
                continue
            lines.append(f"{m.micro_batch:11d}  {m.peak_bytes / MiB:9.0f}  {m.workers_bytes / MiB:7.0f}  "
                         f"{needed(m) / MiB:7.0f}  {m.images_per_s:9.1f}  {fits}")
        lines.append(f"planned = (peak + workers) x {1 + RUN_MARGIN:g}; fit: peak + workers = {a / MiB:.0f} MiB + "
                     f"{b / MiB:.2f} MiB per image; budget {self.budget / MiB:.0f} MiB")
        return "\n".join(lines)


def plan_layout(cfg: RunConfig, world: int, budget: int | None = None,
                budget_from: tuple[str, str] = ("--memory-limit", ""), at_least: int = 0) -> Plan:
    """Measure, fit, and choose the smallest subdivisions whose micro-batch's whole run, with the margin, fits under
    the budget: ``budget`` (the key and note that ``budget_from`` gives, ``--memory-limit`` unless said), else
    :func:`default_budget` (named by :func:`default_budget_source`). ``at_least``: a per-device step to measure each
    micro-batch beside where it is larger than the run's own (``plan --devices``'s largest row)."""
    if budget is None:
        budget, budget_from = default_budget(cfg), default_budget_source(cfg)
    per_device = cfg.batch // world
    if cfg.batch % world:
        raise UserError(f"batch: {cfg.batch} is not divisible by world size {world}")
    # every batch the run may reach (a batch schedule's, a growing adaptive batch's largest) is a whole number of
    # the same micro-batch: it divides each of them
    reachable = [batch for _, batch in reachable_batches(cfg)]
    every_batch = math.gcd(*reachable)
    sizes = candidates(every_batch // world if every_batch % world == 0 else per_device)
    if cfg.adaptive is not None:  # AdaScale measures the gradient noise from 2 micro-batches or more per process
        sizes = [m for m in sizes if m <= per_device // 2]
        if not sizes:
            raise UserError(f"batch: an adaptive batch of {cfg.batch} on {world} process(es) cannot be cut into 2 "
                            "micro-batches per process, which AdaScale needs")
    measurements: list[Measurement] = []
    for m in sizes:
        measurements.append(measure_micro_batch(cfg, world, m, at_least))
        if needed(measurements[-1]) > budget:
            break  # larger micro-batches need more memory still
    fitting = [p for p in measurements if needed(p) <= budget]
    valid = [p for p in measurements if not p.failed]
    fit = fit_line(valid) if valid else (0.0, 0.0)
    if not fitting:
        need = needed(measurements[0])
        need_text = "more than the machine has" if math.isinf(need) else f"{need / MiB:.0f} MiB"
        key, note = budget_from
        raise UserError(f"{key}: even a micro-batch of 1 image needs {need_text} (the whole run's measured peak and "
                        f"a {RUN_MARGIN:.0%} margin), over the budget of {budget / MiB:.0f} MiB"
                        + (f" ({note})" if note else ""))
    best = max(fitting, key=lambda p: p.micro_batch)
    return Plan(measurements, budget, best.micro_batch, per_device // best.micro_batch, fit)


def measure_micro_batch(cfg: RunConfig, world: int, micro_batch: int, at_least: int = 0) -> Measurement:
    """The measurement of ``micro_batch`` on each of ``world`` processes, its data the largest step the run reaches
    (a batch schedule's, a growing adaptive batch's), or ``at_least`` images where that is more, cut into whole
    micro-batches."""
    largest = max(max(batch for _, batch in reachable_batches(cfg)) // world, at_least)  # the most data held
    return measure(cfg, micro_batch, largest - largest % micro_batch)


def resolve_auto_subdivisions(cfg: RunConfig, world: int, budget: int | None = None) -> tuple[RunConfig, Plan | None]:
    """``subdivisions: auto`` -> the planner's choice (a config with a number); other configs unchanged.
    ``budget``: the plan's, found as :func:`default_budget` finds it (default: that one)."""
    if cfg.subdivisions != "auto":
        return cfg, None
    plan = plan_layout(cfg, world, budget, default_budget_source(cfg))
    return with_subdivisions(cfg, plan.subdivisions), plan


PLAN_WAIT = timedelta(hours=2)
"""How long the other ranks wait for rank 0's ``subdivisions: auto`` (a measurement per micro-batch, each in a fresh
process: seconds to minutes each). A rank that fails ends the run sooner: torchrun stops the others."""

_ranks_resolved = 0
"""How many times this process has planned with its ranks: each time under a store key of its own (every rank of
the group counts alike, as every rank resolves the same times)."""


def resolve_auto_on_ranks(cfg: RunConfig, world: int) -> tuple[RunConfig, Plan | None]:
    """:func:`resolve_auto_subdivisions` for the ``world`` ranks of the process group, which all call it: one choice
    for all, the plan on rank 0 (None on the others, and for a config without ``auto``).

    Each rank's :func:`default_budget` (``memory.limit``, else its device's free memory, else its share of its
    machine's) is gathered in one all-gather, and rank 0 alone measures, against the smallest: its measuring
    processes run one at a time on its device. It puts its choice, or its one-line error, in the group's store, where
    the others wait for it (``PLAN_WAIT``: a store's wait, where a collective would time out, NCCL's after 10
    minutes) and take the same subdivisions, or raise the same error."""
    import torch.distributed as dist

    from bigbatch.floor.distributed import group_store

    global _ranks_resolved
    if cfg.subdivisions != "auto":
        return cfg, None
    _ranks_resolved += 1
    key = f"bigbatch/subdivisions_auto/{_ranks_resolved}"
    budgets: list[int | None] = [None] * world
    dist.all_gather_object(budgets, default_budget(cfg))
    store = group_store()
    if dist.get_rank() != 0:
        store.wait([key], PLAN_WAIT)
        chosen = json.loads(store.get(key))
        if "error" in chosen:
            raise UserError(chosen["error"])
        return with_subdivisions(cfg, int(chosen["subdivisions"])), None
    try:
        cfg, plan = resolve_auto_subdivisions(cfg, world, min(b for b in budgets if b is not None))
    except UserError as error:
        store.set(key, json.dumps({"error": str(error)}))
        raise
    except BaseException as error:
        store.set(key, json.dumps({"error": f"rank 0's memory plan failed: {error}"}))
        raise
    store.set(key, json.dumps({"subdivisions": cfg.subdivisions}))
    return cfg, plan


def with_subdivisions(cfg: RunConfig, subdivisions: int) -> RunConfig:
    """``cfg`` with ``subdivisions`` a number (the plan's choice)."""
    data = cfg.model_dump(mode="json")
    data["subdivisions"] = subdivisions
    return validate_config(data)


def with_auto_kept(written: RunConfig, cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``subdivisions: auto`` again where the config as ``written`` has it, else ``cfg`` itself: a
    recipe for another batch (``scale``) is planned where it trains, and ``cfg``'s number is this machine's plan."""
    if written.subdivisions != "auto":
        return cfg
    return validate_config({**cfg.model_dump(mode="json"), "subdivisions": "auto"})


def _main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    config["subdivisions"] = 1
    cfg = validate_config(config)
    result = measure_in_this_process(cfg, int(argv[1]), int(argv[2]))
    host = host_counts(torch.device("cuda" if torch.cuda.is_available() else "cpu"))  # the device it measured on
    print(json.dumps({"micro_batch": result.micro_batch, "images_per_s": result.images_per_s, "host": host,
                      "host_bytes": result.peak_bytes - result.device_bytes, "device_bytes": result.device_bytes}))


if __name__ == "__main__":
    from bigbatch.floor.process_exit import exit_now

    _main(sys.argv[1:])
    exit_now(0)  # as the run it measures ends: without the interpreter's teardown
