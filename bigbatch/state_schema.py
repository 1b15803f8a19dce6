"""The schema of a saved state: what a part's ``state_dict()`` holds, value by value, so that a checkpoint's state
(a file anyone can hand to ``--resume``: it may be hostile) is checked whole before any of it is used.

A schema is a dict ``{key: spec}`` in the order the keys are checked; a spec is

    Whole(low, high)     an int (never a bool) in [low, high]
    Real(low, high)      a finite number in [low, high] (``high_open``: [low, high)); an int is taken as a float
    a dict               a nested schema

Either may allow None (``none=True``) or be absent from older states (``default=``, the value they get). A bound may
be a function of the values checked before it: ``Real(1.0, lambda state: state["batch"] / base)``.

:func:`check_state` returns the state with every value checked (ints of a ``Real`` as floats, defaults filled in)
or raises :class:`StateError` naming the first value that does not fit by its dotted key
(``noise.decay: expected a number in [0, 1), got 1.0``); a key the schema does not name is refused too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_WHOLE = 2**62
"""The default upper bound of a :class:`Whole`: a count of steps or images a run could reach, with room to spare."""

_REQUIRED = object()

Bound = int | float | Callable[[dict[str, Any]], float] | None


class StateError(ValueError):
    """A saved state that does not fit its schema: ``key`` (dotted; empty for the state itself) and ``problem``."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key, self.problem = key, problem


@dataclass(frozen=True)
class Whole:
    """An int in [low, high] (a bool is not one)."""

    low: Bound = 0
    high: Bound = MAX_WHOLE
    none: bool = False
    default: Any = _REQUIRED

    def check(self, value: Any, state: dict[str, Any]) -> Any:
        low, high = _bound(self.low, state), _bound(self.high, state)
        if type(value) is int and (low is None or value >= low) and (high is None or value <= high):
            return value
        raise _expected(f"a whole number {_range(low, high)}", self.none, value)


@dataclass(frozen=True)
class Real:
    """A finite number in [low, high], or [low, high) with ``high_open``; an int is taken as a float."""

    low: Bound = None
    high: Bound = None
    high_open: bool = False
    none: bool = False
    default: Any = _REQUIRED

    def check(self, value: Any, state: dict[str, Any]) -> Any:
        low, high = _bound(self.low, state), _bound(self.high, state)
        number = None
        if type(value) in (int, float):
            try:
                number = float(value)
            except OverflowError:  # an int past a float's range
                number = None
        if (number is not None and math.isfinite(number) and (low is None or number >= low)
                and (high is None or (number < high if self.high_open else number <= high))):
            return number
        raise _expected(f"a finite number {_range(low, high, self.high_open)}".rstrip(), self.none, value)


Spec = Whole | Real | Mapping[str, Any]
Schema = Mapping[str, Spec]


def check_state(schema: Schema, state: Any, key: str = "") -> dict[str, Any]:
    """``state`` checked against ``schema`` (see the module docstring); ``key``: where it sits, for the messages."""
    if not isinstance(state, dict):
        raise StateError(key, f"expected a dict of {', '.join(schema)}, got {shown(state)}")
    unknown = [k for k in state if k not in schema]
    if unknown:
        where = _join(key, unknown[0] if isinstance(unknown[0], str) else repr(unknown[0])[:40])
        raise StateError(where, f"unknown key (the saved state holds {', '.join(schema)})")
    checked: dict[str, Any] = {}
    for name, spec in schema.items():
        where = _join(key, name)
        if name not in state:
            default = getattr(spec, "default", _REQUIRED)
            if default is _REQUIRED:
                raise StateError(where, "missing")
            checked[name] = default
            continue
        value = state[name]
        if isinstance(spec, Mapping):
            checked[name] = check_state(spec, value, where)
        elif value is None and spec.none:
            checked[name] = None
        else:
            try:
                checked[name] = spec.check(value, checked)
            except StateError as e:
                raise StateError(where, e.problem) from None
    return checked


def shown(value: Any) -> str:
    """``value`` for a message, short whatever it is: a huge int by its size, a container by its length, a string
    cut (a hostile checkpoint's values are never printed whole)."""
    if type(value) is int and value.bit_length() > 100:
        return f"{'-' if value < 0 else ''}an integer of {math.floor(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, (list, tuple, dict, set)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return f"a {type(value).__name__}"


def _bound(bound: Bound, state: dict[str, Any]) -> float | None:
    return bound(state) if callable(bound) else bound


def _range(low: float | None, high: float | None, high_open: bool = False) -> str:
    if high is None:
        return "" if low is None else f">= {_number(low)}"
    if low is None:
        return f"< {_number(high)}" if high_open else f"<= {_number(high)}"
    return f"in [{_number(low)}, {_number(high)}{')' if high_open else ']'}"


def _number(bound: float) -> str:
    if bound == MAX_WHOLE:
        return "2^62"
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _expected(what: str, none: bool, value: Any) -> StateError:
    return StateError("", f"expected {what}{' or None' if none else ''}, got {shown(value)}")


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name
