"""Whether a process is still there: what proves that a file named after its creator's PID was left by a run that
is over (a stale shared-memory segment, a partial shapes set)."""

from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` may still exist on this machine. Only a definite "no such process" answers False, so
    that a caller removing what a dead process left never removes a live one's."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's process, or no pid at all: keep the file
        return True
    return True
