"""Leaving a process without Python's finalization: the exit of the ``bigbatch`` command and of the processes it
starts to measure itself (the memory planner's, ``plan --devices``' pair), so that they end as the run they measure.

A process that has loaded torch spends about a second at exit in the interpreter's finalization: it tears down every
module and frees every object one by one (0.48 s for ``import torch`` alone, 0.99 s with torchvision and timm, 1.05-1.16
s after a training run, on the project's 2-core machine; ``docs/benchmarks.md``). Nothing a command wrote depends on
it. So :func:`exit_now` does the parts of an exit that can matter, in the interpreter's order and with its own calls,
and then ``os._exit``:

1. ``threading``'s exit hooks (they tell the idle workers of a ``concurrent.futures`` pool to stop: a pool of the
   decoding's, never shut down, is still there), then wait for every thread that is not a daemon;
2. run the ``atexit`` callbacks: logging's flush, ``weakref.finalize`` objects (temporary folders), multiprocessing's
   end of its children (DataLoader workers);
3. flush ``stdout`` and ``stderr``, then the C library's streams (what native code printed: a library's verbose
   output); where the reader of a pipe has left (``bigbatch ... | head``), the status is 1, without a traceback, and
   where a write fails otherwise (a full disk), one ``error:`` line and status 120, as the interpreter's exit gives.

The C library's exit handlers and C++ static destructors do not run: their only effect for a command is the memory
they touch on the way out (``engine/planner.py``'s measurement ends the same way, so it still matches a run).

Where something watches the process, the usual exit is kept: a tracer or profiler (``python -m cProfile -m bigbatch``,
a debugger, coverage), which writes its results after the program returns; a tool injected into the CUDA runtime
(``CUDA_INJECTION64_PATH``: NVIDIA's Nsight tools, compute-sanitizer), which may write its trace at the runtime's exit;
``python -i``, which opens its prompt after the program; and Python's development mode (``python -X dev``), which
reports unclosed files and the like during finalization.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

NATIVE_TOOLS = ("CUDA_INJECTION64_PATH",)
"""Environment variables that say a native tool is in the process: NVIDIA's tools (Nsight, compute-sanitizer) inject
their library into the CUDA runtime through this one."""


def watched() -> bool:
    """Whether a tracer, a profiler, a native CUDA tool, ``python -i`` or development mode needs the interpreter's own
    exit."""
    if sys.flags.dev_mode or sys.flags.inspect or sys.gettrace() is not None or sys.getprofile() is not None:
        return True
    if any(os.environ.get(name) for name in NATIVE_TOOLS):
        return True
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+: cProfile and coverage may register here instead
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))


def exit_now(code: int) -> NoReturn:
    """Leave with exit status ``code`` after the threads, the ``atexit`` callbacks and the output streams, without the
    interpreter's teardown of modules and objects; the usual ``sys.exit`` where :func:`watched`, or where the
    interpreter lacks the calls above (they are CPython's)."""
    shutdown = getattr(threading, "_shutdown", None)
    if watched() or shutdown is None or not hasattr(atexit, "_run_exitfuncs"):
        sys.exit(code)
    shutdown()  # what the interpreter calls first at exit: threading's exit hooks, then the joins
    atexit._run_exitfuncs()  # what it calls next; it clears the callbacks, so none runs twice
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BrokenPipeError:  # the reader left (``bigbatch ... | head``): the output was cut short
            code = code or 1
        except OSError as error:
            code = code or 120
            with contextlib.suppress(OSError):
                os.write(2, f"error: writing {getattr(stream, 'name', 'the output')}: {error}\n".encode())
    flush_c_streams()
    os._exit(code)


def flush_c_streams() -> None:
    """``fflush(NULL)``: what native code wrote through the C library's buffered streams (``printf``), which its
    ``exit`` would flush and ``os._exit`` does not. Nothing where the C library cannot be reached."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)
