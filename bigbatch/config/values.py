"""The value types of the config and their parsers: lengths (:data:`Length`, :data:`Interval`: steps, epochs or
images), byte sizes (:data:`Size`), and the markers that tell ``bigbatch scale`` (``largebatch/rescale.py``) what a
field means when the global batch changes (:class:`InImages`, :class:`Steps`, :class:`PerStep`, :class:`UsedWhen`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field


@dataclass(frozen=True)
class InImages:
    """Marks a length (:data:`Length`, :data:`Interval`) for ``bigbatch scale``: kept constant in images."""


@dataclass(frozen=True)
class Steps:
    """Marks a whole number of optimizer steps (a count or a step index, :data:`StepCount`) for ``bigbatch scale``:
    kept constant in images, n' = n * B / B', rounded to the nearest step (``up``: rounded up, so that no image of
    the old run is lost), at least ``minimum``."""

    minimum: int = 0
    up: bool = False


POWER = "power"
"""A factor applied once per step (an EMA decay, Darknet's ``exp`` gamma): x' = x ** (B' / B)."""
COMPLEMENT = "complement"
"""The weight of each step's new value (a BatchNorm momentum): (1 - x') = (1 - x) ** (B' / B)."""
SLOPE = "slope"
"""A rate per step inside an exponent (a sigmoid's gamma): x' = x * B' / B."""


@dataclass(frozen=True)
class PerStep:
    """Marks a per-step rate for ``bigbatch scale``, which keeps its effect per image by ``rule`` (:data:`POWER`,
    :data:`COMPLEMENT`, :data:`SLOPE`); with ``on``, the rule depends on the value of the section's field ``on``
    (``rules``: (value, rule) pairs; for another value the field is no rate)."""

    rule: str | None = None
    on: str | None = None
    rules: tuple[tuple[str, str], ...] = ()

    def rule_in(self, section: BaseModel) -> str | None:
        return self.rule if self.on is None else dict(self.rules).get(getattr(section, self.on))


@dataclass(frozen=True)
class UsedWhen:
    """Marks a sub-section that matters only when the section's field ``field`` is ``value`` (a preset's own
    settings); ``bigbatch scale`` leaves it alone otherwise."""

    field: str
    value: str


StepCount = Annotated[int, Steps()]
"""A whole number of optimizer steps (constraints at the field: ``Field(0, ge=0)``)."""


_LENGTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(steps?|epochs?|images?)?\s*$")


def parse_length(value: int | float | str) -> tuple[float, str]:
    """A length: a number of optimizer steps, or ``"<number> steps|epochs|images"``; -> (number, unit)."""
    if isinstance(value, bool):
        raise ValueError("expected a length such as 500, '500 steps', '5 epochs' or '1.2e6 images'")
    if isinstance(value, (int, float)):
        number, unit = float(value), "steps"
    else:
        match = _LENGTH.match(value)
        if match is None:
            raise ValueError(f"expected a length such as 500, '500 steps', '5 epochs' or '1.2e6 images', got {value!r}")
        number, unit = float(match.group(1)), (match.group(2) or "steps")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"expected a finite length >= 0, got {value!r}")
    return number, unit.rstrip("s") + "s"


def _check_length(value: int | float | str) -> int | float | str:
    parse_length(value)
    return value


def _check_interval(value: int | float | str) -> int | float | str:
    if parse_length(value)[0] <= 0:
        raise ValueError(f"expected a length > 0, got {value!r}")
    return value


_AnyFloat = Annotated[float, Field(allow_inf_nan=True)]  # refused by the length check, with a clearer message
Length = Annotated[int | _AnyFloat | str, AfterValidator(_check_length), InImages()]
"""A length in optimizer steps (a bare number) or ``"<number> steps|epochs|images"``."""
Interval = Annotated[int | _AnyFloat | str, AfterValidator(_check_interval), InImages()]
"""A length that must be more than zero (how often something happens, a decay period)."""


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
MAX_SIZE = 2**63
"""The largest size read (8 EiB, more than any machine's memory): within a float's range, so any arithmetic on it is."""


def parse_size(value: int | str) -> int:
    """Bytes from a number of bytes or a size such as ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``; more than ``MAX_SIZE``
    (a number with more digits than a float holds, ``1e400``, included) is refused as a ``ValueError``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number: int | float = value
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ValueError(f"expected a size such as 2GiB, 512MiB or a number of bytes, got {value!r}")
        number = float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()]  # inf past a float's range
    if not number <= MAX_SIZE:
        raise ValueError(f"expected a size of at most {MAX_SIZE // 2**60} EiB, got {value!r}")
    size = int(number)
    if size <= 0:
        raise ValueError(f"expected a size > 0, got {value!r}")
    return size


def _check_size(value: int | str) -> int | str:
    parse_size(value)
    return value


def _whole_bytes(value: object) -> object:
    """A size written in exponent form (``1e9``, ``2.5e8``) reads as a float in YAML 1.2: a whole, finite number of
    bytes becomes an int; any other float is refused in the size wording, not pydantic's wrong-type wording."""
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise ValueError(f"expected a size such as 2GiB, 512MiB or a whole number of bytes, got {value!r}")
        return int(value)
    return value


Size = Annotated[int | str, BeforeValidator(_whole_bytes), AfterValidator(_check_size)]


MAX_NAME_BYTES = 200
"""The longest run name, in UTF-8 bytes: the run folder ``runs/<name>-<YYYYmmdd-HHMMSS>`` stays within the 255 bytes
of a file name."""


def _check_run_name(name: str) -> str:
    """A run's name is one plain folder name, so that ``runs/<name>-<time>`` (``engine/run_dir.py``) is a folder
    inside ``runs/``: no path separator, not ``.`` or ``..``, printable, at most :data:`MAX_NAME_BYTES` bytes."""
    if (not name or name in (".", "..") or "/" in name or "\\" in name or not name.isprintable()
            or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES):
        size = len(name.encode("utf-8", "surrogatepass"))
        shown = f"{name[:40]!r}... ({size:,} bytes)" if size > MAX_NAME_BYTES else repr(name)
        raise ValueError(f"name: expected a plain name for the run folder runs/<name>-<time> (no '/' or '\\', not "
                         f"'.' or '..', printable, at most {MAX_NAME_BYTES} bytes), got {shown}")
    return name


RunName = Annotated[str, AfterValidator(_check_run_name)]
"""The name of a run (``name``): a plain folder name (:func:`_check_run_name`)."""
