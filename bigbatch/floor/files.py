"""Files: writes that a crash cannot leave half done, and torch files read without running their code.

Writing: a temporary file in the same folder, flushed and fsync'ed, then renamed over the target and the folder
fsync'ed. A crash at any point leaves either the old or the new file, never a partial one. A second name for a file
just written (``best.pt`` and ``last.pt`` at the same step) is a hard link made the same way (:func:`atomic_link`).
Reading: ``torch.load(weights_only=True)``, with one line of ours for a file it refuses.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from bigbatch.errors import UserError
from bigbatch.floor import written


def atomic_write(path: str | Path, write: Callable[[IO], None], mode: str = "wb", record: bool = False) -> None:
    """Write ``path`` so that readers see the old file or the complete new one: ``write`` fills a temporary file
    in the same folder, which is flushed, fsync'ed and renamed over ``path``; then the folder is fsync'ed.

    ``record`` (or a write inside ``written.recorded(path)``): the file is recorded as bigbatch's (``written.py``),
    the proof by which a later command may replace it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = record or written.wanted(path)
    # The temporary file is made new (O_EXCL): a file of that name that is not ours stops the write untouched.
    tmp = _temporary(path)
    try:
        fd = os.open(tmp, (os.O_RDWR if record else os.O_WRONLY) | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise _in_the_way(path, tmp) from None
    made = digest = None
    try:
        with open(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            if record:  # what was written, read back from the file itself
                made = os.fstat(f.fileno())
                digest = written.sha256_of_fd(f.fileno(), made.st_size)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()  # made above by this call
    _sync_folder(path.parent)
    if made is not None:
        try:
            now = os.lstat(path)
        except OSError:
            return
        if (now.st_dev, now.st_ino, now.st_size) == (made.st_dev, made.st_ino, made.st_size):  # still the file made
            written.record(path, now, digest)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")  # run_dir.py tidies these by PID


def _in_the_way(path: Path, tmp: Path) -> UserError:
    return UserError(f"{path}: {tmp.name} is in the way of the write and is not bigbatch's; move it away")


def _sync_folder(folder: Path) -> None:
    """fsync a folder: a rename in it survives a crash."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def identity(path: str | Path) -> tuple[int, int, int, int]:
    """What tells a file written by this process from one put in its place since: device, inode, size, mtime."""
    st = os.stat(path, follow_symlinks=False)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def atomic_link(existing: Path, path: Path, expected: tuple[int, int, int, int] | None) -> bool:
    """Make ``path`` a second name of ``existing`` (a hard link, renamed over ``path`` as :func:`atomic_write` does;
    the folder fsync'ed), provided ``existing`` is still the file whose :func:`identity` is ``expected``. False,
    with nothing changed, where it is not or the filesystem has no hard links: the caller then writes the file."""
    tmp = _temporary(path)
    try:
        if expected is None or identity(existing) != expected:
            return False
        os.link(existing, tmp, follow_symlinks=False)
    except FileExistsError:
        raise _in_the_way(path, tmp) from None
    except OSError:  # gone, or no hard links here (EPERM, EXDEV, EMLINK, ENOTSUP...)
        return False
    try:
        try:
            if identity(tmp) != expected:  # replaced between the check and the link: not linked to what we wrote
                return False
        except OSError:
            return False
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()  # made above by this call
    _sync_folder(path.parent)
    return True


def load_tensors(path: str | Path, key: str, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with one line of ours for a file it refuses or cannot read, instead
    of torch's multi-line message (which suggests ``weights_only=False``, i.e. running the file's code). ``mmap``:
    the tensors stay in the file, mapped, until read (for a look at a checkpoint's small parts)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        text = str(e)
        if "unsupported global" in text.lower():  # torch's refusal of a pickled class or function: code it would run
            raise UserError(f"{key}: {path} holds Python objects other than tensors and plain containers; bigbatch "
                            f"does not unpickle them (that could run code): save a state dict of tensors instead"
                            ) from None
        reason = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
        shown = reason.group(1).strip() if reason else (text.strip().splitlines() or [""])[0]
        raise UserError(f"{key}: {path} is not a readable torch file (UnpicklingError: {shown[:200]})") from None
    except Exception as e:  # a truncated, foreign or tampered file: torch raises many types
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UserError(f"{key}: {path} is not a readable torch file ({type(e).__name__}"
                        f"{': ' + first if first else ''})") from None


def mismatch_detail(error: RuntimeError) -> str:
    """The first specific line of ``load_state_dict``'s error (a missing key, an unexpected one, a size)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else lines[0]
