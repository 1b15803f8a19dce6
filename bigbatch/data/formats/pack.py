"""Write an ImageFolder tree as tar shards in the WebDataset layout (``bigbatch pack SRC --out DIR``).

    SRC/train/CLASS/*.jpg|*.jpeg|*.png   ->   DIR/train-000000.tar, DIR/train-000001.tar, ...
    SRC/val/CLASS/*                            DIR/val-000000.tar, ...
                                               DIR/index.json

Classes and files are listed as ``data.name: folder`` lists them (``data/formats/folder.py``: torchvision's
``ImageFolder`` order), so label 3 means the same class in both. Pack reads only inside ``SRC``: a listed file whose
real path (links and ``..`` followed) lies outside it, a link to a file or to a folder elsewhere, is refused in one line
naming it before any shard is written (:func:`check_inside`), as ``data convert`` refuses one; links within ``SRC`` are
followed. Each sample is two tar members with the same key, as the ``webdataset`` library groups them: ``KEY.jpg`` (or
``KEY.png``: the file's own bytes, not re-encoded) and ``KEY.cls``, the label in ASCII decimal. ``KEY`` is the sample's
position in its split, zero-padded (``000123``), so in the training split it is also the dataset index ``data.name:
shards`` reads it by. The training samples are shuffled once (a permutation drawn from ``seed``) before they are
written, the validation samples keep their order. A shard is closed when the next sample would take it past
``shard_size`` bytes (a sample larger than that gets a shard of its own).
The tars are plain POSIX (ustar) archives: ``tar tf``, Python's ``tarfile`` and ``webdataset`` read them.

``DIR/index.json``, written last (a folder without it is an unfinished pack)::

    {"format": "bigbatch shards", "version": 1, "written_by": "bigbatch pack", "seed": 0, "shard_size": 268435456,
     "source": "/abs/SRC", "classes": ["china", "flower", ...],
     "splits": {
       "train": {"samples": 24, "shards": [
         {"name": "train-000000.tar", "bytes": 81920, "samples": 12,
          "keys": ["000000", ...],             the samples of the shard, in the order written
          "labels": [2, ...],
          "sources": ["upside_down/1003.JPEG", ...],   each sample's file, relative to SRC/train
          "image_ext": ["jpg", ...],           the image member is KEY.<ext>: jpg (.jpg, .jpeg) or png
          "image_offset": [512, ...],          byte offset of the member's data in the tar (after its header)
          "image_size": [10234, ...],          its size in bytes
          "cls_offset": [11264, ...], "cls_size": [1, ...]},     the same for KEY.cls
         ...]},
       "val": {...}}}

With the offsets a reader seeks straight to an image (``os.pread(fd, size, offset)``) instead of walking the tar.

``DIR`` must be new or an empty folder; bigbatch never overwrites nor deletes what it did not write. A new ``DIR`` is
written as a sibling ``DIR.partial-PID`` and renamed when complete; an empty one of yours is written in place. Each
tar is written under a temporary name and renamed when complete. A pack that fails removes the files it wrote. One
killed outright leaves ``DIR.partial-PID``, which the next pack to the same ``DIR`` removes (only folders of that
naming that hold pack's marker, ``.bigbatch-pack``, of that ``DIR``, whose writer has ended, and nothing but files of
pack's naming: ``remove_stale_partials``); killed while writing in place, it leaves shards without ``index.json`` in
the folder, to delete by hand.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bigbatch.data.formats.folder import SPLITS, find_classes, first_outside, list_samples
from bigbatch.data.pipeline.files import read_regular
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError

FORMAT = "bigbatch shards"
VERSION = 1
INDEX = "index.json"
WRITTEN_BY = "bigbatch pack"
HEADER = tarfile.BLOCKSIZE
"""A ustar member header, and the unit the data is padded to."""


def _padded(size: int) -> int:
    return -(-size // HEADER) * HEADER


def sample_bytes(image_size: int, label: int) -> int:
    """What one sample takes in a tar: two headers, the image and the label padded to whole blocks."""
    return 2 * HEADER + _padded(image_size) + _padded(len(str(label)))


def shard_bytes(members_end: int) -> int:
    """The size of a tar whose members end at ``members_end``: the two zero blocks that end an archive, then
    ``tarfile``'s padding of the whole to a record (20 blocks)."""
    return -(-(members_end + 2 * HEADER) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def image_ext(path: str) -> str:
    """``jpg`` for ``.jpg``/``.jpeg`` (any case), ``png`` for ``.png``: the suffixes ``webdataset`` decodes by."""
    return "png" if path.lower().endswith(".png") else "jpg"


# ----------------------------------------------------------------------------- checks before any work


def list_source(src: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """The classes and each split's ``(path, label)`` samples of an ImageFolder tree, as ``folder`` lists them;
    a tree that is not one is a ``UserError`` naming it."""
    if not src.is_dir():
        raise UserError(f"{src}: not a folder (expected an ImageFolder tree: SRC/train/CLASS/*.jpg and "
                        f"SRC/val/CLASS/*.jpg)")
    for split in SPLITS:
        if not (src / split).is_dir():
            raise UserError(f"{src}: has no {split}/ folder (expected {src}/train/CLASS/*.jpg and "
                            f"{src}/val/CLASS/*.jpg, ImageNet's layout)")
    classes = find_classes(src / "train")
    if not classes:
        raise UserError(f"{src / 'train'}: holds no class folder")
    extra = sorted(set(find_classes(src / "val")) - set(classes))
    if extra:
        raise UserError(f"{src / 'val'}: has class folders the training set lacks: {', '.join(extra[:5])}")
    splits = {}
    issues = DataIssues()  # what is not a regular file is skipped with a warning, as training would skip it
    for split in SPLITS:
        with issues.held():  # a split of no image file is one error, not first a warning for each file skipped
            splits[split] = list_samples(src / split, classes, issues)
            if not splits[split]:
                raise UserError(f"{src / split}: holds no .jpg, .jpeg or .png file in a class folder{issues.first()}")
    check_inside(src, splits)
    return classes, splits


def check_inside(src: Path, splits: dict[str, list[tuple[str, int]]]) -> None:
    """Refuse, before any work, a listed file whose real path (links and ``..`` followed) lies outside ``src``
    (:func:`folder.first_outside`): a link to a file (``/etc/passwd``) or a folder elsewhere would copy another
    file's bytes into shards the user may share. One ``UserError`` naming the first such file, worded as ``data
    convert`` refuses one."""
    outside = first_outside(src, [sample for samples in splits.values() for sample in samples])
    if outside is not None:
        raise UserError(f"SRC: {outside} leads outside {src} (links and .. followed); pack reads only inside "
                        "the folder it is given")


def check_out(out: Path, src: Path) -> Path:
    """``out`` as an absolute path, checked: absent or an empty folder, not inside ``src``'s splits."""
    from bigbatch.floor.outputs import check_new_or_empty_folder

    out = check_new_or_empty_folder(out, "shards are")
    real = Path(os.path.realpath(out))
    for split in SPLITS:
        inside = Path(os.path.realpath(src / split))
        if real == inside or inside in real.parents:
            raise UserError(f"--out: {out} is inside {src / split}; a folder there would be read as a class")
    return out


# ----------------------------------------------------------------------------- writing


class _ShardWriter:
    """Writes one split's samples into ``PREFIX-000000.tar, ...`` under ``folder``, each under a temporary name
    renamed when complete; ``written`` collects every path made (for the clean-up of a failed pack)."""

    def __init__(self, folder: Path, prefix: str, shard_size: int, key_width: int, written: list[Path]) -> None:
        self.folder, self.prefix, self.shard_size, self.key_width = folder, prefix, shard_size, key_width
        self.written = written
        self.shards: list[dict] = []
        self._tar: tarfile.TarFile | None = None
        self._partial: Path | None = None

    def add(self, key: int, path: str, label: int, relative: str) -> None:
        try:
            data = bytes(read_regular(path))
            mtime = int(os.stat(path).st_mtime)
        except OSError as error:
            raise UserError(f"{path}: cannot be read ({error.strerror or error})") from None
        if self._tar is not None and shard_bytes(self._tar.offset + sample_bytes(len(data), label)) > self.shard_size:
            self._close()
        if self._tar is None:
            self._open()
        name, ext, text = f"{key:0{self.key_width}d}", image_ext(path), str(label).encode("ascii")
        shard = self.shards[-1]
        image_offset, image_size = self._member(f"{name}.{ext}", data, mtime)
        cls_offset, cls_size = self._member(f"{name}.cls", text, mtime)
        for column, value in (("keys", name), ("labels", label), ("sources", relative), ("image_ext", ext),
                              ("image_offset", image_offset), ("image_size", image_size),
                              ("cls_offset", cls_offset), ("cls_size", cls_size)):
            shard[column].append(value)

    def _member(self, name: str, data: bytes, mtime: int) -> tuple[int, int]:
        """Append a member; the offset and size of its data in the tar."""
        assert self._tar is not None
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), mtime, 0o644
        start = self._tar.offset + len(info.tobuf(self._tar.format, self._tar.encoding, self._tar.errors))
        self._tar.addfile(info, io.BytesIO(data))
        assert self._tar.offset == start + _padded(len(data))
        return start, len(data)

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.shards):06d}.tar"
        self._partial = self.folder / f".{name}.partial"
        self.written.append(self._partial)
        self._tar = tarfile.open(self._partial, "w", format=tarfile.USTAR_FORMAT)
        self.shards.append({"name": name, "bytes": 0, "samples": 0, "keys": [], "labels": [], "sources": [],
                            "image_ext": [], "image_offset": [], "image_size": [], "cls_offset": [],
                            "cls_size": []})

    def _close(self) -> None:
        assert self._tar is not None and self._partial is not None
        self._tar.close()
        shard = self.shards[-1]
        final = self.folder / shard["name"]
        os.replace(self._partial, final)
        self.written.append(final)
        shard["bytes"], shard["samples"] = final.stat().st_size, len(shard["keys"])
        self._tar = self._partial = None

    def finish(self) -> list[dict]:
        if self._tar is not None:
            self._close()
        return self.shards

    def abandon(self) -> None:
        if self._tar is not None:
            self._tar.fileobj.close()  # not close(): that would write the archive's end
            self._tar = None


