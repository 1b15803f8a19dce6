"""The memory of a process's children (its data workers), sampled: their share of a run's memory.

A DataLoader worker is forked from the training process: the libraries, the dataset and whatever else it has not
written since are the parent's pages, which the parent's RSS counts already. What the workers add is their private
memory, USS = ``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup`` (the kernel's sum over the process's
mappings; Linux 4.14 and later): the images they decode, the batches they build and the parent's pages they have
written to. Summing their RSS instead would count the shared pages once per worker.

A child that shares its parent's address space is not counted: a subprocess between ``vfork`` and ``exec`` (Python's
``subprocess`` and ``posix_spawn`` start them so), whose ``smaps_rollup`` is its parent's, so that all of the
parent's private memory would read as the child's. One starts as torch loads (its CUDA build imports
``cuda.pathfinder``, whose ``ctypes.util.find_library`` runs ``ldconfig -p``): sampled in that moment, the digits
recipe's measuring process read 211 MiB of "workers" that it does not have. ``kcmp(2)`` (``KCMP_VM``) tells them
apart; where it is not available (another architecture, a sandbox that forbids it) every child counts, as before.

:class:`ChildrenSampler` sums it over every descendant of a process each ``interval`` seconds in a thread and keeps
the largest sum: the workers' memory at its most, to add to the parent's own peak (``engine/planner.py``). Where
``/proc`` has no such file (not Linux) it reads 0.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import threading
from pathlib import Path

PROC = Path("/proc")
KCMP_VM = 1
"""``kcmp(2)``'s type: do two processes share one address space?"""
SYS_KCMP = {"x86_64": 312, "aarch64": 272}
"""The ``kcmp`` system call's number, by architecture."""


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
    return [child for child, _ in family(pid, proc)]


def family(pid: int, proc: Path = PROC) -> list[tuple[int, int]]:
    """(process, its parent) for every process below ``pid``; one that ends while it is read is left out, with
    its children."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list((proc / str(parent) / "task").iterdir())
        except OSError:  # gone meanwhile
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):  # gone meanwhile
                continue
            found += [(kid, parent) for kid in kids]
            todo += kids
    return found


def shares_memory(pid: int, other: int) -> bool:
    """Whether two processes have one address space (``kcmp(pid, other, KCMP_VM)``): a child between ``vfork`` and
    ``exec``. False where that cannot be told (no ``kcmp``, a process gone)."""
    number = SYS_KCMP.get(platform.machine())
    if number is None:
        return False
    return _libc().syscall(number, pid, other, KCMP_VM, 0, 0) == 0


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class ChildrenSampler:
    """The largest private memory that the descendants of ``pid`` held together, sampled every ``interval`` s
    (``start`` ... ``stop``, which returns it in bytes)."""

    def __init__(self, pid: int, interval: float = 0.05, proc: Path = PROC) -> None:
        self.pid, self.interval, self.proc = pid, interval, proc
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bigbatch-children-memory", daemon=True)

    def sample(self) -> int:
        """The descendants' private memory now, less those that share their parent's (``shares_memory``, asked of
        the real ``/proc`` only)."""
        real = self.proc == PROC
        held = sum(private_bytes(child, self.proc) for child, parent in family(self.pid, self.proc)
                   if not (real and shares_memory(child, parent)))
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
