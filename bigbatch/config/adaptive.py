"""``batch: {mode: adaptive, base: B0, max: B, grow: false}``: an AdaScale run (``largebatch/adascale.py``).

A fixed run gives ``batch`` as an integer. An adaptive run gives its shape: the recipe is written for the base batch
``base`` (its LR, warmup and decay, in steps of ``base`` images), and runs at a batch of ``max`` images (``grow:
false``) or at a batch that starts at ``base`` and doubles, up to ``max``, while the measured gradient noise scale
exceeds it (``grow: true``). Inside the config the mapping is kept as ``batch`` = the starting batch (``max`` or
``base``) plus :class:`AdaptiveBatch` (``RunConfig.adaptive``); a written config folds it back into the mapping.

``max: advisor`` takes the largest batch from ``bigbatch plan --devices --out DIR`` (``DIR/advisor.json``): the
global batch of its recommended row, the one of the shortest predicted wall time. The file is looked for beside the
config file, then in the run directory (``--out``); :func:`advisor_max` puts the number in its place when the config
is read, so the run's written config holds the number.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from bigbatch.config.section import Section
from bigbatch.errors import UserError
from bigbatch.registry import did_you_mean

ADAPTIVE_KEYS = ("mode", "base", "max", "grow")
ADVISOR = "advisor"
"""``batch.max: advisor``: the batch ``bigbatch plan --devices`` recommended."""
ADVISOR_FILE = "advisor.json"
MAX_ADVISOR_BYTES = 16 << 20
"""The most bytes an ``advisor.json`` is read to: ``plan --devices`` writes about 500 bytes a row, and its table has at
most 100 x 100 rows (about 5 MB)."""


class AdaptiveBatch(Section):
    """The base batch of the recipe, the largest batch, and whether the batch grows (see the module docstring)."""

    base: int = Field(gt=0)
    """B0: the batch the recipe (LR, schedule lengths in steps) is written for."""
    max: int = Field(gt=0)
    """The largest global batch: the batch of the whole run with ``grow: false``."""
    grow: bool = False
    """Start at ``base`` and double the batch while the measured noise scale exceeds it (up to ``max``)."""

    @property
    def start(self) -> int:
        """The global batch of the first step."""
        return self.base if self.grow else self.max


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"batch.{key}: expected a positive whole number of images, got {value!r}")
    return value


def advisor_max(data: Any, places: Sequence[Path]) -> Any:
    """The raw config with ``batch.max: advisor`` replaced by the recommended batch of the first ``advisor.json``
    found in ``places`` (the config file's folder, the run directory); ``UserError`` naming ``batch.max`` where
    there is none, or it holds no recommendation, or the recommendation is not above ``batch.base``."""
    batch = data.get("batch") if isinstance(data, dict) else None
    if not isinstance(batch, dict) or batch.get("max") != ADVISOR:
        return data
    from bigbatch.config.files import NotAConfigFile, read_config_bytes

    files = [Path(place) / ADVISOR_FILE for place in places]
    found = next((file for file in files if file.exists() or file.is_symlink()), None)
    if found is None:
        where = " or ".join(str(file) for file in files) or "advisor.json (no config file or run directory given)"
        raise UserError(f"batch.max: advisor: no {where}; bigbatch plan CONFIG --devices N,N,... --out DIR writes "
                        f"DIR/{ADVISOR_FILE}")
    try:  # only a regular file, only within the bound: a FIFO or a link to /dev/zero is refused, never read
        text = read_config_bytes(found, MAX_ADVISOR_BYTES, "an advisor file")
    except NotAConfigFile as error:
        raise UserError(f"batch.max: advisor: {error}; not read (bigbatch plan --devices --out writes one)") from None
    except OSError as error:  # unreadable, or past the bound (its message names the file)
        detail = f"cannot read {found} ({error.strerror})" if error.strerror else str(error)
        raise UserError(f"batch.max: advisor: {detail}") from None
    try:
        advice = json.loads(text)
        rows, index = advice["rows"], advice["recommended"]
        # a row's position only: Python would also read -1 (the last row) and True (row 1) as one
        in_rows = isinstance(rows, list) and type(index) is int and 0 <= index < len(rows)
        recommended = rows[index]["batch"] if in_rows else None
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        recommended = None
    if isinstance(recommended, bool) or not isinstance(recommended, int) or recommended <= 0:
        raise UserError(f"batch.max: advisor: {found} holds no recommended batch (bigbatch plan --devices --out "
                        "writes one)")
    base = batch.get("base")
    if isinstance(base, int) and not isinstance(base, bool) and recommended <= base:
        raise UserError(f"batch.max: advisor: the batch {found} recommends, {recommended}, is not above batch.base "
                        f"{base}; the adaptive batch grows from base to max")
    return {**data, "batch": {**batch, "max": recommended}}


def unfold_adaptive(data: Any) -> Any:
    """The raw top-level config with ``batch: {mode: adaptive, ...}`` turned into ``batch: START`` and
    ``adaptive: {base, max, grow}``; every mistake names its ``batch.`` key."""
    if not isinstance(data, dict):
        return data
    if "adaptive" in data:
        raise ValueError("adaptive: unknown key; an adaptive batch is written batch: {mode: adaptive, base: B0, "
                         "max: B, grow: false}")
    batch = data.get("batch")
    if not isinstance(batch, dict):
        return data
    unknown = [key for key in batch if key not in ADAPTIVE_KEYS]
    if unknown:
        near = did_you_mean(unknown[0], list(ADAPTIVE_KEYS))
        raise ValueError(f"batch.{unknown[0]}: unknown key{near} (expected one of: {', '.join(ADAPTIVE_KEYS)})")
    if batch.get("mode") != "adaptive":
        raise ValueError(f"batch.mode: expected 'adaptive' (a fixed batch is a number: batch: 256), got "
                         f"{batch.get('mode')!r}")
    for key in ("base", "max"):
        if key not in batch:
            raise ValueError(f"batch.{key}: missing (required for batch.mode: adaptive)")
    base, largest = _whole("base", batch["base"]), _whole("max", batch["max"])
    grow = batch.get("grow", False)
    if not isinstance(grow, bool):
        raise ValueError(f"batch.grow: expected true or false, got {grow!r}")
    if largest < base:
        raise ValueError(f"batch.max: {largest} is below batch.base {base}; the adaptive batch is at least the base")
    if largest == base:
        raise ValueError(f"batch.max: {largest} equals batch.base: AdaScale at scale 1 is the base recipe; give "
                         "batch: {base} instead, or a larger max")
    adaptive = AdaptiveBatch(base=base, max=largest, grow=grow)
    return {**data, "batch": adaptive.start, "adaptive": adaptive}


def fold_adaptive(dumped: dict[str, Any]) -> dict[str, Any]:
    """A dumped config with ``adaptive`` folded back into ``batch: {mode: adaptive, ...}`` (a fixed one unchanged)."""
    adaptive = dumped.pop("adaptive", None)
    if adaptive is None:
        return dumped
    folded = {"mode": "adaptive", "base": adaptive["base"], "max": adaptive["max"], "grow": adaptive["grow"]}
    return {key: (folded if key == "batch" else value) for key, value in dumped.items()}
