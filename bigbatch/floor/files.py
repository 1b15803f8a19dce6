"""Files: writes that a crash cannot leave half done, and torch files read without running their code.

Writing: a temporary file in the same folder, flushed and fsync'ed, then renamed over the target and the folder
fsync'ed. A crash at any point leaves either the old or the new file, never a partial one. A second name for a file
just written (``best.pt`` and ``last.pt`` at the same step) is a hard link made the same way (:func:`atomic_link`).
Each temporary file has a name of its own, ``.<name>.tmp-<pid>-<16 hex digits>`` (random), made new (``O_EXCL``):
a process with the PID of one killed mid-write (every run in a container is PID 1) never meets its leftover, and
the leftovers of a folder only bigbatch writes in are tidied by that naming (:func:`temporary_target`), sparing the
writes this process has in flight (:func:`remove_temporary`).
Reading: ``torch.load(weights_only=True)``, with one line of ours for a file it refuses, after a check that no entry
of a zip file expands (:func:`check_zip_entries`).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import secrets
import stat
import struct
import threading
from collections.abc import Callable, Iterator
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
    # The temporary file is made new (O_EXCL), under a name of its own: nothing of anyone's is opened or replaced.
    flags = (os.O_RDWR if record else os.O_WRONLY) | os.O_CREAT | os.O_EXCL
    tmp, key, fd = _new_temporary(path, lambda tmp: os.open(tmp, flags, 0o666))
    made = digest = replaced = None
    try:
        with naming(path), open(fd, mode) as f:  # a full disk, a quota: said of ``path``
            write(f)
            f.flush()
            os.fsync(f.fileno())
            if record:  # what was written, read back from the file itself
                made = os.fstat(f.fileno())
                digest = written.sha256_of_fd(f.fileno(), made.st_size)
        if record:
            with contextlib.suppress(OSError):
                replaced = os.lstat(path)
        with naming(path):
            os.replace(tmp, path)
    finally:
        try:
            if tmp.exists():
                tmp.unlink()  # made above by this call
        finally:
            _landed(key)
    _sync_folder(path.parent)
    if replaced is not None:
        written.forget(path, replaced)  # the record of the file just replaced vouches for nothing now
    if made is not None:
        try:
            now = os.lstat(path)
        except OSError:
            return
        if (now.st_dev, now.st_ino, now.st_size) == (made.st_dev, made.st_ino, made.st_size):  # still the file made
            written.record(path, now, digest)


_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.tmp-\d+(?:-[0-9a-f]{16})?$")
"""The name of a temporary file of :func:`atomic_write` or :func:`atomic_link`: ``.<target>.tmp-<pid>-<token>``
(``.<target>.tmp-<pid>`` by earlier versions)."""
_TRIES = 8
_IN_FLIGHT: set[tuple[int, int, str]] = set()
"""The temporary files this process is writing now (their folder's device and inode, their name), which
:func:`remove_temporary` spares."""
_IN_FLIGHT_LOCK = threading.Lock()  # checkpoints are written on a thread of their own


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Inside, an ``OSError`` that names no file (a write on a descriptor: ``[Errno 28] No space left on device``)
    names ``path``, the file being written, so the CLI can say it in one line (``cli.py``'s storage errors)."""
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror or str(error), str(path)) from error


def temporary_target(name: str) -> str | None:
    """The name of the file that the temporary file ``name`` was made for (``last.pt`` for
    ``.last.pt.tmp-1-0123456789abcdef``), or None where ``name`` is not of :func:`atomic_write`'s naming."""
    match = _TEMPORARY.match(name)
    return match.group("target") if match else None


def remove_temporary(dir_fd: int, name: str) -> bool:
    """Unlink the temporary file ``name`` (of :func:`temporary_target`'s naming) of the folder open as ``dir_fd``
    where it is a regular file (not a link) and no write of this process has it in flight; whether it was removed.
    For a folder no other process writes in (a run's, its lock held)."""
    if temporary_target(name) is None:
        return False
    held = os.fstat(dir_fd)
    with _IN_FLIGHT_LOCK:  # a write of this process registers its name before it makes the file
        if (held.st_dev, held.st_ino, name) in _IN_FLIGHT:
            return False
        try:
            if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return False
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
    return True


