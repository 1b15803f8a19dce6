"""A background sampler of memory use, written to ``memory.csv`` in the run directory.

Like the ``tegrastats`` log of the Darknet-on-Jetson write-up (docs/references.md): every ``memory.interval``
seconds (default 5), and once at the start and at the end, one row with the wall time, the seconds since the start,
the optimizer step, the process's resident memory (RSS), the system's used memory and swap, and on
CUDA the device memory allocated, reserved, and the peak allocated so far. All sizes in MiB.
The peaks go into the final summary and into ``metrics.jsonl`` (an ``event: memory`` record).

On a unified-memory device (a Jetson: the GPU allocates from the system's RAM) ``unified_gpu_mib`` is the RAM
that the GPU holds, all processes together: ``NvMapMemUsed`` of ``/proc/meminfo``, which NVIDIA's "CUDA for Tegra"
names as the device's allocated memory. It is what ``tegrastats`` cannot separate from the rest of "RAM used",
and what climbs when GPU memory is the part that grows. It is 0 on every other machine.
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import NamedTuple

import psutil
import torch

from bigbatch.floor.files import naming

MiB = 2**20
COLUMNS = ["time", "elapsed_s", "step", "rss_mib", "system_used_mib", "swap_used_mib",
           "cuda_allocated_mib", "cuda_reserved_mib", "cuda_peak_mib", "unified_gpu_mib"]
MEMINFO = Path("/proc/meminfo")


def unified_gpu_mib(meminfo: Path) -> float | None:
    """The RAM a unified-memory GPU holds (``NvMapMemUsed``, kB in ``/proc/meminfo``) in MiB; None where the
    kernel has no such line (every machine but a Jetson) or the file cannot be read."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NvMapMemUsed:"):
                    return int(line.split()[1]) * 1024 / MiB
    except (OSError, ValueError, IndexError):
        return None
    return None


