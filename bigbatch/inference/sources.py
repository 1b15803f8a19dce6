"""What ``bigbatch predict SOURCE...`` reads: each source expanded into image and video files, in order.

A source is, as Ultralytics' and Darknet's users give it:

- an image file (``.jpg``, ``.jpeg``, ``.png``, ``.bmp``, ``.gif``, ``.webp``) or a video file (``inference/video.py``);
- a folder: its image and video files, and those of the folders below it, listed by the rules of ``data.name:
  folder`` (``data/formats/folder.py``'s ``walk_folder``: links to folders followed, a cycle of links refused,
  sorted by path); a name on anything but a regular file (a FIFO, a device, a broken link) is skipped with a warning;
- a glob pattern (``*``, ``?``, ``[``; ``**`` for any depth), matched as Python's ``glob`` matches it (a name
  starting with ``.`` only by a pattern that does, ``**`` never into such a folder) and sorted; below ``**`` the
  folders are walked as a folder source is (links followed, a cycle of links refused: Python's own ``**`` follows
  a link back to a folder it is in without end), and a pattern matching more than :data:`MAX_LISTED` files is
  refused;
- a list file (any other file, such as Darknet's ``train.txt``): one path per line, blank lines and ``#`` comments
  skipped, a relative path taken from the current folder as Darknet does, else from the list's own folder. At most
  :data:`MAX_LISTED` lines are read, each at most ``data/pipeline/files.py``'s line limit.

Nothing is read here but folder listings and list files: an image is opened when it is predicted on, and one that
cannot be read is reported then. A source that names nothing is one ``UserError``.
"""

from __future__ import annotations

import fnmatch
import glob
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bigbatch.data.pipeline.files import BadLine, read_lines
from bigbatch.errors import UserError
from bigbatch.inference.video import VIDEO_SUFFIXES, is_video

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
"""The image files a folder or a glob is listed for (those PIL and torchvision decode)."""
MAX_LISTED = 2**21
"""The most paths a list file may hold (as many as ``data/formats/folder.py`` lists in one split)."""
GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class SourceFile:
    """One file to predict on: an image, or a video read frame by frame."""

    path: str
    video: bool = False


def kind_of(path: str) -> str | None:
    """``"image"``, ``"video"`` or None (neither), by the file's suffix."""
    if path.lower().endswith(IMAGE_SUFFIXES):
        return "image"
    return "video" if is_video(path) else None


def expand_sources(sources: list[str], warn: Callable[[str], None]) -> list[SourceFile]:
    """Every image and video file the ``sources`` name, in the order given (see the module docstring); ``warn``
    gets one line for each entry skipped. No file at all: one ``UserError``."""
    found: list[SourceFile] = []
    for source in sources:
        found += list(_expand(source, warn))
    if not found:
        shown = " ".join(sources[:3]) + (" ..." if len(sources) > 3 else "")
        raise UserError(f"predict: {shown} names no image or video file (images: {', '.join(IMAGE_SUFFIXES)}; "
                        f"videos: {', '.join(VIDEO_SUFFIXES)})")
    return found


def _expand(source: str, warn: Callable[[str], None]) -> Iterator[SourceFile]:
    if os.path.isdir(source):
        yield from _folder(source, warn)
    elif os.path.lexists(source):
        yield from _file(source, warn, listed=False)
    elif GLOB_CHARS & set(source):
        matches = sorted(_glob(source))
        if not matches:
            raise UserError(f"predict: {source} matches no file")
        for match in matches:
            if os.path.isdir(match):
                yield from _folder(match, warn)
            elif kind_of(match) is not None:
                yield from _file(match, warn, listed=True)
    else:
        raise UserError(f"predict: {source} does not exist")


