"""Memory: the ``memory.csv`` sampler (main process) and ``memory.limit`` on the CPU (every process)."""

from __future__ import annotations

from bigbatch.config import parse_size
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS
from bigbatch.telemetry.memory import MemoryLimitExceeded, MemorySampler, rss_bytes


class MemoryLog(Hook):
    """Samples memory every ``memory.interval`` s into ``memory.csv``; at the end an ``event: memory`` record of
    the peaks, which are also the run's result."""

    def before_train(self, run: Run) -> None:
        self.sampler = MemorySampler(run.out_dir / "memory.csv", run.cfg.memory.interval, run.proc.device)
        self.sampler.step = run.state.step
        self.sampler.start()

    def after_step(self, run: Run) -> None:
        self.sampler.step = run.state.step

    def after_train(self, run: Run) -> None:
        peaks = self.sampler.stop()
        run.extras["memory"] = peaks
        if peaks:
            run.events.event(self.sampler.step, "memory", peaks)


class MemoryLimit(Hook):
    """``memory.limit``: a micro-batch starting while the process's RSS is over it counts as out of memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def before_forward(self, run: Run, index: int) -> None:
        if (rss := rss_bytes()) > self.limit:
            raise MemoryLimitExceeded(f"the process uses {rss / 2**20:.0f} MiB > memory.limit "
                                      f"{self.limit / 2**20:.0f} MiB")


# Early, so that samples taken while a step is evaluated or saved carry that step.
HOOKS.register("memory_log", lambda run: MemoryLog() if run.proc.is_main else None, order=5)
HOOKS.register("memory_limit", lambda run: MemoryLimit(parse_size(run.cfg.memory.limit))
               if run.cfg.memory.limit is not None else None, order=41)
