"""A ``.cfg`` written back with some keys changed and every other line as written: the network a run trained (its
class count) kept in the run directory, and written beside an exported ``.weights`` so that Darknet loads the two.

A key is changed on the line Darknet reads it from (the first, when given twice), keeping the key's spelling and any
comment after the value; a key the section does not give is added on the line after its ``[section]`` header.
"""

from __future__ import annotations

from pathlib import Path

from bigbatch.darknet.cfg import read_darknet_cfg, with_classes
from bigbatch.darknet.spec import DarknetCfg
from bigbatch.darknet.text import read_cfg_sections, read_cfg_text

KEPT_CFG_MARK = "# kept by bigbatch:"
"""The first line of a cfg bigbatch wrote (a run's ``model.cfg``, the cfg ``export`` writes beside ``.weights``): such
a file may be replaced by the next one; any other is the user's. Written again from such a cfg, the line is replaced."""

CLASS_KEYS = {"yolo": "classes", "convolutional": "filters", "connected": "output"}
"""The key of each layer kind that :func:`~bigbatch.darknet.cfg.with_classes` changes for a new class count."""


def edit_cfg_text(path: Path, changes: dict[int, dict[str, str]], header: str = "") -> str:
    """The text of the ``.cfg`` at ``path`` with ``changes`` ({layer index (0 = the first section after ``[net]``):
    {key: new value}}) made, and ``header`` (comment lines, each starting with ``#``) put first (in place of the
    first line, when that is :data:`KEPT_CFG_MARK`'s)."""
    text = read_cfg_text(path, prefix="")
    lines = text.split("\n")
    drop = 1 if header and lines[0].startswith(KEPT_CFG_MARK) else 0  # an earlier header: replaced
    sections = read_cfg_sections(path, prefix="")
    inserted: dict[int, list[str]] = {}  # 0-based line -> lines to add after it
    for index, keys in changes.items():
        section = sections[index + 1]
        for key, value in keys.items():
            if key in section.key_lines:
                number = section.key_lines[key][0] - 1
                name, _, rest = lines[number].partition("=")
                _, hash_, comment = rest.partition("#")
                lines[number] = f"{name.rstrip()}={value}" + (f" #{comment}" if hash_ else "")
            else:
                inserted.setdefault(section.line - 1, []).append(f"{key}={value}")
    out: list[str] = [line for line in header.splitlines() if line]
    for number, line in enumerate(lines):
        if number >= drop:
            out.append(line)
        out.extend(inserted.get(number, []))
    return "\n".join(out)


def cfg_text_of(cfg: DarknetCfg, header: str = "") -> str:
    """The text of ``cfg.path`` with the class-count keys (:data:`CLASS_KEYS`) of ``cfg``, a network read from it
    and changed for a dataset's classes (``with_classes``), every other line as written."""
    original = read_darknet_cfg(cfg.path)
    changes: dict[int, dict[str, str]] = {}
    for before, after in zip(original.layers, cfg.layers, strict=True):
        key = CLASS_KEYS.get(before.kind)
        if key is not None and getattr(before, key) != getattr(after, key):
            changes[before.index] = {key: str(getattr(after, key))}
    return edit_cfg_text(cfg.path, changes, header)


def cfg_text_for_classes(path: Path, classes: int, header: str = "") -> str:
    """The ``.cfg`` at ``path`` as a network for ``classes`` classes (``with_classes``: each ``[yolo]``'s
    ``classes`` and the ``filters`` of the convolution before it; a classifier's last layer before its
    ``[softmax]``), every other line as written."""
    return cfg_text_of(with_classes(read_darknet_cfg(path), classes), header)
