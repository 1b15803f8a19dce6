"""Opening the files of a user's data set: regular files only, read within a size bound.

A data set may hold anything under an image's name: a FIFO (opening it for reading waits for a writer, forever), a
link to ``/dev/zero`` (a read never ends), a socket, a device. Every image file bigbatch reads goes through
:func:`open_regular`: the file is opened without blocking (``O_NONBLOCK``, which a regular file ignores), then
checked on the open descriptor (``fstat``, so the check and the read are of the same file), and refused with an
``OSError`` unless it is a regular file of at most ``IMAGE_FILE_LIMIT`` bytes. A COCO annotation file is read the
same way, within its own bound (``coco.ANNOTATION_FILE_LIMIT``).

A text file a dataset or a ``.cfg`` names (a ``.data`` file's lists, names and label files, a WordTree) is read
line by line through :func:`read_lines`: a regular file, opened the same way, each line within ``LINE_LIMIT``
bytes and at most as many lines as its caller allows, so that neither one endless line nor endless lines take the
memory. Its errors name the file and the line, never the line's content.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator

IMAGE_FILE_LIMIT = 2**30
"""The largest image file read (1 GiB). PIL refuses images past 2 x ``Image.MAX_IMAGE_PIXELS`` (about 179 million
pixels) as decompression bombs; an RGB image of that many pixels is about 540 MB even uncompressed."""


LINE_LIMIT = 4096
"""The longest line read from a text file a dataset or a cfg names, in bytes: Linux's ``PATH_MAX``, the longest path
a line of an image list can name that the system can open. A class name, a label line (``<class> <xc> <yc> <w>
<h>``) or a WordTree line (``name parent``) is far shorter."""


class NotARegularFile(OSError):
    """An image's name on something that is not a regular file (FIFO, device, socket, directory)."""


def open_regular(path: str | os.PathLike, limit: int = IMAGE_FILE_LIMIT, what: str = "an image") -> io.FileIO:
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


def read_regular(path: str | os.PathLike, limit: int = IMAGE_FILE_LIMIT, what: str = "an image") -> bytearray:
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


class BadLine(OSError):
    """A line of a text file that :func:`read_lines` does not read: too long, not UTF-8, or one past the most lines
    allowed. ``line``: its number (from 1); ``reason``: what is wrong with it, without its content."""

    def __init__(self, path: str | os.PathLike, line: int, reason: str) -> None:
        super().__init__(f"{os.fsdecode(path)}:{line}: {reason}")
        self.line, self.reason = line, reason


def read_lines(path: str | os.PathLike, max_lines: int, what: str, limit: int | None = None,
               max_line: int = LINE_LIMIT) -> Iterator[tuple[int, str]]:
    """``(number, line)`` for each line of the regular file ``path`` (:func:`open_regular`'s checks; ``limit``: its
    largest size in bytes, None for any), numbered from 1, decoded as UTF-8 (a byte-order mark first is skipped),
    without its end (``\\n``, and a ``\\r`` before it, as Darknet's ``fgetl`` strips them).

    Reads at most ``max_lines`` lines of at most ``max_line`` bytes each: a longer line, a line that is not UTF-8
    or a line past the ``max_lines``-th raises :class:`BadLine` when it is reached (the lines before it have been
    yielded). ``what``: the file's kind, for the messages ("a names file")."""
    with open_regular(path, limit if limit is not None else 2**63 - 1, what) as raw:
        file = io.BufferedReader(raw)
        for number in range(1, max_lines + 2):
            chunk = file.readline(max_line + 2)  # room for the line's "\r\n"
            if not chunk:
                return
            if number > max_lines:
                raise BadLine(path, number, f"more than {max_lines:,} lines, the most {what} may have")
            text = chunk.removesuffix(b"\n").removesuffix(b"\r")
            if len(text) > max_line:
                raise BadLine(path, number, f"a line longer than {max_line:,} bytes, the longest {what} may have")
            if number == 1:
                text = text.removeprefix(b"\xef\xbb\xbf")
            try:
                yield number, text.decode("utf-8")
            except UnicodeDecodeError:
                raise BadLine(path, number, "not UTF-8 text") from None
