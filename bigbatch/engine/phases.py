"""Where a training step's time goes: disjoint phases that add up to the step (MegDet's breakdown of an iteration).

A :class:`PhaseClock` is always in exactly one phase; ``switch(phase)`` ends the current one and starts the next, so
the phases of a step add up to its wall-clock time by construction:

    t_data      waiting for the step's micro-batches (the input pipeline)
    t_forward   the forwards and losses of the micro-batches
    t_backward  their backwards, DDP's gradient all-reduce included where it overlaps them
    t_sync      under DDP with several micro-batches: how much longer the last (synchronising) backward took
                than the mean of the others, i.e. the wait for the all-reduce; 0 on one process
    t_update    unscale, clip, optimizer step, loss-scale update, per-step BatchNorm statistics, EMA
    t_other     the rest: moving micro-batches to the device, the step's hooks (memory checks, the noise scale)
    t_step      the whole step, the sum of the above

``log.timing``: ``events`` (default) times with the host clock on the CPU and with CUDA events on a GPU, read only at
the steps that are logged (one wait for the step's last event there, none elsewhere); ``exact`` synchronises the
device at every switch (the times are then the device's, at the cost of the overlap between host and device);
``off`` measures nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

PHASES = ("data", "forward", "backward", "sync", "update", "other")


class PhaseClock:
    """Phases of one step on ``device`` (see the module docstring). ``last_backward(True)`` marks the backward that
    synchronises under DDP, so that its excess over the others is reported as ``t_sync``."""

    def __init__(self, mode: str = "events", device: torch.device | None = None) -> None:
        if mode not in ("off", "events", "exact"):
            raise ValueError(f"log.timing must be off, events or exact, got {mode!r}")
        self.mode = mode
        self.cuda = device is not None and device.type == "cuda"
        self._marks: list[tuple[str, float | torch.cuda.Event]] = []
        self._phase = ""
        self.backwards: list[float] = []

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def _now(self) -> float | torch.cuda.Event:
        if self.cuda and self.mode == "events":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.cuda:  # exact
            torch.cuda.synchronize()
        return time.perf_counter()

    def begin(self, phase: str = "data") -> None:
        """Start a step in ``phase``."""
        if not self.enabled:
            return
        self._marks = [(phase, self._now())]

    def switch(self, phase: str) -> None:
        """End the current phase and start ``phase`` (a ``backward`` of the last micro-batch: ``last_backward``)."""
        if self.enabled and self._marks:
            self._marks.append((phase, self._now()))

    def end(self, measure: bool = True) -> dict[str, float] | None:
        """End the step; -> ``{"t_data": s, ..., "t_step": s}`` when ``measure`` (CUDA events: one wait for the
        step's last event), else None (the marks are dropped)."""
        if not self.enabled or not self._marks:
            return None
        end = self._now()
        marks, self._marks = [*self._marks, ("", end)], []
        if not measure:
            return None
        if isinstance(end, torch.cuda.Event):
            end.synchronize()
        spans: dict[str, float] = defaultdict(float)
        backwards: list[float] = []
        for (phase, start), (_, stop) in zip(marks, marks[1:], strict=False):
            seconds = (start.elapsed_time(stop) / 1000 if isinstance(start, torch.cuda.Event)  # type: ignore[arg-type]
                       else stop - start)  # type: ignore[operator]
            if phase == "last_backward":
                spans["last_backward"] += seconds
            else:
                spans[phase] += seconds
                if phase == "backward":
                    backwards.append(seconds)
        last = spans.pop("last_backward", 0.0)
        sync = max(0.0, last - sum(backwards) / len(backwards)) if last and backwards else 0.0
        spans["backward"] += last - sync
        spans["sync"] = sync
        times = {f"t_{phase}": round(spans.get(phase, 0.0), 6) for phase in PHASES}
        times["t_step"] = round(sum(spans.values()), 6)
        return times


class PhaseTotals:
    """The phases summed over the measured steps: the run's MegDet-style table."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.steps = 0

    def add(self, times: dict[str, float]) -> None:
        for key, value in times.items():
            self.sums[key] += value
        self.steps += 1

    def table(self) -> str:
        """Mean seconds per step and share of the step, one line per phase."""
        total = self.sums["t_step"]
        lines = [f"phase      s/step   share   (mean of {self.steps} measured steps)"]
        for phase in PHASES:
            seconds = self.sums[f"t_{phase}"]
            lines.append(f"{phase:<9} {seconds / self.steps:8.4f}  {100 * seconds / max(total, 1e-12):5.1f} %")
        lines.append(f"{'step':<9} {total / self.steps:8.4f}  100.0 %")
        return "\n".join(lines)
