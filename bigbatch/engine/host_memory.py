"""Host memory that a training step frees stays in the process for the next micro-batch (``memory.keep_freed``).

A step allocates and frees the same activations and gradients every micro-batch. glibc's malloc maps each block
over its mmap threshold (which rises, as blocks are freed, up to 32 MiB) on its own and unmaps it when freed, and
trims the heap's top whenever more than twice that is free there. Either way the kernel takes the pages back and
the next micro-batch faults every page in again, each one zeroed by the kernel. On the project's 2-core virtual
machine that cost timm's ResNet-18 a third of its forward and backward's speed at 32 x 128 px (38,000 minor
faults a pass; docs/benchmarks.md).

``keep_freed()`` raises both thresholds to 1 GiB (``mallopt``): a freed block goes back to malloc's free lists and
serves a later request, so a step's pages are faulted in once. PyTorch's CPU performance tuning guide gets the
same by loading jemalloc or TCMalloc in place of glibc's malloc; these are glibc's own switches, and nothing is
installed. The settings last for the process, and DataLoader workers forked after them inherit them. Other C
libraries (macOS, Windows, musl) are left as they are.

The price is resident memory. The process holds its high-water mark between steps, and the heap fragments more
than separately mapped blocks do, so the peak itself rises: ResNet-18 at 128 px, 16 % at micro-batch 32 and 45 %
at 256 (docs/memory.md). The planner measures with the same settings, over more steps (``engine/planner.py``),
and a measurement of the memory in use calls ``release_freed()`` first (``memory.limit``:
``engine/hooks/memory.py``).
"""

from __future__ import annotations

import ctypes
from functools import cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter numbers (glibc's ``malloc.h``)."""
MAP_ABOVE = 1 << 30
"""Blocks up to 1 GiB come from the heap (and go back to it); only bigger ones are mapped on their own."""
TRIM_ABOVE = 1 << 30
"""The heap's top is handed back to the kernel only when more than 1 GiB of it is free."""


@cache
def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it has ``malloc_trim``, which no other C library has), else
    None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # Windows: no process-wide handle
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


MAP_ABOVE_OLD_GLIBC = 32 << 20
"""The highest mmap threshold a glibc before 2.35 accepts on a 64-bit machine (``HEAP_MAX_SIZE / 2``; its
``do_set_mmap_threshold`` refuses more, e.g. the Jetson's JetPack 4, glibc 2.27): what is kept there instead."""


def keep_freed() -> bool:
    """Keep the memory this process frees for its own next allocations; True where both thresholds applied (glibc).
    Each is set on its own: an older glibc refuses the 1 GiB mmap threshold (then :data:`MAP_ABOVE_OLD_GLIBC`),
    and its refusal leaves the trim threshold to be set still."""
    libc = glibc()
    if libc is None:
        return False
    mapped = bool(libc.mallopt(M_MMAP_THRESHOLD, MAP_ABOVE)) or bool(libc.mallopt(M_MMAP_THRESHOLD,
                                                                                  MAP_ABOVE_OLD_GLIBC))
    trimmed = bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE))
    return mapped and trimmed


def release_freed() -> None:
    """Give the kernel back the free memory the heap holds (``malloc_trim``), so that the RSS is the memory in
    use."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)
