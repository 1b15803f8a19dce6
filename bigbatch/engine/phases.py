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

A sub-phase is time inside those phases spent on one kind of work, reported beside them and not added:

    t_bn_sync   cross-device BatchNorm's all-reduces (``norm.sync: bigbatch`` on several processes), inside
                t_forward and t_backward: how much of them is waiting for the other devices' statistics

Sub-phases are timed only at the steps whose times are read (the phase-timing hook says which: ``time_next_step``): at a
step that is not logged each call pays one check (under 0.1 µs), no clock read.

``log.timing``: ``events`` (default) times with the host clock on the CPU and with CUDA events on a GPU, read only at
the steps that are logged (one wait for the step's last event there, none elsewhere); ``exact`` synchronises the
device at every switch (the times are then the device's, at the cost of the overlap between host and device);
``off`` measures nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")
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
        self.measure_next = False
        """Whether the next step's sub-phases are timed (``time_next_step``)."""
        self._measuring = False
        self._sub_phases: dict[str, SubPhase] = {}

    def time_next_step(self, measure: bool) -> None:
        """Whether the next step's sub-phases are timed: the phase-timing hook says so for the steps it reads."""
        self.measure_next = measure

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
        self._measuring = self.measure_next
        for sub in self._sub_phases.values():
            sub.spans.clear()
        self._marks = [(phase, self._now())]

    def sub_phase(self, name: str) -> SubPhase:
        """The timer of sub-phase ``name`` (``t_<name>`` in the step's times): call ``timer(fn, *args)``."""
        return self._sub_phases.setdefault(name, SubPhase(self, name))

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
        inside = {f"t_{name}": round(sum(_seconds(a, b) for a, b in sub.spans), 6)
                  for name, sub in self._sub_phases.items() if sub.spans}
        for sub in self._sub_phases.values():
            sub.spans.clear()
        spans: dict[str, float] = defaultdict(float)
        backwards: list[float] = []
        for (phase, start), (_, stop) in zip(marks, marks[1:], strict=False):
            seconds = _seconds(start, stop)
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
        return {**times, **inside}


def _seconds(start: float | torch.cuda.Event, stop: float | torch.cuda.Event) -> float:
    if isinstance(start, torch.cuda.Event):
        return start.elapsed_time(stop) / 1000  # type: ignore[arg-type]
    return stop - start  # type: ignore[operator]


class SubPhase:
    """Times one kind of work inside the phases (a sub-phase, e.g. ``bn_sync``): ``timer(fn, *args)`` runs
    ``fn(*args)`` and, at a step whose times will be read, keeps its start and end marks. Shared by reference (a
    copy of the model that holds it times into the same clock)."""

    def __init__(self, clock: PhaseClock, name: str) -> None:
        self.clock, self.name = clock, name
        self.spans: list[tuple[float | torch.cuda.Event, float | torch.cuda.Event]] = []

    def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        clock = self.clock
        if not (clock._measuring and clock._marks):
            return fn(*args)
        start = clock._now()
        result = fn(*args)
        self.spans.append((start, clock._now()))
        return result

    def __deepcopy__(self, memo: dict) -> SubPhase:
        return self


class PhaseTotals:
    """The phases summed over the measured steps: the run's MegDet-style table."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.steps = 0

    def add(self, times: dict[str, float]) -> None:
        for key, value in times.items():
            self.sums[key] += value
        self.steps += 1

    def table(self, bn_routes: list[str] | None = None) -> str:
        """Mean seconds per step and share of the step, one line per phase; ``bn_routes``: how the cross-device BN
        sums went (``largebatch/sync_bn.py``'s ``all_reduce_routes``), named on their line."""
        total = self.sums["t_step"]
        lines = [f"phase      s/step   share   (mean of {self.steps} measured steps)"]
        for phase in PHASES:
            seconds = self.sums[f"t_{phase}"]
            lines.append(f"{phase:<9} {seconds / self.steps:8.4f}  {100 * seconds / max(total, 1e-12):5.1f} %")
        lines.append(f"{'step':<9} {total / self.steps:8.4f}  100.0 %")
        if "t_bn_sync" in self.sums:  # a sub-phase: inside forward and backward, not added
            seconds = self.sums["t_bn_sync"]
            over = f" over {' and '.join(bn_routes)}" if bn_routes else ""
            lines.append(f"  of which cross-device BN all-reduce{over} (inside forward + backward): "
                         f"{seconds / self.steps:.4f} s/step, {100 * seconds / max(total, 1e-12):.1f} %")
        return "\n".join(lines)