def _write_split(folder: Path, split: str, samples: Sequence[tuple[str, int]], split_root: Path, shard_size: int,
                 written: list[Path]) -> list[dict]:
    writer = _ShardWriter(folder, split, shard_size, max(6, len(str(len(samples) - 1))), written)
    try:
        for key, (path, label) in enumerate(samples):
            writer.add(key, path, label, Path(path).relative_to(split_root).as_posix())
        return writer.finish()
    finally:
        writer.abandon()


def _write_all(folder: Path, src: Path, classes: list[str], splits: dict[str, list[tuple[str, int]]],
               shard_size: int, seed: int, written: list[Path]) -> dict:
    index: dict = {"format": FORMAT, "version": VERSION, "written_by": WRITTEN_BY, "seed": seed,
                   "shard_size": shard_size, "source": str(src), "classes": classes, "splits": {}}
    for split in SPLITS:
        samples = splits[split]
        if split == "train":  # shuffled once, as Cloud TPU's Inception TFRecords are; val keeps its order
            samples = [samples[i] for i in np.random.default_rng(seed).permutation(len(samples))]
        shards = _write_split(folder, split, samples, src / split, shard_size, written)
        index["splits"][split] = {"samples": len(samples), "shards": shards}
    partial = folder / f".{INDEX}.partial"
    written.append(partial)
    partial.write_text(json.dumps(index, separators=(",", ":")) + "\n", encoding="utf-8")
    os.replace(partial, folder / INDEX)
    written.append(folder / INDEX)
    return index


