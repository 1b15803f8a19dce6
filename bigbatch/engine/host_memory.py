"""Host memory that a training step frees stays in the process for the next micro-batch (``memory.keep_freed``).

A step allocates and frees the same activations and gradients every micro-batch. glibc's malloc serves blocks up
to its mmap threshold from the heap (the threshold rises, as blocks are freed, up to 32 MiB), and trims the heap's
top whenever more than its trim threshold (twice the mmap threshold, so at most 64 MiB) is free there. At the end
of a backward pass a step's activations are all free at once, the heap is trimmed, the kernel takes the pages
back, and the next micro-batch faults every page in again, each zeroed by the kernel. On the project's 2-core
virtual machine that cost timm's ResNet-18 a third of its forward and backward's speed at 32 x 128 px (38,000
minor faults a pass; docs/benchmarks.md).

``keep_freed()`` raises the trim threshold to 1 GiB (``mallopt``), so the heap keeps its pages and a step's are
faulted in once. Setting it also fixes the mmap threshold, which glibc then stops raising; it is set to glibc's
own ceiling for it, 32 MiB. Bigger blocks are still mapped afresh and unmapped when freed: kept in the heap, they
fragment it (ResNet-18 at 128 px with the mmap threshold at 1 GiB: 14 % more peak RSS at micro-batch 32, 42 %
more at 256), while the heap's own blocks cost no more peak memory kept than trimmed, since the step reached
that peak anyway.

PyTorch's CPU performance tuning guide gets the same effect by loading jemalloc or TCMalloc in place of glibc's
malloc; these are glibc's own switches, and nothing is installed. The settings last for the process, and
DataLoader workers forked after them inherit them. Other C libraries (macOS, Windows, musl) are left as they
are. A measurement of the memory in use calls ``release_freed()`` first (``memory.limit``:
``engine/hooks/memory.py``).
"""

from __future__ import annotations

import ctypes
from functools import cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter numbers (glibc's ``malloc.h``)."""
TRIM_ABOVE = 1 << 30
"""The heap's top is handed back to the kernel only when more than 1 GiB of it is free."""
MAP_ABOVE = 32 << 20
"""Blocks over 32 MiB are mapped on their own and unmapped when freed (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on
64-bit systems, where its dynamic threshold stops)."""


@cache
def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it has ``malloc_trim``, which no other C library has), else
    None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # Windows: no process-wide handle
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_freed() -> bool:
    """Keep the memory this process frees for its own next allocations; True where it applies (glibc)."""
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MAP_ABOVE)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE))


def release_freed() -> None:
    """Give the kernel back the free memory the heap holds (``malloc_trim``), so that the RSS is the memory in
    use."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)
