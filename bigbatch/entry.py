"""The ``bigbatch`` command's entry point: run :func:`bigbatch.cli.main`, then leave without Python's finalization
(``floor/process_exit.py``: about a second of every command that loads torch), with Python's garbage collector held
back through the start-up (``floor/collector.py``: 0.4-0.6 s of every command that loads torch and torchvision).

An exception that leaves :func:`bigbatch.cli.main` (a bug, with its traceback) takes the interpreter's usual exit. A
``BrokenPipeError`` where the reader of ``stdout`` has gone (``bigbatch ... | head``) is status 1 without a traceback
(:func:`reader_left`).
"""

from __future__ import annotations

import os
import select
import sys
from typing import NoReturn

from bigbatch.floor import collector
from bigbatch.floor.process_exit import exit_now


def stdout_reader_gone() -> bool:
    """Whether ``stdout`` is a pipe whose reader has closed it (``poll`` reports an error on its end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # errors and hang-ups are reported whatever the mask
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no file descriptor (a replaced stream)
        return False


def reader_left() -> int:
    """The exit status, 1, where the reader of ``stdout`` closed it before the command finished, without the
    traceback: ``stdout`` goes to ``/dev/null``, so that flushing what is left cannot fail again. Python's
    documentation, "Note on SIGPIPE" (``signal`` module), does the same."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def run() -> NoReturn:
    """``bigbatch ...`` (the installed script) and ``python -m bigbatch ...``."""
    collector.hold()  # no full collection through the imports (floor/collector.py); the trainer settles it
    from bigbatch.cli import main

    try:
        code = main()
    except BrokenPipeError:
        if not stdout_reader_gone():  # another pipe of the command's: an error like any other
            raise
        code = reader_left()
    exit_now(code)
