"""Memory: the ``memory.csv`` sampler (main process) and ``memory.limit`` on the CPU (every process)."""

from __future__ import annotations

from typing import Any

from bigbatch.config import parse_size
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.host_memory import release_freed
from bigbatch.engine.run import Run
from bigbatch.floor import run_files
from bigbatch.registry import HOOKS
from bigbatch.state_schema import Schema, Whole
from bigbatch.telemetry.memory import (
    STEADY_SAMPLES,
    STEADY_STEPS,
    MemoryLimitExceeded,
    MemorySampler,
    memory_growth,
    rss_bytes,
)


class MemoryLog(Hook):
    """Samples memory every ``memory.interval`` s into ``memory.csv``; at the end an ``event: memory`` record of
    the peaks, which are also the run's result, and an ``event: memory_growth`` record of the RSS trend after the
    first evaluation (MiB per 1,000 steps; ``steady`` when a line explains most of it), and on a unified-memory
    device of the GPU's share of RAM. The step of the first evaluation is the hook's state: a resumed run's trend
    starts there too, over the samples of ``memory.csv`` both processes wrote."""

    stage = "measure"

    def __init__(self) -> None:
        self.first_eval: int | None = None
        """The step of the run's first evaluation: the memory-growth trend is fitted over the samples after it."""

    def state_dict(self) -> dict[str, Any]:
        return {"first_eval": self.first_eval}

    def state_schema(self) -> Schema:
        return {"first_eval": Whole(none=True)}  # a step, or None before the first evaluation

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first_eval = state["first_eval"]

    def before_train(self, run: Run) -> None:
        self.sampler = MemorySampler(run.out_dir / run_files.MEMORY, run.cfg.memory.interval, run.proc.device)
        self.sampler.step = self.started = run.progress.step
        if self.sampler.set_aside is not None:
            run.events.event(run.progress.step, "memory_log_set_aside", {"path": str(self.sampler.set_aside)},
                             f"memory.csv was not a memory log (unreadable, or another header): kept as "
                             f"{self.sampler.set_aside.name}, and a new memory.csv begun")
        self.sampler.start()

    def after_step(self, run: Run) -> None:
        self.sampler.check()  # a full disk met by the background thread ends the run, in one line naming the file
        self.sampler.step = run.progress.step

    def after_eval(self, run: Run, split: str, metrics: dict[str, float]) -> None:
        if self.first_eval is None:
            self.first_eval = run.progress.step

    def after_train(self, run: Run) -> None:
        peaks = self.sampler.stop()
        if peaks:  # the run's result reads it from this record
            run.events.event(self.sampler.step, "memory", peaks)
        self.report_growth(run)

    def report_growth(self, run: Run) -> None:
        """The resident memory's trend after the first evaluation, per 1,000 steps, and on a unified-memory device
        the trend of the RAM the GPU holds; a steady rise is flagged."""
        if self.first_eval is None:
            return
        columns = {"rss_mib": "RSS"}
        if self.sampler.meminfo is not None:
            columns["unified_gpu_mib"] = "the GPU's share of RAM (NvMapMemUsed)"
        fields: dict[str, float | int | bool] = {}
        parts, flagged, short_spans = [], [], []
        for column, what in columns.items():
            growth = memory_growth(self.sampler.path, self.first_eval, column, self.sampler.first_row)
            if growth is None:
                continue
            per_1000, r2, samples, _ = growth
            steady = growth.steady
            key = "rss" if column == "rss_mib" else "unified_gpu"
            fields.update({f"{key}_mib_per_1000_steps": round(per_1000, 2), f"{key}_r2": round(r2, 3)})
            if column == "rss_mib":
                fields.update({"r2": round(r2, 3), "samples": samples, "steady": steady})
            else:
                fields["unified_gpu_steady"] = steady
            parts.append(f"{per_1000:+.1f} MiB of {what}")
            if not growth.long_enough:
                short_spans.append(growth.steps)
            if steady:
                flagged.append(what)
        if not parts:
            return
        samples = fields.get("samples", "")
        since = (f"after the first evaluation (step {self.first_eval})" if self.first_eval >= self.started else
                 f"since this process resumed the run (step {self.started})")
        message = f"memory {since}: {' and '.join(parts)} per 1,000 steps over {samples} samples"
        if short_spans and len(short_spans) == len(parts):  # a short run's few samples: the allocator settling
            message += (f" and {short_spans[0]:g} steps: too short to tell a trend (that takes {STEADY_SAMPLES} "
                        f"samples over {STEADY_STEPS} steps)")
        if flagged:
            message += (f" - a steady rise of {' and '.join(flagged)} (a leak, or a cache that keeps growing): "
                        "watch memory.csv")
        run.events.event(run.progress.step, "memory_growth", fields, message)


class MemoryLimit(Hook):
    """``memory.limit``: a micro-batch starting while the process's RSS is over it counts as out of memory. The
    RSS is that of the memory in use: what malloc keeps free for reuse (``memory.keep_freed``) is given back to the
    kernel before it counts, so a re-cut step that needs less is not held to the bigger one's high-water mark."""

    stage = "guard"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def before_forward(self, run: Run, index: int) -> None:
        if rss_bytes() > self.limit:
            release_freed()
        if (rss := rss_bytes()) > self.limit:
            raise MemoryLimitExceeded(f"the process uses {rss / 2**20:.0f} MiB > memory.limit "
                                      f"{self.limit / 2**20:.0f} MiB")


HOOKS.register("memory_log", lambda run: MemoryLog() if run.proc.is_main else None)
HOOKS.register("memory_limit", lambda run: MemoryLimit(parse_size(run.cfg.memory.limit))
               if run.cfg.memory.limit is not None else None)