def _glob(pattern: str) -> list[str]:
    """The paths ``pattern`` matches (see the module docstring), at most :data:`MAX_LISTED`. With ``**``, files
    only: each file that matches, and each file below a folder that matches (a matched folder is a folder source).
    The walk enters only the folders the pattern can reach, so a cycle of links elsewhere (in a ``.cache``, which
    ``**`` never enters) is not met."""
    if "**" not in pattern:
        matches = list(itertools.islice(glob.iglob(pattern), MAX_LISTED + 1))
    else:
        from bigbatch.data.formats.folder import walk_folder

        parts = pattern.split(os.sep)
        fixed = next(i for i, part in enumerate(parts) if GLOB_CHARS & set(part))
        top = os.sep.join(parts[:fixed]) or (os.sep if pattern.startswith(os.sep) else "")
        if not os.path.isdir(top or "."):
            return []
        rest = tuple(part for part in parts[fixed:] if part)
        folders_only = pattern.endswith(os.sep)  # glob's ``X/**/``: folders, not files

        def names_of(path: str) -> tuple[str, ...]:
            below = tuple(os.path.relpath(path, top or ".").split(os.sep))
            return () if below == (".",) else below

        taken: dict[tuple[str, ...], bool] = {}  # whether a folder, or one above it, matches

        def enter(path: str) -> bool:
            names = names_of(path)
            return taken.get(names[:-1], False) or _leads_to(names, rest)

        matches = []
        for folder, entries in walk_folder(top or ".", frozenset(), enter):
            below = names_of(folder)
            if below:
                taken[below] = taken.get(below[:-1], False) or _matches(below, rest)
            else:  # the top itself: a match of glob's (``sub/**`` gives ``sub/``) where it is named, not for ``**``
                taken[below] = bool(top) and _matches(below, rest)
            for entry in entries:
                if taken[below] or (not folders_only and _matches((*below, entry.name), rest, file=True)):
                    matches.append(os.path.join(folder, entry.name) if top else os.path.join(*below, entry.name))
                    if len(matches) > MAX_LISTED:
                        break
            if len(matches) > MAX_LISTED:
                break
    if len(matches) > MAX_LISTED:
        raise UserError(f"predict: {pattern} matches more than {MAX_LISTED:,} files, the most a source may name")
    return matches


def _matches(names: tuple[str, ...], pattern: tuple[str, ...], file: bool = False) -> bool:
    """Whether the path components ``names`` match ``pattern``'s, ``**`` standing for any number of folders, as
    ``glob`` matches: a name starting with ``.`` only by a component that does, none of them crossed by ``**``. A
    file's name is never the folder a last ``**`` stands below (``X/**`` gives the files below ``X``, not ``X``)."""
    if not pattern:
        return not names
    head = pattern[0]
    if head == "**":
        last = len(pattern) == 1
        for skipped in range(1 if file and last else 0, len(names) + 1):
            if skipped and names[skipped - 1].startswith("."):
                return False
            if _matches(names[skipped:], pattern[1:], file):
                return True
        return False
    if not names or (names[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(names[0], head) and _matches(names[1:], pattern[1:], file)


def _leads_to(names: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether a folder at ``names`` may hold a match of ``pattern``: ``names`` matches a beginning of it."""
    if not names:
        return True
    if not pattern:
        return False
    head = pattern[0]
    if head == "**":
        return _leads_to(names, pattern[1:]) or (not names[0].startswith(".") and _leads_to(names[1:], pattern))
    if names[0].startswith(".") and not head.startswith("."):
        return False
    return fnmatch.fnmatchcase(names[0], head) and _leads_to(names[1:], pattern[1:])


def _file(path: str, warn: Callable[[str], None], listed: bool) -> Iterator[SourceFile]:
    """``path`` as an image or video file, or (named directly, not found in a listing) as a list file."""
    kind = kind_of(path)
    if not os.path.isfile(path):
        warn(f"{path}: not a regular file: skipped")
        return
    if kind is not None:
        yield SourceFile(path, video=kind == "video")
    elif not listed:
        yield from _list_file(path, warn)


def _folder(top: str, warn: Callable[[str], None]) -> Iterator[SourceFile]:
    from bigbatch.data.formats.folder import walk_folder

    for _, entries in walk_folder(top, frozenset()):
        for entry in sorted(entries, key=lambda e: e.name):
            if kind_of(entry.path) is not None:
                yield from _file(entry.path, warn, listed=True)


def _list_file(path: str, warn: Callable[[str], None]) -> Iterator[SourceFile]:
    """The image and video files a list file names (one per line)."""
    folder = Path(path).parent
    try:
        for number, line in read_lines(path, MAX_LISTED, "a list of images"):
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            named = entry if os.path.lexists(entry) or os.path.isabs(entry) else str(folder / entry)
            if kind_of(named) is None:
                warn(f"{path}:{number}: {entry} is neither an image nor a video file: skipped")
            elif not os.path.isfile(named):
                warn(f"{path}:{number}: {entry} is not a regular file: skipped")
            else:
                yield SourceFile(named, video=kind_of(named) == "video")
    except BadLine as error:
        raise UserError(f"predict: {error}") from None
    except OSError as error:
        raise UserError(f"predict: cannot read {path} as a list of images ({error.strerror or error})") from None