class MemorySampler:
    def __init__(self, path: Path, interval: float, device: torch.device, meminfo: Path | None = None):
        self.path, self.interval, self.device = path, interval, device
        meminfo = MEMINFO if meminfo is None else meminfo
        self.meminfo = meminfo if unified_gpu_mib(meminfo) is not None else None
        """Where the unified-memory GPU's RAM is read, or None (not such a device)."""
        self.step = 0
        """The optimizer steps done; the training loop keeps it current."""
        self.peaks: dict[str, float] = {}
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._start = time.monotonic()
        existing = _memory_log_columns(path)
        self.set_aside: Path | None = None
        """Where a ``memory.csv`` that was not a memory log (unreadable, or another header) was moved, or None."""
        if existing is None and path.exists() and path.stat().st_size > 0:
            self.set_aside = _unused_name(path.with_name(path.name + ".unreadable"))
            path.rename(self.set_aside)  # kept, not deleted
        self.columns = existing or COLUMNS
        """The file's columns: a resumed run appends under the header its file already has (a log begun before
        ``unified_gpu_mib`` existed goes on without it)."""
        self._file = open(path, "a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)
        if existing is None:
            self._csv.writerow(self.columns)
            self._file.flush()
        self.first_row = self._file.tell()
        """Where this process's samples begin in the file (a resumed run's follow those of the runs before)."""
        self._thread = threading.Thread(target=self._run, name="bigbatch-memory", daemon=True)
        self.failure: OSError | None = None
        """Why the background thread stopped sampling (a full disk while it appended a row), or None; the training
        loop raises it (:meth:`check`), so the run ends in one line naming ``memory.csv``."""

    def start(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except OSError as error:  # kept for the main thread: a thread's exception would be a traceback
                self.failure = error
                return

    def check(self) -> None:
        """Raise what stopped the background thread's sampling, if anything did."""
        if self.failure is not None:
            raise self.failure

    def sample(self) -> dict[str, float | None]:
        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        row = {
            "time": round(time.time(), 3),
            "elapsed_s": round(time.monotonic() - self._start, 3),
            "step": self.step,
            "rss_mib": self._process.memory_info().rss / MiB,
            "system_used_mib": (vm.total - vm.available) / MiB,
            "swap_used_mib": swap.used / MiB,
            "cuda_allocated_mib": 0.0,
            "cuda_reserved_mib": 0.0,
            "cuda_peak_mib": 0.0,
            "unified_gpu_mib": unified_gpu_mib(self.meminfo) if self.meminfo is not None else 0.0,  # None: unread
        }
        if self.device.type == "cuda":
            row["cuda_allocated_mib"] = torch.cuda.memory_allocated(self.device) / MiB
            row["cuda_reserved_mib"] = torch.cuda.memory_reserved(self.device) / MiB
            row["cuda_peak_mib"] = torch.cuda.max_memory_allocated(self.device) / MiB
        with self._lock, naming(self.path):  # a full disk: an OSError naming memory.csv
            self._csv.writerow([_cell(c, row.get(c, "")) for c in self.columns])
            self._file.flush()
            for key, value in row.items():
                if key.endswith("_mib") and value is not None:
                    self.peaks[f"peak_{key}"] = max(self.peaks.get(f"peak_{key}", 0.0), value)
        return row

    def stop(self) -> dict[str, float]:
        """Stop sampling, take a last sample, close the file; returns the peaks (MiB). What stopped the background
        thread's sampling (:meth:`check`) is raised, the file closed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.check()
            self.sample()
        finally:
            with naming(self.path):
                self._file.close()
        return {k: round(v, 1) for k, v in self.peaks.items() if v > 0}


def _cell(column: str, value: object) -> object:
    if value is None:
        return ""  # not read this time: an empty cell, not a zero that would bend the trend
    if isinstance(value, float) and column not in ("time", "elapsed_s"):
        return f"{value:.1f}"
    return value  # the clocks to the millisecond: a short run's samples must not all read 0.0 (restarts are found
    # where ``elapsed_s`` goes back)


REQUIRED = ("time", "step", "rss_mib")


def _memory_log_columns(path: Path) -> list[str] | None:
    """The header of an existing ``memory.csv`` that is a memory log; None where there is no file, an empty one,
    or one whose first line is not such a header (not UTF-8, NUL bytes left by a power loss, another file)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return header if header and all(column in header for column in REQUIRED) else None


def _unused_name(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... : the first that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


STEADY_R2 = 0.8
"""A rise counts as steady when a straight line explains this share of the samples' variance ..."""
STEADY_SAMPLES = 20
"""... over at least this many samples ..."""
STEADY_STEPS = 200
"""... spanning at least this many steps, all of one process (since the run's last start): with a few samples, the
allocator's settling after an evaluation looks like a line, and a resumed process's own baseline beside the one
before it like a rise."""


class Growth(NamedTuple):
    per_1000: float
    """MiB per 1,000 steps: the least-squares slope."""
    r2: float
    """The share of the samples' variance the line explains."""
    samples: int
    steps: float
    """The steps the samples span."""

    @property
    def long_enough(self) -> bool:
        """Enough samples over enough steps to call a trend (``STEADY_SAMPLES``, ``STEADY_STEPS``)."""
        return self.samples >= STEADY_SAMPLES and self.steps >= STEADY_STEPS

    @property
    def steady(self) -> bool:
        """A steady rise: a line explains most of it, over enough samples and steps (``STEADY_*``)."""
        return self.per_1000 > 0 and self.r2 >= STEADY_R2 and self.long_enough


def memory_growth(path: Path, after_step: int, column: str = "rss_mib", since: int = 0) -> Growth | None:
    """The trend of ``column`` in ``memory.csv`` over the samples taken after ``after_step`` (the first evaluation:
    the Darknet-on-Jetson write-up's memory climbed during training, past the allocations of the first steps and
    evaluation), from byte ``since`` of the file on (``MemorySampler.first_row``: this process's samples, so that a
    resumed run does not fit a line through its own baseline and the one of the process before):
    a :class:`Growth`, or None with fewer than 3 samples over at least two steps (samples without a value are left
    out). Slope ``b = sum (s - s_mean)(m - m_mean) / sum (s - s_mean)^2``; ``R^2 = b^2 var(s) / var(m)``."""
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader([f.readline()]), [])
            if since > f.tell():
                f.seek(since)
            for r in csv.DictReader(f, fieldnames=header):
                try:
                    step, value = float(r["step"]), float(r[column])
                except (KeyError, TypeError, ValueError):  # no such column, or a sample not read (empty cell)
                    continue
                if step > after_step:
                    rows.append((step, value))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if len(rows) < 3 or len({step for step, _ in rows}) < 2:
        return None
    n = len(rows)
    mean_s, mean_m = sum(s for s, _ in rows) / n, sum(m for _, m in rows) / n
    var_s = sum((s - mean_s) ** 2 for s, _ in rows)
    var_m = sum((m - mean_m) ** 2 for _, m in rows)
    slope = sum((s - mean_s) * (m - mean_m) for s, m in rows) / var_s
    r2 = slope * slope * var_s / var_m if var_m > 0 else 0.0
    steps = max(s for s, _ in rows) - min(s for s, _ in rows)
    return Growth(slope * 1000, r2, n, steps)


class MemoryLimitExceeded(RuntimeError):
    """The process went over ``memory.limit`` (the CPU's stand-in for CUDA's out-of-memory error)."""


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss
