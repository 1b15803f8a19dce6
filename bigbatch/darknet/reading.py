"""Reading one section of a ``.cfg`` key by key, with Darknet's defaults and bigbatch's checks.

:class:`SectionReader` is what each layer kind's parser (``layers/``) reads its section with. It remembers the keys
read; :meth:`SectionReader.rest` then sorts the others: a key Darknet knows that changes nothing bigbatch builds is
collected as ``"section:key"`` (``DarknetCfg.ignored``); a key Darknet does not know is a warning, as Darknet's
``option_unused`` prints it, and the section is built without it, as Darknet builds it.

Values are checked strictly: a value must be a number of the right kind and range (Darknet's ``atoi``/``atof``
read ``"3x"`` as 3 and ``""`` as 0); an unknown activation is an error (Darknet falls back to relu).

A key that names a file (``[softmax] tree=``) is looked up by :func:`find_named_file`: only where Darknet users keep
such a file, and never outside those folders, whatever the ``.cfg`` says.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from bigbatch.darknet.activations import ACTIVATIONS
from bigbatch.darknet.text import KeyedSection, parse_number
from bigbatch.errors import UserError

LAYER_KEYS_IGNORED = frozenset({"clip", "onlyforward", "learning_rate", "stream", "wait_stream"})
"""Keys parse_network_cfg reads for every layer (training controls bigbatch does not use; the freezing keys it also
reads for every layer, ``spec.FREEZING_KEYS``, are read by ``cfg.py``)."""

TRAINING_KEYS_IGNORED = {
    "learning_rate": (1.0, "Darknet multiplies this layer's learning rate by it (learning_rate_scale); bigbatch trains "
                           "it at the run's learning rate"),
    "onlyforward": (0.0, "Darknet runs no backward through this layer (no update of it, and no gradient through it "
                         "to the layers before); bigbatch trains it"),
    "clip": (0.0, "Darknet clips this layer's weights to [-clip, clip] after each update on the GPU; bigbatch "
                  "does not"),
}
"""Keys of :data:`LAYER_KEYS_IGNORED` that change training where set to other than their default (AlexeyAB's
``parse_network_cfg``; ``network.c``'s ``backward_network``, ``update_convolutional_layer``): said once each, in a
warning naming the line, since the run then trains otherwise than Darknet would."""

LAYER_KEYS_REFUSED = frozenset({"dontload", "dontloadscales"})
"""Keys of every layer that change how ``.weights`` are read when non-zero."""


LEADING_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
"""The longest prefix of an item that C's ``atof`` reads as a number."""


NAMED_FILE_FOLDERS = "the current folder, the cfg's folder and its parent folder"
"""Where a file a ``.cfg`` names is looked up (:func:`find_named_file`), in that order, for the messages."""


def find_named_file(cfg_path: Path, name: str) -> Path:
    """The file ``name`` that a key of the ``.cfg`` at ``cfg_path`` names, where Darknet users keep it: from the
    current folder (as Darknet opens it), else beside the cfg, else in the cfg's parent folder (Darknet's repository
    keeps ``cfg/`` beside ``data/``, and runs from their parent). An absolute name is taken as given.

    The first of these that exists is the file, if its real path (links and ``..`` followed) lies inside one of those
    three folders (their real paths); a file that leads outside them is refused, never opened: a ``.cfg`` from
    elsewhere must not make bigbatch read, and quote, a file of the user's. ``LookupError`` says why, without the
    file's content; the path returned is the real one, which is what is opened."""
    cfg = Path(os.path.abspath(cfg_path))
    folders = list(dict.fromkeys((Path.cwd(), cfg.parent, cfg.parent.parent)))
    inside = [Path(os.path.realpath(folder)) for folder in folders]
    given = Path(name)
    for candidate in [given] if given.is_absolute() else [folder / given for folder in folders]:
        if not os.path.exists(candidate):
            continue
        real = Path(os.path.realpath(candidate))
        if not any(real.is_relative_to(folder) for folder in inside):
            raise LookupError(f"{name} leads outside the folders a cfg's files are read from ({NAMED_FILE_FOLDERS}): "
                              "not read")
        return real
    raise LookupError(f"{name} not found (looked from the current folder, beside the cfg and in its parent folder)")


class SectionReader:
    """One section's options, read key by key with Darknet's defaults; remembers which keys were read."""

    def __init__(self, path: Path, section: KeyedSection, index: int, warnings: list[str] | None = None) -> None:
        self.path, self.name, self.options, self.line = path, section.name, section.options, section.line
        self.key_lines = section.key_lines
        self.index = index
        self.read: set[str] = set()
        self.warnings = [] if warnings is None else warnings

    def lines(self) -> dict[str, int]:
        return {key: lines[0] for key, lines in self.key_lines.items()}

    def error(self, key: str | None, what: str, line: int | None = None) -> UserError:
        line = line or (self.key_lines[key][0] if key in self.key_lines else self.line)
        name = f"[{self.name}] {key}" if key else f"[{self.name}]"
        return UserError(f"{self.path}:{line}: {name}: {what}")

    def warn(self, key: str | None, what: str) -> None:
        self.warnings.append(str(self.error(key, what)))

    def has(self, key: str) -> bool:
        return key in self.options

    def text(self, key: str, default: str) -> str:
        self.read.add(key)
        return self.options.get(key, default)

    def file(self, key: str) -> Path | None:
        """The file ``key`` names (:func:`find_named_file`), None without the key; not found, or outside the folders
        it is looked up in: an error naming the key."""
        name = self.text(key, "")
        if not name:
            return None
        try:
            return find_named_file(self.path, name)
        except LookupError as error:
            raise self.error(key, str(error)) from None

    def integer(self, key: str, default: int, low: int | None = None, high: int | None = None) -> int:
        self.read.add(key)
        if key not in self.options:
            return default
        return self._integer(key, self.options[key], low, high)

    def _integer(self, key: str, value: str, low: int | None, high: int | None) -> int:
        number = parse_number(value, float)
        if number is None or not float(number).is_integer() or parse_number(str(int(number)), int) is None:
            raise self.error(key, f"expected {_range('an integer', low, high)}, not {value!r}")
        number = int(number)
        if (low is not None and number < low) or (high is not None and number > high):
            raise self.error(key, f"expected {_range('an integer', low, high)}, not {value!r}")
        return number

    def flag(self, key: str, default: bool = False) -> bool:
        return bool(self.integer(key, int(default), 0, 1))

    def number(self, key: str, default: float, low: float | None = None, high: float | None = None,
               above: float | None = None) -> float:
        self.read.add(key)
        if key not in self.options:
            return default
        return self._number(key, self.options[key], low, high, above)

    def _number(self, key: str, value: str, low: float | None, high: float | None, above: float | None) -> float:
        number = parse_number(value, float)
        ok = number is not None and (low is None or number >= low) and (high is None or number <= high) and (
            above is None or number > above)
        if not ok:
            what = f"a number > {above:g}" if above is not None else _range("a finite number", low, high)
            raise self.error(key, f"expected {what}, not {value!r}")
        return float(number)

    def choice(self, key: str, default: str, choices: Iterable[str]) -> str:
        value = self.text(key, default)
        choices = tuple(choices)
        if value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, not {value!r}")
        return value

    def items(self, key: str) -> list[str] | None:
        """The comma-separated items of ``key`` (None when absent); an empty item is an error."""
        self.read.add(key)
        if key not in self.options:
            return None
        items = [item.strip() for item in self.options[key].split(",")]
        if items and items[-1] == "" and len(items) > 1:  # a trailing comma, as Darknet's lists allow
            items.pop()
        if any(item == "" for item in items):
            raise self.error(key, f"expected comma-separated numbers, not {self.options[key]!r}")
        return items

    def integers(self, key: str, low: int | None = None, high: int | None = None) -> list[int] | None:
        items = self.items(key)
        return None if items is None else [self._integer(key, item, low, high) for item in items]

    def numbers(self, key: str, above: float | None = None) -> list[float] | None:
        items = self.items(key)
        return None if items is None else [self._number(key, item, None, None, above) for item in items]

    def anchors(self, num: int) -> list[float]:
        """``anchors``: ``2 * num`` positive numbers, read as Darknet's parse_yolo reads them, which bigbatch follows
        with a warning: only the first ``2 * num`` items count, missing ones are 0.5 (make_yolo_layer's), and an item
        is read up to its first character that is not part of a number (``atof``: ``"45x"`` is 45; spaces inside a line
        are already gone, ``text.py``)."""
        items = self.items("anchors")
        if items is None:
            raise self.error("anchors", f"missing: expected {2 * num} numbers, w,h for each of num={num} anchors")
        if len(items) > 2 * num:
            self.warn("anchors", f"{len(items)} numbers; Darknet reads the first {2 * num} (num={num}), and so does "
                                 "bigbatch")
            items = items[:2 * num]
        missing = 2 * num - len(items)
        if missing > 0:
            self.warn("anchors", f"{len(items)} numbers, {2 * num} expected (num={num}); the last {missing} are "
                                 "Darknet's default, 0.5, as make_yolo_layer leaves them")
        values = []
        for item in items:
            if parse_number(item, float) is None:
                match = LEADING_NUMBER.match(item)
                if match is None:
                    raise self.error("anchors", f"expected a number > 0, not {item!r}")
                self.warn("anchors", f"{item!r} read as {match.group(0)}, as Darknet's atof reads it")
                item = match.group(0)
            values.append(self._number("anchors", item, None, None, 0))
        return values + [0.5] * max(0, missing)

    def activation(self, default: str) -> str:
        return self.choice("activation", default, ACTIVATIONS)

    def layer_index(self, value: int, key: str) -> int:
        """A layer index as Darknet resolves it (``i < 0`` means ``index + i``); it must be a layer before this
        one."""
        absolute = self.index + value if value < 0 else value
        if not 0 <= absolute < self.index:
            raise self.error(key, f"{value} is layer {absolute}, not a layer before this one "
                                  f"(this is layer {self.index}; valid: -{self.index}..-1 or 0..{self.index - 1})")
        return absolute

    def layer_indices(self, key: str) -> tuple[int, ...]:
        """``key``'s layer indices, relative ones resolved: each must be a layer before this one."""
        values = self.integers(key)
        if not values:
            raise self.error(key, "missing: expected the indices of earlier layers (e.g. -1 or -1, 8)")
        return tuple(self.layer_index(value, key) for value in values)

    def refuse(self, known: Mapping[str, str]) -> None:
        """Refuse a key of ``known`` set to other than its off value."""
        for key, off in known.items():
            if key in self.options:
                self.read.add(key)
                value = self.options[key]
                numeric = parse_number(off, float) is not None
                if (parse_number(value, float) != float(off)) if numeric else (value != off):
                    raise self.error(key, f"{value!r} is not supported by bigbatch (only {off})")

    def rest(self, ignored_here: frozenset[str], refused_here: Mapping[str, str], ignored: list[str]) -> None:
        """Sort the keys not read: known to Darknet and unused -> ``ignored``; unknown -> a warning."""
        self.refuse(dict.fromkeys(LAYER_KEYS_REFUSED, "0"))
        for key in self.options:
            if key in self.read:
                continue
            if key in LAYER_KEYS_IGNORED or key in ignored_here:
                ignored.append(f"{self.name}:{key}")
                default, effect = TRAINING_KEYS_IGNORED.get(key, (None, ""))
                value = parse_number(self.options[key], float) if default is not None else None
                if value is not None and value != default:
                    self.warn(key, f"{self.options[key]} is not used: {effect}")
                continue
            expected = sorted(self.read - LAYER_KEYS_REFUSED - set(refused_here))
            self.warn(key, f"unknown key, not used (Darknet does not read it either; [{self.name}] reads: "
                           f"{', '.join(expected)})")


def _range(what: str, low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{what} between {low:g} and {high:g}"
    if low is not None:
        return f"{what} >= {low:g}"
    if high is not None:
        return f"{what} <= {high:g}"
    return what
