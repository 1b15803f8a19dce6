"""A config's unknown keys, said as validation says them, found without importing any part (nor torch).

``bigbatch/cli.py`` asks this before anything else is loaded, so that a mistyped key (``--set optim.lrr=0.1``,
``model.widht: 8`` in a file) is said at once; validation (``loading.validate_config``) then checks the rest,
loading the registries' parts. A section's keys are its own fields and, in a part section, those its parts add as
:meth:`PartSection.keys` gives them without ``load``: the built-in parts' keys, declared with the section, and those
of any part registered so far.

The unknown keys come in validation's order, which is pydantic's: in a section, first the mistakes of its fields in
the order it declares them (a field holding a section: that section's mistakes, found the same way; a part section:
its own fields, then those its parts add), then its unknown keys in the order the config gives them. So a config
whose only mistakes are unknown keys is told validation's very line; one with other mistakes as well is told its
unknown keys first, the rest by validation once they are fixed. Where pydantic would not say "unknown key" (a key
that is not a string, in a section that is not a part section: "keys should be strings"), or a section stands in a
union this does not follow, nothing is said here: validation says it all.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any

from bigbatch.config.adaptive import unfold_adaptive
from bigbatch.config.messages import dotted, one_line, own_error, section_in, unknown_key
from bigbatch.config.run import RunConfig
from bigbatch.config.section import PartSection, Section


class _Unsure(Exception):
    """Met something whose mistakes validation words otherwise: leave the whole config to validation."""


def unknown_keys_line(data: dict[str, Any]) -> str | None:
    """The line validation gives ``data`` (a config read and its ``--set`` applied) for its unknown keys, or None
    when it has none (or when what it holds is left to validation, see the module docstring)."""
    try:
        data = unfold_adaptive(data)
    except ValueError as e:  # RunConfig's first check (``batch: {mode: adaptive, ...}``): validation's only line
        return "{}: {}".format(*own_error(str(e), dotted(())))
    try:
        found = list(_unknown(RunConfig, data, ()))
    except _Unsure:
        return None
    return one_line(found) if found else None


def _unknown(section: type[Section], data: dict[Any, Any], loc: tuple[Any, ...]) -> Iterator[tuple[str, str]]:
    """(dotted key, what is wrong) for each unknown key in ``data``, a mapping given for ``section`` at ``loc``."""
    part = issubclass(section, PartSection)
    if not part and not all(isinstance(key, str) for key in data):
        raise _Unsure
    keys = section.keys(load=False)  # in the section's layout, as the message lists them
    fields = [*section.model_fields, *(section.added_fields(load=False) if part else ())]  # in validation's order
    for name in fields:
        if name in data and name in keys:
            yield from _inside(keys[name], data[name], (*loc, name))
    for name in data:
        if name not in fields:
            yield dotted((*loc, name)), unknown_key(name, list(keys))


def _inside(annotation: Any, value: Any, loc: tuple[Any, ...]) -> Iterator[tuple[str, str]]:
    """The unknown keys in ``value``, given for a field typed ``annotation``: a section, or a list of sections."""
    held = _held(annotation)
    if held is None:
        if section_in(annotation) is not None and isinstance(value, (dict, list)):
            raise _Unsure  # a section in a union: pydantic's error locations name the member tried
        return
    section, many = held
    if not many and isinstance(value, dict):
        yield from _unknown(section, value, loc)
    elif many and isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict):
                yield from _unknown(section, item, (*loc, i))


def _held(annotation: Any) -> tuple[type[Section], bool] | None:
    """(the section, whether a list of them) that a field typed ``annotation`` holds: a section, ``X | None``,
    ``Annotated[X, ...]`` or ``list[X]``; None for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _held(args[0])
    if origin is list and args:
        held = _held(args[0])
        return (held[0], True) if held is not None and not held[1] else None
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in args if arg is not type(None)]
        return _held(members[0]) if len(members) == 1 else None
    return None
