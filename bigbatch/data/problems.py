"""Data problems: bad images, labels and boxes, reported once each, whatever the dataset format.

Bad data never crashes a run. Each problem is reported once with its file (and line), and the caller skips (or
replaces, or clips) the image or box; with ``strict`` the first problem raises a ``UserError`` instead, which the
CLI prints as ``error: data: <file>:<line>: <message>`` before any training. Every format reports through
:class:`DataIssues`, classification and detection alike; the run prints its :meth:`DataIssues.summary`.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Sequence
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


class DataIssues:
    """Collects data problems ``(path, line | None, message)``.

    Default mode: each problem is printed once to stderr as ``warning: <path>:<line>: <message>`` and the
    caller skips the image or box. Strict mode: the first problem raises ``UserError("data: ...")``.
    Picklable; a DataLoader worker holds its own copy, so "once" is once per process.
    """

    def __init__(self, strict: bool = False):
        self.strict = strict
        self.problems: list[DataProblem] = []
        self._seen: set[DataProblem] = set()
        self._outcomes: Counter[tuple[str, str]] = Counter()  # (action, unit) -> count

    def report(self, path: str | os.PathLike, line: int | str | None, message: str, unit: str = "image",
               action: str = "skipped") -> None:
        """A problem with ``path`` (at ``line``); what happened to it: ``unit`` (image, box) ``action``."""
        problem = DataProblem(str(path), line, message)
        if self.strict:
            raise UserError(f"data: {problem}")
        if problem in self._seen:
            return
        self._seen.add(problem)
        self.problems.append(problem)
        self._outcomes[(action, unit)] += 1
        print(f"warning: {problem}", file=sys.stderr, flush=True)

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
