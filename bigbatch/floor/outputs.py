"""The files a command writes, checked before it does any work.

Every output path a command takes (``export --darknet-weights``, ``report --out``, ``schedule --csv``, ...) is
checked up front, so that a mistake costs nothing and a read-only place is one ``error:`` line, not a traceback
after the work:

- it is not a folder, and its folder exists;
- nothing is there, or what is there is a file bigbatch wrote and may replace (``ours``); anything else is the
  user's and is never overwritten;
- its folder can be written: a temporary file of bigbatch's own is made there (``O_EXCL``, so it is new) and
  removed again. Permission bits alone do not say it (root ignores them; a read-only mount or ``/proc`` refuses
  whatever the bits say).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from bigbatch.errors import UserError


def probe_writable(folder: Path, key: str) -> None:
    """``UserError`` naming ``key`` unless a file can be made in ``folder``."""
    try:
        fd, name = tempfile.mkstemp(prefix=".bigbatch-probe-", dir=folder)
    except OSError as error:
        raise UserError(f"{key}: cannot write in {folder} ({error.strerror or error})") from None
    os.close(fd)
    os.unlink(name)  # made just now by this call (O_EXCL): ours


def check_new_or_empty_folder(out: Path, what: str) -> Path:
    """``--out`` as an absolute path, absent or an empty folder (a folder bigbatch then fills with ``what``); anything
    else one ``UserError`` naming ``--out``: bigbatch never writes into a folder holding what it did not write."""
    out = Path(os.path.abspath(out))
    if out.is_symlink() and not out.exists():
        raise UserError(f"--out: {out} is a link to nothing; give a new or empty folder")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} is a file, not a folder")
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"--out: cannot make {out}: {blocking} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out: {out} is not empty; {what} written into a new or empty folder only (bigbatch "
                        "never overwrites what it did not write)")
    return out


def check_utf8_name(path: Path, key: str, writer: str) -> None:
    """Refuse, before any work, an output path holding a byte that is not UTF-8 where ``writer`` (torch's, or
    onnxruntime's, C++ code) takes paths as text only: it failed in a traceback after the work. Every other output
    takes such a name."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise UserError(f"{key}: {shown} is not UTF-8, and {writer} takes a path as text only; choose a name in "
                        "UTF-8") from None


def check_output_file(path: Path, key: str, ours: Callable[[Path], bool] | None = None,
                      what: str = "bigbatch does not overwrite it (choose a new file)") -> Path:
    """``path`` checked as a file this command may write (see the module docstring); ``ours(path)`` says whether
    an existing file is one bigbatch wrote and may replace (without it, any existing file is refused)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{key}: {path} is a folder; give the file to write")
    if path.exists() or path.is_symlink():
        if ours is None or path.is_symlink() or not path.is_file() or not ours(path):
            raise UserError(f"{key}: {path} exists; {what}")
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"{key}: the folder {folder} does not exist")
    probe_writable(folder, key)
    return path


def starts_with(mark: bytes, within: int = 4096) -> Callable[[Path], bool]:
    """An ``ours`` test: the file holds ``mark`` in its first ``within`` bytes."""

    def test(path: Path) -> bool:
        try:
            with open(path, "rb") as file:
                return mark in file.read(within)
        except OSError:
            return False

    return test


def keep_lines(path: Path, keep: Callable[[str], bool]) -> int:
    """Rewrite the log ``path`` (bigbatch's own: ``metrics.jsonl``, ``updates.csv``) keeping the lines ``keep``
    says, streaming (memory does not grow with the file) and atomically (a crash leaves the old file whole); the
    file is left as it is when every line is kept. -> the lines dropped."""
    from bigbatch.floor.files import atomic_write

    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        dropped = sum(1 for line in f if not keep(line))
    if dropped:
        def write(out) -> None:
            with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
                out.writelines(line if line.endswith("\n") else line + "\n" for line in f if keep(line))

        atomic_write(path, write, mode="w")
    return dropped
