"""A file the config package reads (a config, a run's ``config.yaml``, an ``advisor.json``), read as an untrusted
one: only a regular file, only within a bound, checked on the descriptor it is read from. ``floor/user_files.py``'s
``open_regular`` does the same for a data set's and a run's files; the config package imports only the errors and the
registries, so it keeps these few lines of its own."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotAConfigFile(OSError):
    """A config's name on something :func:`read_config_bytes` does not read: not a regular file, or too large."""


def read_config_bytes(path: Path, limit: int, what: str = "a config") -> bytes:
    """The bytes of ``path`` (``what``: a config), read only once it is known to be a regular file of at most
    ``limit`` bytes: opened without blocking (a FIFO's open waits for a writer forever; ``O_NONBLOCK`` does not)
    and checked on the open descriptor (``fstat``: the file checked is the file read), so that neither a FIFO nor a
    link to ``/dev/zero`` nor a huge file is read. ``OSError`` otherwise (:class:`NotAConfigFile` for these two
    refusals)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAConfigFile(f"{path} is not a regular file")
        if info.st_size > limit:
            raise NotAConfigFile(f"{path} is {info.st_size:,} bytes, more than {what} may be ({limit:,})")
        raw = file.read(limit + 1)
    if len(raw) > limit:  # grew since fstat
        raise NotAConfigFile(f"{path} is more than {limit:,} bytes, more than {what} may be")
    return raw
