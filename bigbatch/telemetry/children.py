"""The memory of a process's children (its data workers), sampled: their share of a run's memory.

A DataLoader worker is forked from the training process: the libraries, the dataset and whatever else it has not
written since are the parent's pages, which the parent's RSS counts already. What the workers add is their private
memory, USS = ``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup`` (the kernel's sum over the process's
mappings; Linux 4.14 and later): the images they decode, the batches they build and the parent's pages they have
written to. Summing their RSS instead would count the shared pages once per worker.

:class:`ChildrenSampler` sums it over every descendant of a process each ``interval`` seconds in a thread and keeps
the largest sum: the workers' memory at its most, to add to the parent's own peak (``engine/planner.py``). Where
``/proc`` has no such file (not Linux) it reads 0.
"""

from __future__ import annotations

import threading
from pathlib import Path

PROC = Path("/proc")


def private_bytes(pid: int, proc: Path = PROC) -> int:
    """Process ``pid``'s private resident memory (USS) in bytes; 0 once it is gone or where it cannot be read."""
    total = 0
    try:
        with open(proc / str(pid) / "smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return 0
    return total


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every process below ``pid`` (``/proc/PID/task/TID/children``, for each of its threads), children first."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in (proc / str(parent) / "task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):  # gone meanwhile
                continue
            found += kids
            todo += kids
    return found


class ChildrenSampler:
    """The largest private memory that the descendants of ``pid`` held together, sampled every ``interval`` s
    (``start`` ... ``stop``, which returns it in bytes)."""

    def __init__(self, pid: int, interval: float = 0.05, proc: Path = PROC) -> None:
        self.pid, self.interval, self.proc = pid, interval, proc
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bigbatch-children-memory", daemon=True)

    def sample(self) -> int:
        held = sum(private_bytes(child, self.proc) for child in descendants(self.pid, self.proc))
        self.peak = max(self.peak, held)
        return held

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> ChildrenSampler:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.peak
