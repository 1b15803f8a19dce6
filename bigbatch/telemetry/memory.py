"""A background sampler of memory use, written to ``memory.csv`` in the run directory.

Like the Darknet/Jetson seed's ``tegrastats`` log: every ``memory.interval`` seconds (default 5),
and once at the start and at the end, one row with the wall time, the seconds since the start,
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

import psutil
import torch

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
        self.columns = _header(path) or COLUMNS
        """The file's columns: a resumed run appends under the header its file already has."""
        new = not path.exists()
        self._file = open(path, "a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)
        if new:
            self._csv.writerow(self.columns)
        self._thread = threading.Thread(target=self._run, name="bigbatch-memory", daemon=True)

    def start(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> dict[str, float]:
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
            "unified_gpu_mib": (unified_gpu_mib(self.meminfo) or 0.0) if self.meminfo is not None else 0.0,
        }
        if self.device.type == "cuda":
            row["cuda_allocated_mib"] = torch.cuda.memory_allocated(self.device) / MiB
            row["cuda_reserved_mib"] = torch.cuda.memory_reserved(self.device) / MiB
            row["cuda_peak_mib"] = torch.cuda.max_memory_allocated(self.device) / MiB
        with self._lock:
            self._csv.writerow([_cell(c, row.get(c, "")) for c in self.columns])
            self._file.flush()
            for key, value in row.items():
                if key.endswith("_mib"):
                    self.peaks[f"peak_{key}"] = max(self.peaks.get(f"peak_{key}", 0.0), value)
        return row

    def stop(self) -> dict[str, float]:
        """Stop sampling, take a last sample, close the file; returns the peaks (MiB)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        self._file.close()
        return {k: round(v, 1) for k, v in self.peaks.items() if v > 0}


def _cell(column: str, value: object) -> object:
    return f"{value:.1f}" if isinstance(value, float) and column != "time" else value


def _header(path: Path) -> list[str] | None:
    """The columns of an existing ``memory.csv`` (None: no file, or an empty one)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), None) or None
    except FileNotFoundError:
        return None


STEADY_R2 = 0.8
"""A rise counts as steady when a straight line explains this share of the samples' variance ..."""
STEADY_SAMPLES = 10
"""... over at least this many samples (with 3 or 4, the allocator's settling after an evaluation looks like a
line)."""


def memory_growth(path: Path, after_step: int, column: str = "rss_mib") -> tuple[float, float, int] | None:
    """The trend of ``column`` in ``memory.csv`` over the samples taken after ``after_step`` (the first evaluation:
    the Jetson seed's memory climbed during training, past the allocations of the first steps and evaluation):
    ``(MiB per 1,000 steps, R^2 of the least-squares line, samples)``, or None with fewer than 3 samples over at
    least two steps. Slope ``b = sum (s - s_mean)(m - m_mean) / sum (s - s_mean)^2``; ``R^2 = b^2 var(s) / var(m)``."""
    try:
        with open(path, newline="") as f:
            rows = [(float(r["step"]), float(r[column])) for r in csv.DictReader(f) if float(r["step"]) > after_step]
    except (OSError, KeyError, ValueError):
        return None
    if len(rows) < 3 or len({step for step, _ in rows}) < 2:
        return None
    n = len(rows)
    mean_s, mean_m = sum(s for s, _ in rows) / n, sum(m for _, m in rows) / n
    var_s = sum((s - mean_s) ** 2 for s, _ in rows)
    var_m = sum((m - mean_m) ** 2 for _, m in rows)
    slope = sum((s - mean_s) * (m - mean_m) for s, m in rows) / var_s
    r2 = slope * slope * var_s / var_m if var_m > 0 else 0.0
    return slope * 1000, r2, n


class MemoryLimitExceeded(RuntimeError):
    """The process went over ``memory.limit`` (the CPU's stand-in for CUDA's out-of-memory error)."""


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss
