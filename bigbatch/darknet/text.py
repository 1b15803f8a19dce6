"""Darknet's text files: ``key=value`` lines, under ``[section]`` headers in a ``.cfg``.

One reader for the ``.cfg`` (``recipe.py``, ``cfg.py``) and the ``.data`` file (``yolo_data.py``), as Darknet
reads both (``read_option`` in src/option_list.c, ``read_cfg`` in src/parser.c): each line is stripped; an empty
line, or one starting with ``#`` or ``;``, is skipped; in a ``.cfg``, ``[name]`` starts a section; every other line
is ``key=value``, both sides stripped.

In a ``.cfg``, stripping is Darknet's ``strip`` (src/utils.c), which deletes every space, tab, ``\r`` and ``\n`` of
the line, not only those at its ends: ``anchors = 61,45    61,45`` is read as ``61,4561,45``, and ``[ yolo ]`` as
``[yolo]``. Where that joins two characters of a key or of one comma-separated item (``45    61`` read as
``4561``), ``warnings`` gets one line saying so. A ``.data`` file's lines are stripped at their ends only: its values
are paths, and a path with a space, which Darknet's ``read_data_cfg`` would mangle, is read as written. (Other
whitespace at a line's ends, Python's ``str.strip``, is also dropped, as before.) Errors quote a line as written,
ends stripped. A key given twice keeps its first value, as Darknet's ``option_find``
reads the first (``warnings`` gets one line naming both lines). In a ``.cfg``, a ``#`` after a value starts a comment
(``layers = 180 ###P6``: Darknet's ``atoi`` stops there), also noted in ``warnings``. Lines are numbered from 1, as
given.

``read_keyed_sections`` is the same reading that also keeps the line of every key (for messages naming a key's
line); ``read_options`` is it without those lines. ``parse_number`` reads one number as ``atoi``/``atof`` would be
asked to, but strictly: the caller words the message when it is not one. ``read_cfg_sections`` and ``read_cfg``
read a ``.cfg`` file (lines split on ``\n``, as Darknet and editors count them), through :func:`read_cfg_text`: only
a regular file (a FIFO is not waited on, a link to ``/dev/zero`` not read) of at most :data:`MAX_CFG_BYTES`, checked
before any of it is read (``floor/user_files.read_regular``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from bigbatch.errors import UserError
from bigbatch.floor.user_files import read_regular

Section = tuple[str, dict[str, str], int]
"""(name, options, line number of the header)."""


class KeyedSection(NamedTuple):
    """A section with the lines of its keys: ``key_lines[key]`` is every line ``key`` was given on, in order."""

    name: str
    options: dict[str, str]
    line: int
    key_lines: dict[str, list[int]]


def read_keyed_sections(lines: Iterable[str], where: str, expected: str = "key=value", sections: bool = False,
                        warnings: list[str] | None = None) -> list[KeyedSection]:
    """The sections of ``lines`` in order, with the line of every key; errors as :func:`read_options`; the
    leniencies taken (a key given twice, a comment after a value) are appended to ``warnings``."""
    warnings = [] if warnings is None else warnings
    found: list[KeyedSection] = [] if sections else [KeyedSection("", {}, 0, {})]
    for number, raw in enumerate(lines, start=1):
        written = raw.strip()
        line = DARKNET_SPACE.sub("", written) if sections else written  # a .cfg: Darknet's strip (src/utils.c)
        if not line or line[0] in "#;":
            continue
        if sections and line.startswith("["):
            if not line.endswith("]"):
                raise UserError(f"{where}:{number}: malformed section header {written!r}")
            found.append(KeyedSection(line[1:-1].strip(), {}, number, {}))
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UserError(f"{where}:{number}: expected {expected}, got {written!r}")
        if not found:
            raise UserError(f"{where}:{number}: option {key.strip()!r} before any [section]")
        key, value = key.strip(), value.strip()
        hash_ = comment = ""
        if sections:  # a .cfg; a .data file's values are paths, which may hold a '#'
            value, hash_, _ = value.partition("#")
            value = value.strip()
            comment = written.partition("#")[2].strip() if hash_ else ""  # quoted as written
        if sections and line != written:
            _joined(written, found[-1].name, where, number, warnings)
        if hash_:
            warnings.append(f"{where}:{number}: {key}: the comment after the value ({'#' + comment}) is ignored, "
                            f"as Darknet ignores it; read as {value!r}")
        section = found[-1]
        if key in section.options:
            warnings.append(f"{where}:{section.key_lines[key][0]}: [{section.name}] {key}: given twice (also line "
                            f"{number}); Darknet reads the first, {section.options[key]!r}, and so does bigbatch")
        else:
            section.options[key] = value
        section.key_lines.setdefault(key, []).append(number)
    return found


DARKNET_SPACE = re.compile("[ \t\r\n]")
"""The characters Darknet's ``strip`` (src/utils.c) deletes from every line of a ``.cfg``, wherever they are."""

