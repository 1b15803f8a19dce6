"""``index.json`` of a shards folder (``data.name: shards``), read as untrusted input.

The index says where every sample's bytes lie (``data/formats/pack.py`` describes the file). A reader trusts it to open
files and to allocate buffers, so all of it is checked before anything else is opened, each mistake one
``UserError`` naming the file and the key (``data.path: DIR/index.json: splits.train.shards[3].labels[7]: ...``):

- **the file**: a regular file inside ``data.path`` (a link is followed only if it stays inside), at most
  ``MAX_INDEX_BYTES``, UTF-8 JSON;
- **its shape**: every key present and of its type (whole numbers are JSON integers, not booleans, not text, in
  ``0 .. 2^63 - 1``; ``image_ext`` is ``jpg`` or ``png``);
- **the names**: each shard is a plain file name inside ``data.path`` (no ``/``, not ``.`` or ``..``, no NUL,
  nothing absolute), named once, a regular file there (a link only if it resolves inside ``data.path``), of the
  size it was written at;
- **the counts**: a split's ``samples`` is the sum of its shards'; in each shard every column has ``samples``
  entries, and the keys are the samples' positions in the split (``000000``, ``000001``, ...), as pack writes them;
- **the ranges**: each member's offset and size lie inside its shard, an image is at most ``IMAGE_FILE_LIMIT``
  bytes, and each label is a class (``0 .. len(classes) - 1``).

The texts of the index (class names, sources) are only shown in messages; a name that was not UTF-8 when it was
packed (kept by Python as an unpaired surrogate) is shown with its bytes escaped.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bigbatch.data.formats.pack import FORMAT, INDEX, VERSION
from bigbatch.data.pipeline.files import IMAGE_FILE_LIMIT
from bigbatch.errors import UserError

MAX_INDEX_BYTES = 2**31
"""The largest ``index.json`` read (2 GiB). ImageNet's 1.28 million training images make an index of about
200 MB; the parsed JSON takes several times the file's size in memory (:data:`PARSE_MEMORY_FACTOR`)."""
PARSE_MEMORY_FACTOR = 16
"""Memory reading an index takes, in times its size: JSON's lists of Python objects, their checked copy and the
arrays. Measured: an 87 MB index of 3 million samples raised the peak RSS by 1.26 GiB (15.6x; 2026-12-06, AMD EPYC).
An index whose reading would take more than the memory available is refused before it is read."""
MEMORY_CHECKED_FROM = 16 << 20
"""The size (16 MiB, about 580,000 samples) from which an index's reading is checked against the memory available:
a smaller one takes under 256 MiB, and is read without asking the system (``/proc/meminfo``)."""

