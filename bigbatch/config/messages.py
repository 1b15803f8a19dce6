"""Error text: a pydantic validation error becomes one line per dotted key (``data.size: input should be greater
than 0, got -1``), an unknown key lists the keys its section takes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from typing import Any, get_args

from pydantic import ValidationError

from bigbatch.config.section import Section
from bigbatch.registry import did_you_mean

_UNION_MEMBERS = {"float", "int", "str", "bool", "list", "dict", "tuple", "none"}


def _key(loc: tuple[Any, ...], kind: str = "") -> tuple[Any, ...]:
    """The config key of an error location, without pydantic's union-member tags (``literal[...]``, ``float``).
    The last part of an unknown key (``extra_forbidden``) is the user's own, kept whatever it looks like."""
    kept = loc[-1:] if kind == "extra_forbidden" else ()
    loc = loc[: len(loc) - len(kept)]
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or "-" in p or p in _UNION_MEMBERS))) + kept


def dotted(parts: tuple[Any, ...] | list[Any]) -> str:
    """A dotted key for a one-line message; quoted when it is empty or holds a line break, a control character, a
    colon (``error: KEY: ...`` is read up to the first colon) or surrounding space."""
    key = ".".join(str(p) for p in parts)
    return key if key and key.isprintable() and key == key.strip() and ":" not in key else repr(key)


def unknown_key(name: Any, keys: list[str]) -> str:
    """What is wrong with the key ``name`` of a section that takes ``keys``."""
    return f"unknown key{did_you_mean(name, keys)} (expected one of: {', '.join(keys)})"


def own_error(message: str, loc: str) -> tuple[str, str]:
    """(the dotted key, what is wrong) for the message of one of bigbatch's validators, which starts with the key it
    is about (``data.max_size: ...``); else ``loc``, where pydantic found it."""
    key, sep, rest = message.partition(": ")
    return (key, rest) if sep and " " not in key else (loc, message)


def _describe(error: dict[str, Any], section: type[Section] | None) -> tuple[str, str]:
    """(the dotted key, what is wrong with it) for one pydantic error."""
    kind = error["type"]
    loc = dotted(_key(error["loc"], kind))
    if kind == "extra_forbidden":
        if section is None:
            return loc, "unknown key"
        return loc, unknown_key(error["loc"][-1], list(section.keys()))
    if kind == "missing":
        return loc, "missing (required)"
    message = error["msg"]
    if kind == "value_error":  # our own validators start with the key they are about
        return own_error(message.removeprefix("Value error, "), loc)
    text = f"{message[0].lower() + message[1:]}, got {error['input']!r}"
    if kind == "string_type" and isinstance(error["input"], bool):  # YAML 1.1: ``path: off`` is False
        text += " (YAML reads yes, no, on and off as true or false: quote the text, as 'off')"
    elif kind == "string_type" and isinstance(error["input"], date):  # ``path: 2020-01-01`` is a date
        text += " (YAML reads 2020-01-01 as a date: quote the text, as '2020-01-01')"
    return loc, text


def section_in(annotation: Any) -> type[Section] | None:
    """The config class an annotation holds: itself, ``X | None``, ``list[X]`` or ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    return next((cls for cls in map(section_in, get_args(annotation)) if cls is not None), None)


def _section_of(loc: tuple[Any, ...], root: type[Section]) -> type[Section] | None:
    """The config class under ``root`` that holds the parent of ``loc`` (for listing the keys it accepts)."""
    cls: type[Section] | None = root
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list of sections (schedule.warmup.0)
            continue
        annotation = cls.keys().get(str(part))
        cls = section_in(annotation) if annotation is not None else None
        if cls is None:
            return None
    return cls


def describe_validation_error(error: ValidationError, root: type[Section]) -> str:
    """A pydantic error of validating ``root`` as one line: ``key: what is wrong; other.key: ...`` (the messages of
    one key joined by ``or``, as pydantic reports each member of a union)."""
    return one_line(_describe(err, _section_of(_key(err["loc"], err["type"]), root)) for err in error.errors())


def one_line(mistakes: Iterable[tuple[str, str]]) -> str:
    """(dotted key, what is wrong) pairs as one line: ``key: what is wrong; other.key: ...``, the messages of one key
    joined by ``or``."""
    by_key: dict[str, list[str]] = {}
    for key, message in mistakes:
        by_key.setdefault(key, []).append(message)
    return "; ".join(f"{key}: {' or '.join(messages)}" for key, messages in by_key.items())