def _new_temporary(path: Path, make: Callable[[Path], Any]) -> tuple[Path, tuple[int, int, str], Any]:
    """A temporary file beside ``path``, made by ``make(tmp)`` (which raises ``FileExistsError`` where the name is
    taken): its path, its key in :data:`_IN_FLIGHT` and what ``make`` returned. The name is the PID and a random
    token, registered as in flight before it is made; a name taken (by anyone) is left untouched and another drawn."""
    folder = os.stat(path.parent)
    for _ in range(_TRIES):
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")
        key = (folder.st_dev, folder.st_ino, tmp.name)
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.add(key)
        try:
            return tmp, key, make(tmp)
        except FileExistsError:
            _landed(key)
        except BaseException:
            _landed(key)
            raise
    raise UserError(f"{path}: {_TRIES} temporary names drawn beside it were all taken ({tmp.name} the last); "
                    f"not written")


def _landed(key: tuple[int, int, str]) -> None:
    """The write of the temporary file ``key`` (of :data:`_IN_FLIGHT`) is over (renamed, or removed)."""
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.discard(key)


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
    if expected is None:
        return False
    try:
        if identity(existing) != expected:
            return False
        tmp, key, _ = _new_temporary(path, lambda tmp: os.link(existing, tmp, follow_symlinks=False))
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
        try:
            if tmp.exists():
                tmp.unlink()  # made above by this call
        finally:
            _landed(key)
    _sync_folder(path.parent)
    return True