Count = Annotated[int, Field(ge=0, lt=2**63)]
"""A whole number of bytes or samples, as a 64-bit integer holds it."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ShardEntry(_Strict):
    name: str
    bytes: Count
    samples: Count
    keys: list[str]
    labels: list[Count]
    sources: list[str]
    image_ext: list[Literal["jpg", "png"]]
    image_offset: list[Count]
    image_size: list[Count]
    cls_offset: list[Count]
    cls_size: list[Count]


class SplitEntry(_Strict):
    samples: Count
    shards: list[ShardEntry]


class Splits(_Strict):
    train: SplitEntry
    val: SplitEntry


class IndexFile(_Strict):
    classes: Annotated[list[str], Field(min_length=1)]
    source: str
    splits: Splits


COLUMNS = ("keys", "labels", "sources", "image_ext", "image_offset", "image_size", "cls_offset", "cls_size")
"""The per-sample columns of a shard entry, each ``samples`` long."""


@dataclass
class SplitIndex:
    """One split of ``index.json``: sample ``i`` is ``size[i]`` bytes at ``offset[i]`` of ``paths[shard[i]]``;
    samples are numbered shard by shard, in the order written (a training sample's number is its key)."""

    split: str
    paths: list[str]
    shard_sizes: list[int]
    shard: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    label: np.ndarray
    member: np.ndarray
    """``KEY.ext`` of each image member (bytes), for messages."""
    source: np.ndarray
    """Each sample's original file (bytes), for messages."""

    def __len__(self) -> int:
        return len(self.label)


@dataclass
class ShardIndex:
    """``index.json``, checked: the class names and the two splits."""

    path: Path
    classes: list[str]
    source: str
    train: SplitIndex
    val: SplitIndex


def shown(text: str) -> bytes:
    """A text of the index as UTF-8 bytes for messages; what was not UTF-8 when packed (an unpaired surrogate, as
    Python decodes such a file name) is escaped (``\\udcff``) rather than failing."""
    return text.encode("utf-8", "backslashreplace")


def _inside(root_real: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _where(loc: tuple[Any, ...]) -> str:
    """``splits.train.shards[3].labels[7]`` from pydantic's location tuple."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _check_parse_memory(path: Path, size: int) -> None:
    """Refuse an index whose reading would take more memory than is available (:data:`PARSE_MEMORY_FACTOR` times
    its size), before any of it is read: one line, not the kernel's out-of-memory kill."""
    if size < MEMORY_CHECKED_FROM:
        return
    import psutil

    need, available = PARSE_MEMORY_FACTOR * size, psutil.virtual_memory().available
    if need > available:
        raise UserError(f"data.path: {path} is {size / 2**20:,.0f} MiB; reading it takes about {PARSE_MEMORY_FACTOR} "
                        f"times that ({need / 2**30:,.1f} GiB), more than the {available / 2**30:,.1f} GiB of memory "
                        "available")


def read_index_file(root: Path) -> dict[str, Any]:
    """``root/index.json`` as JSON, read within bounds and checked to be one ``bigbatch pack`` wrote (its format and
    version); a ``UserError`` naming ``data.path`` otherwise."""
    path = root / INDEX
    if not root.is_dir():
        raise UserError(f"data.path: {root} is not a folder: shards are read from a folder that `bigbatch pack` wrote")
    if not path.exists() and not path.is_symlink():
        raise UserError(f"data.path: {root} holds no {INDEX}: shards are read from a folder that `bigbatch pack` "
                        f"wrote (shards without {INDEX} are an unfinished pack)")
    root_real = os.path.realpath(root)
    if not _inside(root_real, str(path)):
        raise UserError(f"data.path: {path} is a link leading out of {root}; an index is read inside data.path only")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block the open
    except OSError as error:
        raise UserError(f"data.path: {path} cannot be read ({error.strerror or error})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UserError(f"data.path: {path} is not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > MAX_INDEX_BYTES:
            raise UserError(f"data.path: {path} is {info.st_size:,} bytes, more than the {MAX_INDEX_BYTES:,} an "
                            f"index of bigbatch pack can be")
        _check_parse_memory(path, info.st_size)
        try:
            raw = file.read(MAX_INDEX_BYTES + 1)
        except OSError as error:
            raise UserError(f"data.path: {path} cannot be read ({error.strerror or error})") from None
    if len(raw) > MAX_INDEX_BYTES:
        raise UserError(f"data.path: {path} grew past {MAX_INDEX_BYTES:,} bytes while it was read")
    try:
        index = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise UserError(f"data.path: {path} is not UTF-8 text (byte {error.start})") from None
    except (ValueError, RecursionError) as error:
        raise UserError(f"data.path: {path} is not valid JSON ({str(error)[:200]})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise UserError(f"data.path: {path} is not the index of shards `bigbatch pack` wrote")
    if index.get("version") != VERSION:
        version = index.get("version")
        shown_version = repr(version) if isinstance(version, (int, str, float)) and len(repr(version)) < 40 else "?"
        raise UserError(f"data.path: {path} is of version {shown_version}; this bigbatch reads version {VERSION}: "
                        f"pack the images again")
    return index


def read_index(root: Path) -> ShardIndex:
    """``root/index.json``, checked as the module's docstring says, with both splits as arrays."""
    raw = read_index_file(root)
    path = root / INDEX
    try:
        index = IndexFile.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        message = first["msg"][0].lower() + first["msg"][1:]
        raise UserError(f"data.path: {path}: {_where(first['loc'])}: {message}") from None
    if len(set(index.classes)) != len(index.classes):
        raise UserError(f"data.path: {path}: classes: a class is named twice")
    root_real = os.path.realpath(root)
    names: set[str] = set()
    splits = {}
    for split in ("train", "val"):
        entry = getattr(index.splits, split)
        splits[split] = _split(root, root_real, path, split, entry, len(index.classes), names,
                               shown(index.source).decode())
    return ShardIndex(path, index.classes, index.source, splits["train"], splits["val"])


def _split(root: Path, root_real: str, path: Path, split: str, entry: SplitEntry, classes: int, names: set[str],
           source: str) -> SplitIndex:
    where = f"data.path: {path}: splits.{split}"
    total = sum(shard.samples for shard in entry.shards)
    if entry.samples != total:
        raise UserError(f"{where}.samples: {entry.samples}, but its shards hold {total} samples")
    if total == 0:
        raise UserError(f"{where}: holds no sample; bigbatch pack writes at least one into each split")
    paths = []
    for k, shard in enumerate(entry.shards):
        at = f"{where}.shards[{k}]"
        paths.append(_shard_file(root, root_real, at, shard, names))
        for column in COLUMNS:
            length = len(getattr(shard, column))
            if length != shard.samples:
                raise UserError(f"{at}.{column}: {length} entries for the shard's {shard.samples} samples")
    starts = np.cumsum([0] + [shard.samples for shard in entry.shards])

    def column(name: str) -> np.ndarray:
        return np.array([v for shard in entry.shards for v in getattr(shard, name)], dtype=np.int64)

    shard_of = np.repeat(np.arange(len(entry.shards), dtype=np.int32), [s.samples for s in entry.shards])
    shard_bytes = np.array([s.bytes for s in entry.shards], dtype=np.int64)[shard_of]
    offset, size, label = column("image_offset"), column("image_size"), column("labels")

    def refuse(bad: np.ndarray, name: str, problem: Any) -> None:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            k = int(shard_of[i])
            told = problem(i) if callable(problem) else problem
            raise UserError(f"{where}.shards[{k}].{name}[{i - starts[k]}]: {told}")

    # Sizes first, then offsets against the room left: no sum can overflow 64 bits.
    refuse(size > IMAGE_FILE_LIMIT, "image_size", f"more than {IMAGE_FILE_LIMIT:,} bytes, the largest image read")
    refuse(size > shard_bytes, "image_size", "larger than the shard")
    refuse(offset > shard_bytes - size, "image_offset", "the image would end past the end of the shard")
    cls_offset, cls_size = column("cls_offset"), column("cls_size")
    refuse(cls_size > shard_bytes, "cls_size", "larger than the shard")
    refuse(cls_offset > shard_bytes - cls_size, "cls_offset", "the label member would end past the end of the shard")
    refuse(label >= classes, "labels", lambda i: f"{int(label[i])} is not a class (the index names {classes}: "
                                                 f"0 .. {classes - 1})")
    keys = [key for shard in entry.shards for key in shard.keys]
    expected = max(6, len(str(total - 1)))
    for i, key in enumerate(keys):
        if key != f"{i:0{expected}d}":
            k = int(shard_of[i])
            raise UserError(f"{where}.shards[{k}].keys[{i - starts[k]}]: {key[:40]!r} is not the sample's position "
                            f"in the split ({i:0{expected}d}), as bigbatch pack writes the keys")
    members = [f"{key}.{ext}".encode() for shard in entry.shards
               for key, ext in zip(shard.keys, shard.image_ext, strict=True)]
    prefix = f"{source}/{split}/"
    return SplitIndex(split, paths, [s.samples for s in entry.shards], shard_of, offset, size, label,
                      np.array(members, dtype=bytes),
                      np.array([shown(prefix + s) for shard in entry.shards for s in shard.sources], dtype=bytes))


def _shard_file(root: Path, root_real: str, at: str, shard: ShardEntry, names: set[str]) -> str:
    """The shard's path, checked: a plain name of a regular file inside ``root``, of the size it was written at."""
    name = shard.name
    shown_name = shown(name).decode()[:120]
    if not name or "/" in name or "\0" in name or name in (".", "..") or os.path.isabs(name):
        raise UserError(f"{at}.name: {shown_name!r} is not a plain file name inside data.path")
    if name in names:
        raise UserError(f"{at}.name: {shown_name!r} is listed twice")
    names.add(name)
    path = os.path.join(root, name)
    if not _inside(root_real, path):
        raise UserError(f"{at}.name: {path} is a link leading out of {root}; shards are read inside data.path only")
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        raise UserError(f"data.path: {path} is missing (listed in {root / INDEX})") from None
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"data.path: {path} is not a regular file (listed in {root / INDEX})")
    if info.st_size != shard.bytes:
        raise UserError(f"data.path: {path} is {info.st_size} bytes, {shard.bytes} when it was written: the shard "
                        f"has changed since `bigbatch pack` wrote it")
    return path
