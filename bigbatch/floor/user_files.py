"""Reading a file a user hands bigbatch: only a regular file, only within a size bound, only inside the folder named.

Anything may stand under a file's name: a FIFO (opening it for reading waits for a writer, forever), a link to
``/dev/zero`` (a read never ends), a socket, a device, a link out of the folder the user named. :func:`open_regular`
opens without blocking (``O_NONBLOCK``, which a regular file ignores), then checks the open descriptor (``fstat``, so
the check and the read are of the same file): an ``OSError`` unless it is a regular file of at most the bound.
:func:`lies_inside` says whether a path, links and ``..`` followed, stays in a folder. The data set's files
(``data/pipeline/files.py``), a YAML config (``config/loading.py``) and a run folder's files (``engine/run_dir.py``,
``report/runs.py``) are read through these.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

FILE_LIMIT = 2**30
"""The largest file read unless a caller says otherwise: the largest image file (1 GiB). PIL refuses images past 2 x
``Image.MAX_IMAGE_PIXELS`` (about 179 million pixels) as decompression bombs; an RGB image of that many pixels is
about 540 MB even uncompressed."""


class NotARegularFile(OSError):
    """A file's name on something that is not a regular file (FIFO, device, socket, directory)."""


def open_regular(path: str | os.PathLike, limit: int = FILE_LIMIT, what: str = "an image") -> io.FileIO:
    """``path`` opened for reading (unbuffered), once it is known to be a regular file of at most ``limit`` bytes;
    ``OSError`` (``NotARegularFile`` for the wrong kind of file) otherwise. ``what``: the file's kind, for the
    message."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{os.fsdecode(path)} is not a regular file")
        if info.st_size > limit:
            raise OSError(f"{os.fsdecode(path)} is {info.st_size:,} bytes, more than the {limit:,} {what} may be")
        return io.FileIO(fd, "r", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int = FILE_LIMIT, what: str = "an image") -> bytearray:
    """The bytes of the regular file ``path`` (at most ``limit``; ``open_regular``'s checks), as a writable buffer
    (torchvision decodes from it without a copy)."""
    with open_regular(path, limit, what) as file:
        size = os.fstat(file.fileno()).st_size
        data = bytearray(size)
        view, got = memoryview(data), 0
        while got < size:
            count = file.readinto(view[got:]) or 0
            if count == 0:  # shrank while being read
                break
            got += count
        view.release()
        del data[got:]
        if got == size and file.read(1):  # grew while being read: read no more than the bound
            raise OSError(f"{os.fsdecode(path)} grew while it was read")
    return data


def lies_inside(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether the real path of ``path`` (links and ``..`` followed) lies inside the real path of ``folder``."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
