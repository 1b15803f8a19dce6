"""Darknet's text files: ``key=value`` lines, under ``[section]`` headers in a ``.cfg``.

One reader for the ``.cfg`` (``recipe/darknet_cfg.py``) and the ``.data`` file (``data/yolo.py``), as Darknet
reads both (``read_option`` in src/option_list.c, ``read_cfg`` in src/parser.c): each line is stripped; an empty
line, or one starting with ``#`` or ``;``, is skipped; in a ``.cfg``, ``[name]`` starts a section; every other line
is ``key=value``, both sides stripped (a later key replaces an earlier one). Lines are numbered from 1, as given.
"""

from __future__ import annotations

from collections.abc import Iterable

from bigbatch.errors import UserError

Section = tuple[str, dict[str, str], int]
"""(name, options, line number of the header)."""


def read_options(lines: Iterable[str], where: str, expected: str = "key=value", sections: bool = False
                 ) -> list[Section]:
    """The sections of ``lines`` in order; without ``sections``, one section ``("", options, 0)`` of all the lines.

    A mistake is a :class:`UserError` ``"{where}:{line}: ..."``: a line without ``=`` ("expected {expected}"), a
    malformed header, an option before the first header (``sections`` only).
    """
    found: list[Section] = [] if sections else [("", {}, 0)]
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if sections and line.startswith("["):
            if not line.endswith("]"):
                raise UserError(f"{where}:{number}: malformed section header {line!r}")
            found.append((line[1:-1].strip(), {}, number))
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UserError(f"{where}:{number}: expected {expected}, got {line!r}")
        if not found:
            raise UserError(f"{where}:{number}: option {key.strip()!r} before any [section]")
        found[-1][1][key.strip()] = value.strip()
    return found
