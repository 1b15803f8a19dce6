"""Which single files bigbatch wrote: the proof that lets a command replace its own earlier output.

Content cannot prove who wrote a file (another tool's COCO results file starts as bigbatch's does; a user's CSV may
start ``step,lr``). So each single output a command may later replace (``schedule --csv``/``--png``, ``scale
--out``, ``eval --save-detections``) is recorded as it is written: its path, device, inode, size, modification time
(ns) and SHA-256. An existing file at that path may be replaced only while all of them still match a record: a file
put there by anything else, or the same file edited since, matches none, and is the user's.

The records live in the user's cache folder (:func:`cache_dir`), one small file per record under ``written/``,
named by the SHA-256 of the path, device, inode, size and modification time. A record is made new (``O_EXCL``) and
never rewritten, so concurrent writers need no lock, and finding one is a single bounded read (:data:`MAX_RECORD`
bytes): no list grows with use. Each is about 300 bytes. When bigbatch replaces a file it recorded, that file's
record is removed (:func:`forget`), so rewriting an output keeps one record; a recorded file a user deletes or
changes leaves its record behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "BIGBATCH_CACHE_DIR"
"""The cache folder, where set; else ``$XDG_CACHE_HOME/bigbatch``, else ``~/.cache/bigbatch``."""
RECORDS = "written"
"""The records' folder in the cache folder."""
MAX_RECORD = 16 * 1024
"""The most bytes a record is read to (a path is at most 4 KiB, escaped at most 6 bytes a character: never near)."""
_FORMAT = "bigbatch written-file record 1"
_CHUNK = 1 << 20

_wanted: set[str] = set()
"""The paths whose next atomic write is recorded (:func:`recorded`)."""


def cache_dir() -> Path:
    """``$BIGBATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/bigbatch`` (an absolute one: the XDG rule), else
    ``~/.cache/bigbatch``."""
    own = os.environ.get(CACHE_ENV)
    if own:
        return Path(os.path.abspath(own))
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "bigbatch"
    return Path.home() / ".cache" / "bigbatch"


def canonical(path: str | os.PathLike) -> str:
    """``path`` as recorded: its folder's real path (links and ``..`` resolved) and its own name, so that two
    spellings of one place are one record, while a link at the place itself stays a link (never replaced)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


@contextlib.contextmanager
def recorded(path: str | os.PathLike) -> Iterator[None]:
    """Within the block, an :func:`~bigbatch.floor.files.atomic_write` of ``path`` records the file it writes (for
    a writer that is not ours to change, such as a task's ``save_predictions``)."""
    key = canonical(path)
    _wanted.add(key)
    try:
        yield
    finally:
        _wanted.discard(key)


def wanted(path: str | os.PathLike) -> bool:
    """Whether an atomic write of ``path`` is to be recorded (inside :func:`recorded`)."""
    return bool(_wanted) and canonical(path) in _wanted


def sha256_of_fd(fd: int, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of the open file ``fd`` (read in 1 MiB pieces, from offset 0)."""
    digest, offset = hashlib.sha256(), 0
    while offset < size:
        piece = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not piece:
            break
        digest.update(piece)
        offset += len(piece)
    return digest.hexdigest()


def record(path: str | os.PathLike, st: os.stat_result, sha256: str) -> None:
    """Record that bigbatch wrote the file now at ``path`` (``st``: its ``lstat``; ``sha256``: of its bytes). A
    record that cannot be made is one warning: the file stays, but a later command will not replace it."""
    fields = _fields(canonical(path), st)
    where = _record_path(fields)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return  # the same path, inode, size and time already recorded: a record is never rewritten
    except OSError as error:
        print(f"warning: {path}: could not record it as bigbatch's in {where.parent} ({error.strerror or error}); "
              f"a later bigbatch will not replace it", file=sys.stderr, flush=True)
        return
    with open(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps({**fields, "sha256": sha256}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def forget(path: str | os.PathLike, st: os.stat_result) -> None:
    """Remove the record of the file that was at ``path`` (``st``: its ``lstat`` before bigbatch replaced it): it
    vouches for a file that is gone. Only a record read back as the one for exactly that file is removed."""
    fields = _fields(canonical(path), st)
    where = _record_path(fields)
    kept = _read_record(where)
    if kept is not None and {key: kept.get(key) for key in fields} == fields:
        with contextlib.suppress(OSError):
            where.unlink()


def is_ours(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file bigbatch wrote and nothing has changed since: its path, device, inode,
    size and modification time match a record, and so does the SHA-256 of its bytes."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    fields = _fields(canonical(path), st)
    kept = _read_record(_record_path(fields))
    if kept is None or kept.get("sha256") is None or {key: kept.get(key) for key in fields} != fields:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        if _fields(fields["path"], os.fstat(fd)) != fields:  # replaced between the lstat and the open
            return False
        digest = sha256_of_fd(fd, st.st_size)
        return digest == kept["sha256"] and _fields(fields["path"], os.fstat(fd)) == fields  # unchanged meanwhile
    except OSError:
        return False
    finally:
        os.close(fd)


def _fields(path: str, st: os.stat_result) -> dict:
    return {"format": _FORMAT, "path": path, "device": st.st_dev, "inode": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns}


def _record_path(fields: dict) -> Path:
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8", "surrogateescape")).hexdigest()
    return cache_dir() / RECORDS / key[:2] / f"{key}.json"


def _read_record(where: Path) -> dict | None:
    """The record at ``where``, or None: missing, not a regular file, over :data:`MAX_RECORD`, or not a record."""
    try:
        fd = os.open(where, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, MAX_RECORD + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(text) > MAX_RECORD:
        return None
    try:
        kept = json.loads(text)
    except ValueError:
        return None
    return kept if isinstance(kept, dict) else None
