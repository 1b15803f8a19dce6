"""Data problems: bad images, labels and boxes, reported once each, whatever the dataset format.

Bad data never crashes a run. Each problem is reported once with its file (and line), and the caller skips (or
replaces, or clips) the image or box; with ``strict`` the first problem raises a ``UserError`` instead, which the
CLI prints as ``error: data: <file>:<line>: <message>`` before any training. Every format reports through
:class:`DataIssues`, classification and detection alike; the run prints its :meth:`DataIssues.summary`.

A set none of whose samples can be used is one error naming the set, never a warning for each sample first: an
unreadable image is reported only once a readable one stands in for it (:meth:`DataIssues.replaced`, else
:func:`none_readable`), and the problems found while a set is listed or loaded wait until it is whole
(:meth:`DataIssues.held`).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bigbatch.errors import UserError


@dataclass(frozen=True)
class DataProblem:
    path: str
    line: int | str | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


_PLURALS = {"box": "boxes"}
_UNIT_ORDER = ("image", "box")
_ACTION_ORDER = ("skipped", "replaced", "clipped")


def _count(n: int, unit: str) -> str:
    return f"{n} {unit if n == 1 else _PLURALS.get(unit, unit + 's')}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _rank(order: tuple[str, ...], name: str) -> tuple[int, str]:
    return (order.index(name) if name in order else len(order), name)


def none_readable(name: str, count: int, where: str, problem: str) -> UserError:
    """The one error of a set none of whose ``count`` images can be read, naming the set and the first image tried
    (``where``: ``problem``). Its images are not warned of one by one first: a set's unreadable images are reported
    only once a readable one stands in for them (:meth:`DataIssues.replaced`)."""
    return UserError(f"data: none of the {count} images of {name} can be decoded (the first tried, {where}: "
                     f"{problem})")


class DataIssues:
    """Collects data problems ``(path, line | None, message)``.

    Default mode: each problem is printed once to stderr as ``warning: <path>:<line>: <message>`` and the
    caller skips the image or box. Strict mode: the first problem raises ``UserError("data: ...")``.
    Picklable; a DataLoader worker holds its own copy, so "once" is once per process.
    """

    def __init__(self, strict: bool = False, tolerated: frozenset[str] = frozenset()):
        self.strict = strict
        self.tolerated = tolerated
        """Actions (``clipped``) reported as warnings even in strict mode: ``data convert`` clips a box that
        overshoots the image, as training does, and stops at anything else."""
        self.problems: list[DataProblem] = []
        self._held: list[DataProblem] | None = None  # inside held(): the warnings not printed yet
        self._seen: set[DataProblem] = set()
        self._outcomes: Counter[tuple[str, str]] = Counter()  # (action, unit) -> count

    def report(self, path: str | os.PathLike, line: int | str | None, message: str, unit: str = "image",
               action: str = "skipped") -> None:
        """A problem with ``path`` (at ``line``); what happened to it: ``unit`` (image, box) ``action``."""
        problem = DataProblem(str(path), line, message)
        if self.strict and action not in self.tolerated:
            raise UserError(f"data: {problem}")
        if problem in self._seen:
            return
        self._seen.add(problem)
        self.problems.append(problem)
        self._outcomes[(action, unit)] += 1
        if self._held is not None:
            self._held.append(problem)
        else:
            print(f"warning: {problem}", file=sys.stderr, flush=True)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Inside, each problem's warning waits: they are printed, in order, when the block ends, and never when it
        ends with an error, which is then the one line (a set loaded inside whose every sample is refused is one
        error naming the set, :meth:`first`, not a warning for each sample first). Inside another, the outer
        block decides."""
        if self._held is not None:
            yield
            return
        self._held = []
        try:
            yield
        except BaseException:
            self._held = None
            raise
        held, self._held = self._held, None
        for problem in held:
            print(f"warning: {problem}", file=sys.stderr, flush=True)

    def first(self) -> str:
        """The first problem, for an error that follows from the problems: `` (N problems in the data, the first:
        PATH: MESSAGE)``; empty without a problem."""
        if not self.problems:
            return ""
        return f" ({_count(len(self.problems), 'problem')} in the data, the first: {self.problems[0]})"

    def replaced(self, found: Sequence[tuple[str, str]]) -> None:
        """Report each ``(path, message)`` of ``found``: unreadable images a readable one of the same set now stands
        in for. A search that finds no readable image reports none of them and raises :func:`none_readable`."""
        for path, message in found:
            self.report(path, None, message, action="replaced")

    def absorb(self, found: Sequence[tuple[str, str]], unit: str = "image", action: str = "replaced") -> None:
        """Count problems found (and printed) in another process, a DataLoader worker: ``(path, message)`` pairs
        that samples carry in ``target["data_problems"]``. A problem already known is not counted again."""
        for path, message in found:
            problem = DataProblem(str(path), None, message)
            if problem not in self._seen:
                self._seen.add(problem)
                self.problems.append(problem)
                self._outcomes[(action, unit)] += 1

    def absorb_targets(self, targets: Sequence[dict[str, Any]]) -> None:
        """``absorb`` the problems carried by a batch's targets."""
        for target in targets:
            if "data_problems" in target:
                self.absorb(target["data_problems"])

    def __len__(self) -> int:
        return len(self.problems)

    def summary(self) -> str:
        """E.g. ``data: 3 problems in 2 files: 1 image and 2 boxes skipped``."""
        if not self.problems:
            return "data: no problems"
        files = len({p.path for p in self.problems})
        by_action: dict[str, list[str]] = {}
        order = sorted(self._outcomes, key=lambda k: (_rank(_ACTION_ORDER, k[0]), _rank(_UNIT_ORDER, k[1])))
        for action, unit in order:
            by_action.setdefault(action, []).append(_count(self._outcomes[(action, unit)], unit))
        outcomes = "; ".join(f"{_and(units)} {action}" for action, units in by_action.items())
        return f"data: {_count(len(self.problems), 'problem')} in {_count(files, 'file')}: {outcomes}"