# ----------------------------------------------------------------------------- partial folders of killed packs


PARTIAL_MARK = ".bigbatch-pack"
"""The marker file of a partial folder: JSON naming its writer and the ``--out`` it is for, locked (``lockf``) by the
writing process for as long as it runs, so that the kernel releases it however the process ends."""
_OWN_NAMES = re.compile(r"^(?:\.bigbatch-pack|index\.json|\.index\.json\.partial|(?:train|val)-\d{6,}\.tar|"
                        r"\.(?:train|val)-\d{6,}\.tar\.partial)$")
"""Every name pack writes into a folder."""


def _partial_name(out: Path) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(out.name)}\.partial-(\d+)$")


def _mark(folder: Path, out: Path) -> int:
    """Write and lock ``folder``'s marker; -> its descriptor (closing it releases the lock)."""
    fd = os.open(folder / PARTIAL_MARK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"written_by": WRITTEN_BY, "pid": os.getpid(), "out": str(out)}).encode() + b"\n")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _stale_partial(folder: Path, out: Path, pid: int) -> list[Path] | None:
    """The files of ``folder`` if it is a partial folder of a pack to ``out`` by process ``pid`` that has ended
    (its marker is ours and nobody holds its lock) and it holds only names pack writes; else None."""
    mark = folder / PARTIAL_MARK
    if folder.is_symlink() or not folder.is_dir() or mark.is_symlink() or not mark.is_file():
        return None
    try:
        fd = os.open(mark, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            content = json.loads(os.read(fd, 4096))
        except ValueError:
            return None
        if content != {"written_by": WRITTEN_BY, "pid": pid, "out": str(out)}:
            return None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # its writer still runs
        files = list(folder.iterdir())
        if any(not _OWN_NAMES.match(f.name) or f.is_symlink() or not f.is_file() for f in files):
            return None  # something else was put in there: not ours to remove
        return files
    finally:
        os.close(fd)


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove the ``OUT.partial-PID`` folders that packs to ``out`` killed before they finished left beside it:
    only folders of that naming, holding pack's marker of that very ``out`` and PID, whose writer has ended, and
    holding nothing but files of pack's own naming (a folder with anything else in it is kept). -> those removed."""
    removed = []
    if not out.parent.is_dir():
        return removed
    naming = _partial_name(out)
    for folder in out.parent.iterdir():
        match = naming.match(folder.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        files = _stale_partial(folder, out, int(match.group(1)))
        if files is None:
            continue
        try:
            for path in sorted(files, key=lambda p: p.name == PARTIAL_MARK):  # the marker last
                path.unlink()
            folder.rmdir()
        except OSError:
            continue
        removed.append(folder)
    return removed


# ----------------------------------------------------------------------------- pack


def pack(src: Path, out: Path, shard_size: int, seed: int = 0) -> dict:
    """Write the ImageFolder tree ``src`` as shards into ``out`` (new or empty); see the module's docstring.

    Returns counts for a summary: ``{"out": str, "classes": int, "bytes": int, "train": {"samples", "shards",
    "bytes"}, "val": {...}, "removed": [stale partial folders removed]}``. A user's mistake (``src`` not an
    ImageFolder tree with train/ and val/, ``out`` not new or empty, ``shard_size`` not positive, a file that cannot
    be read) is a ``UserError``; nothing is left."""
    src = Path(os.path.abspath(src))
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size <= 0:
        raise UserError(f"--shard-size: expected a positive number of bytes, got {shard_size!r}")
    classes, splits = list_source(src)
    out = check_out(out, src)
    new = not out.exists()
    removed = remove_stale_partials(out) if new else []
    folder = out.with_name(f"{out.name}.partial-{os.getpid()}") if new else out
    written: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=not new)
    except OSError as error:
        raise UserError(f"--out: cannot make {folder}: {error.strerror or error}") from None
    mark = None
    try:
        try:
            if new:
                mark = _mark(folder, out)
            index = _write_all(folder, src, classes, splits, shard_size, seed, written)
            if new:
                os.rename(folder, out)
                (out / PARTIAL_MARK).unlink()
        except OSError as error:  # the source's files were read (a UserError of their own): this is the output
            raise UserError(f"--out: cannot write {error.filename or folder}: {error.strerror or error}") from None
    except BaseException:
        if new:
            shutil.rmtree(folder, ignore_errors=True)  # ours alone: made by this call (mkdir, exist_ok=False)
        else:
            for path in reversed(written):
                path.unlink(missing_ok=True)
        raise
    finally:
        if mark is not None:
            os.close(mark)
    counts = {split: {"samples": index["splits"][split]["samples"], "shards": len(index["splits"][split]["shards"]),
                      "bytes": sum(shard["bytes"] for shard in index["splits"][split]["shards"])} for split in SPLITS}
    return {"out": str(out), "classes": len(classes), "bytes": counts["train"]["bytes"] + counts["val"]["bytes"],
            **counts, "removed": [str(path) for path in removed]}
