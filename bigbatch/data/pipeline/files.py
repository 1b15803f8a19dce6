"""Opening the files of a user's data set: regular files only, read within a size bound.

A data set may hold anything under an image's name: a FIFO (opening it for reading waits for a writer, forever), a
link to ``/dev/zero`` (a read never ends), a socket, a device. Every image file bigbatch reads goes through
:func:`open_regular` (``floor/user_files.py``): opened without blocking, checked on the open descriptor, and
refused with an ``OSError`` unless it is a regular file of at most ``IMAGE_FILE_LIMIT`` bytes. A COCO annotation
file is read the same way, within its own bound (``coco.ANNOTATION_FILE_LIMIT``).

A text file a dataset or a ``.cfg`` names (a ``.data`` file's lists, names and label files, a WordTree) is read
line by line through :func:`read_lines`: a regular file, opened the same way, each line within ``LINE_LIMIT``
bytes and at most as many lines as its caller allows, so that neither one endless line nor endless lines take the
memory. Its errors name the file and the line, never the line's content.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

from bigbatch.floor.user_files import FILE_LIMIT
from bigbatch.floor.user_files import NotARegularFile as NotARegularFile
from bigbatch.floor.user_files import open_regular as open_regular
from bigbatch.floor.user_files import read_regular as read_regular

IMAGE_FILE_LIMIT = FILE_LIMIT
"""The largest image file read (1 GiB): ``open_regular``'s and ``read_regular``'s default bound."""

LINE_LIMIT = 4096
"""The longest line read from a text file a dataset or a cfg names, in bytes: Linux's ``PATH_MAX``, the longest path
a line of an image list can name that the system can open. A class name, a label line (``<class> <xc> <yc> <w>
<h>``) or a WordTree line (``name parent``) is far shorter."""


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