def load_tensors(path: str | Path, key: str, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with one line of ours for a file it refuses or cannot read, instead
    of torch's multi-line message (which suggests ``weights_only=False``, i.e. running the file's code). ``mmap``:
    the tensors stay in the file, mapped, until read (for a look at a checkpoint's small parts).

    A zip file (``torch.save``'s format) is first checked to hold only stored entries that fit in it
    (:func:`check_zip_entries`): a compressed entry could expand to any size as it is loaded."""
    check_zip_entries(path, key)
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


ZIP_MAGIC = b"PK\x03\x04"
"""A local file header: what ``torch.load`` takes for a zip file (``torch.serialization._is_zipfile``)."""
_END = struct.Struct("<4s4H2LH")  # end of central directory record
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")
_ENTRY = struct.Struct("<4s6H3L5H2L")  # central directory file header
_LOCAL_HEADER = 30  # a local file header's fixed part; its name and extra field follow
_MAX_TAIL = _END.size + 0xFFFF  # the end record and the longest archive comment
_METHODS = {8: "DEFLATE", 9: "DEFLATE64", 12: "BZIP2", 14: "LZMA", 93: "ZSTD"}


def check_zip_entries(path: str | Path, key: str) -> None:
    """``UserError`` naming ``key`` and ``path`` unless the zip file ``path`` holds only stored entries that fit in
    it; a file that is not a regular one, or no zip, is left to ``torch.load``.

    ``torch.save`` writes a zip archive whose entries are stored, uncompressed (``data.pkl``, then one entry a
    storage), so a checkpoint's tensors are never larger than the file. A zip reader would also inflate a DEFLATE
    entry: a 390 KB file then holds a 400 MB tensor, allocated as it is loaded. This reads the central directory (the
    end record, the ZIP64 one where present, then each entry's 46-byte header) in constant memory and refuses an
    entry that is compressed, one whose sizes disagree or that ends past the file, one that does not begin after the
    entry listed before it (out of the file's order, or sharing its bytes: ``torch.save`` lists them in order), and
    entries whose sizes add up to more than the file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return  # torch says why
    with open(fd, "rb") as raw:
        st = os.fstat(raw.fileno())
        if not stat.S_ISREG(st.st_mode) or raw.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            return
        _check_zip(io.BufferedReader(raw, 1 << 16), st.st_size, Path(path), key)


def _check_zip(f: io.BufferedReader, size: int, path: Path, key: str) -> None:
    def refuse(why: str) -> UserError:
        return UserError(f"{key}: {path} is not a readable torch file (a zip file torch.save did not write: {why})")

    tail_at = max(0, size - _MAX_TAIL)
    f.seek(tail_at)
    tail = f.read(size - tail_at)
    end_at = tail.rfind(b"PK\x05\x06")
    if end_at < 0 or end_at + _END.size > len(tail):
        raise refuse("it has no end of central directory record")
    _, _, _, _, count, cd_size, cd_at, _ = _END.unpack_from(tail, end_at)
    locator_at = end_at - _END64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at:locator_at + 4] == b"PK\x06\x07":
        _, _, end64_at, _ = _END64_LOCATOR.unpack_from(tail, locator_at)
        if end64_at + _END64.size > size:
            raise refuse("its ZIP64 end record lies past the end of the file")
        f.seek(end64_at)
        record = f.read(_END64.size)
        if record[:4] != b"PK\x06\x06":
            raise refuse("its ZIP64 end record is missing")
        count, cd_size, cd_at = _END64.unpack(record)[-3:]
    if cd_at + cd_size > size:
        raise refuse(f"its central directory ({cd_size:,} bytes at {cd_at:,}) lies past the end of the file "
                     f"({size:,} bytes)")
    f.seek(cd_at)
    total = done = free_from = 0
    while done < cd_size:
        header = f.read(_ENTRY.size)
        if len(header) < _ENTRY.size or header[:4] != b"PK\x01\x02":
            raise refuse(f"its central directory breaks off at byte {cd_at + done:,}")
        fields = _ENTRY.unpack(header)
        method, packed, unpacked = fields[4], fields[8], fields[9]
        name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
        name = f.read(name_len).decode("utf-8", "replace")
        extra = f.read(extra_len)
        f.seek(comment_len, io.SEEK_CUR)
        done += _ENTRY.size + name_len + extra_len + comment_len
        unpacked, packed, offset = _zip64_sizes(extra, unpacked, packed, offset)
        shown = repr(name[:100])
        if method != 0:
            raise UserError(f"{key}: {path} holds a compressed entry ({shown}, {_METHODS.get(method, method)}): "
                            f"torch.save stores its entries uncompressed, and bigbatch does not inflate a torch file "
                            f"(a small one could expand to any size); save it again with torch.save")
        if packed != unpacked or offset + packed > size:
            raise refuse(f"its entry {shown} declares {unpacked:,} bytes, stored as {packed:,} at byte {offset:,} of "
                         f"a file of {size:,}")
        if offset < free_from:
            raise refuse(f"its entry {shown} begins at byte {offset:,}, inside the entry listed before it")
        free_from = offset + _LOCAL_HEADER + packed  # the next entry's local header begins no earlier
        total += unpacked
    if total > size:
        raise refuse(f"its {count:,} entries declare {total:,} bytes, more than the file's {size:,} (entries "
                     f"sharing bytes)")


def _zip64_sizes(extra: bytes, unpacked: int, packed: int, offset: int) -> tuple[int, int, int]:
    """The sizes and offset, each from the ZIP64 extra field (id 1) where its 32-bit field is 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(extra):
        kind, length = struct.unpack_from("<2H", extra, at)
        if kind == 1:
            values = extra[at + 4:at + 4 + length]
            wanted = [value == 0xFFFFFFFF for value in (unpacked, packed, offset)]
            found = list(struct.unpack_from(f"<{len(values) // 8}Q", values)) if len(values) >= 8 else []
            read = [found.pop(0) if need and found else None for need in wanted]
            return tuple(new if new is not None else old  # type: ignore[return-value]
                         for new, old in zip(read, (unpacked, packed, offset), strict=True))
        at += 4 + length
    return unpacked, packed, offset