JOINED = re.compile(r"[^ \t\r\n,][ \t\r\n]+[^ \t\r\n,]")
"""Spaces between two characters that are not commas: deleting them joins two words (``45    61`` -> ``4561``)."""


def _joined(written: str, section: str, where: str, number: int, warnings: list[str]) -> None:
    """One warning for each key or comma-separated item of the line ``written`` that Darknet's ``strip`` joins."""
    key, _, value = written.partition("=")
    value = value.partition("#")[0]  # the comment after a value is ignored, and says so itself
    key_name = DARKNET_SPACE.sub("", key)
    pieces = [key.strip()] + [item.strip() for item in value.split(",")]
    for piece in pieces:
        if JOINED.search(piece):
            warnings.append(f"{where}:{number}: [{section}] {key_name}: {piece!r} is read as "
                            f"{DARKNET_SPACE.sub('', piece)!r}: Darknet's strip deletes every space and tab in a "
                            "line, and so does bigbatch (a comma missing?)")


def read_options(lines: Iterable[str], where: str, expected: str = "key=value", sections: bool = False
                 ) -> list[Section]:
    """The sections of ``lines`` in order; without ``sections``, one section ``("", options, 0)`` of all the lines.

    A mistake is a :class:`UserError` ``"{where}:{line}: ..."``: a line without ``=`` ("expected {expected}"), a
    malformed header, an option before the first header (``sections`` only).
    """
    return [(s.name, s.options, s.line) for s in read_keyed_sections(lines, where, expected, sections)]


INT_MAX = 2**31 - 1
"""Darknet reads its integer options into C ints."""


def parse_number(value: str, kind: type) -> int | float | None:
    """``value`` as a finite ``kind`` (``int`` or ``float``), or None when it is not one.

    An ``int`` may be written with a fraction (``"1.5"`` is 1, as C's ``atoi`` reads it) and must lie within a C
    int (``|n| <= INT_MAX``); a ``float`` must be finite.
    """
    try:
        number = kind(float(value)) if kind is int and "." in value else kind(value)
    except (ValueError, OverflowError):  # OverflowError: an integer written as 1.5e999
        return None
    if kind is int and abs(number) > INT_MAX:
        return None
    if not math.isfinite(number):
        return None
    return number


MAX_CFG_BYTES = 4 * 2**20
"""The largest ``.cfg`` read, in bytes (4 MiB): Darknet's largest stock cfgs are about 30 KB (AlexeyAB's
``cspx-p7-mish_hp.cfg``, 30,733 bytes), and ``cfg.MAX_LAYERS`` sections of a few keys each fit well within it."""


def read_cfg_text(path: Path, prefix: str = "config: ") -> str:
    """The text of the ``.cfg`` at ``path`` (UTF-8, an undecodable byte replaced), read only once it is known to be a
    regular file of at most :data:`MAX_CFG_BYTES`; otherwise one ``UserError`` beginning ``prefix`` (the key that
    named the file: ``"--cfg: "``, ``"model.cfg: "``, ``"config: "``) and naming the file."""
    try:
        data = read_regular(path, MAX_CFG_BYTES, "a .cfg")
    except OSError as e:
        if e.errno is None:  # open_regular's refusals: not a regular file, past the bound, grew while read
            raise UserError(f"{prefix}{e}; not read") from None
        raise UserError(f"{prefix}cannot read {path}: {e.strerror}") from None
    # newlines as a text-mode read gives them (\r\n and a lone \r are \n), as the cfg was read before
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def read_cfg_sections(path: Path, prefix: str = "config: ", warnings: list[str] | None = None,
                      key: str | None = None) -> list[KeyedSection]:
    """The sections of a ``.cfg`` file in order, with the line of each key; errors begin ``{prefix}{path}``, those of
    reading the file (:func:`read_cfg_text`) ``{key}: `` when ``key`` is given; leniencies are appended to
    ``warnings``."""
    text = read_cfg_text(path, prefix if key is None else f"{key}: ")
    lines = text.split("\n")  # lines as Darknet and editors count them
    return read_keyed_sections(lines, f"{prefix}{path}", sections=True, warnings=warnings)


def read_cfg(path: Path) -> list[tuple[str, dict[str, str], int]]:
    """The sections of a ``.cfg`` file in order: (name, options, line number of the header)."""
    return [(s.name, s.options, s.line) for s in read_cfg_sections(path)]
