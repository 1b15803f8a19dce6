"""The ``bigbatch`` command's entry point: run :func:`bigbatch.cli.main`, then leave without Python's finalization.

A process that has loaded torch spends about a second at exit in the interpreter's finalization: it tears down every
module and frees every object one by one (0.48 s for ``import torch`` alone, 0.99 s with torchvision and timm, 1.05-1.16
s after a training run, on the project's 2-core machine; ``docs/benchmarks.md``). Nothing a command wrote depends on
it. So :func:`exit_now` does the parts of an exit that can matter, in the interpreter's order and with its own calls,
and then ``os._exit``:

1. ``threading``'s exit hooks (they tell the idle workers of a ``concurrent.futures`` pool to stop: a pool of the
   decoding's, never shut down, is still there), then wait for every thread that is not a daemon;
2. run the ``atexit`` callbacks: logging's flush, ``weakref.finalize`` objects (temporary folders), multiprocessing's
   end of its children (DataLoader workers), TensorBoard's and coverage's writers;
3. flush ``stdout`` and ``stderr``; where the reader of a pipe has left (``bigbatch ... | head``), the status is 1,
   without a traceback, as it is where a write inside the command finds the pipe closed (:func:`reader_left`).

Where something watches the process, the usual exit is kept: a tracer or profiler (``python -m cProfile -m bigbatch``,
a debugger, coverage), which writes its results after the program returns, and Python's development mode
(``python -X dev``), which reports unclosed files and the like during finalization. An exception that leaves
:func:`bigbatch.cli.main` (a bug, with its traceback) also takes the usual exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def watched() -> bool:
    """Whether a tracer, a profiler or Python's development mode needs the interpreter's own exit."""
    if sys.flags.dev_mode or sys.gettrace() is not None or sys.getprofile() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+: cProfile and coverage may register here instead
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))


def exit_now(code: int) -> NoReturn:
    """Leave with exit status ``code`` after the threads, the ``atexit`` callbacks and the standard streams, without
    the interpreter's teardown of modules and objects; the usual ``sys.exit`` where :func:`watched`."""
    shutdown = getattr(threading, "_shutdown", None)  # the interpreter's own calls (CPython); elsewhere, its exit
    if watched() or shutdown is None or not hasattr(atexit, "_run_exitfuncs"):
        sys.exit(code)
    shutdown()  # what the interpreter calls first at exit: threading's exit hooks, then the joins
    atexit._run_exitfuncs()  # what the interpreter calls at exit; it clears the callbacks, so none runs twice
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BrokenPipeError:  # the reader left (``bigbatch ... | head``): the output was cut short
            code = code or 1
    os._exit(code)


def reader_left() -> int:
    """The exit status, 1, where the reader of ``stdout`` closed it before the command finished (``bigbatch ... |
    head``), without the traceback: ``stdout`` goes to ``/dev/null``, so that flushing what is left cannot fail
    again. Python's documentation, "Note on SIGPIPE" (``signal`` module), does the same."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def run() -> NoReturn:
    """``bigbatch ...`` (the installed script) and ``python -m bigbatch ...``."""
    from bigbatch.cli import main

    try:
        code = main()
    except BrokenPipeError:
        code = reader_left()
    exit_now(code)
