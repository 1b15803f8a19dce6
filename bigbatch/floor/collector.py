"""Python's cyclic garbage collector through a command's start-up.

CPython collects its oldest generation (every object the collector tracks) whenever the objects that survived have
grown by a quarter since the last such collection (CPython 3.11, ``Modules/gcmodule.c``: ``long_lived_pending >
long_lived_total / 4``, looked at every 10th collection of the middle generation, itself every 10th of the youngest,
itself every 700 net allocations). Importing torch, torchvision and timm makes about 380,000 tracked objects that all
stay alive, so the imports alone set off six full collections, each scanning everything imported so far and freeing
almost nothing (0-550 objects): 0.6 s of ``import timm`` on the project's 2-core machine, and 0.4-0.6 s of every
command that loads torch and torchvision (``docs/benchmarks.md``, "The start-up's garbage collections").

- :func:`hold`, the command's entry point, before anything else is imported: the youngest generation is collected
  every 100,000 net allocations instead of every 700 (the older ones follow it), so that a start-up sets off no full
  collection. Collections still run, about 1/140 as often: a command that never reaches :func:`settle` still frees its
  cyclic garbage, only later.
- :func:`settle`, the trainer, before its first step: every object alive then goes to the permanent generation
  (``gc.freeze``), which later collections skip, and the thresholds go back to what they were. The run's collections
  then scan only what the run itself makes, and the collector of a DataLoader worker forked after it no longer writes
  to the frozen objects (fewer of the parent's pages copied: Python's ``gc.freeze`` documentation). :func:`thaw` gives
  them back to the collector (a run of several processes, whose DDP wrapper must be freed before its process group
  goes).

Only where :func:`hold` ran: a library caller's process (``train()`` from a notebook, the tests) keeps its collector as
it is, since an object frozen is never collected, even once it is garbage.
"""

from __future__ import annotations

import gc

START_UP_THRESHOLD = 100_000
"""Net allocations between two collections of the youngest generation during start-up (Python's default: 700; 2,000
from 3.13). Measured on ``bigbatch schedule digits``: 2.77 s with Python's, 2.18 s with this, 2.05 s with the collector
off (the 2-core EPYC, 2026-12-06)."""

_held: tuple[int, ...] | None = None
"""The thresholds before :func:`hold`, while held; None otherwise."""
_froze = False
"""Whether :func:`settle` froze the objects then alive (until :func:`thaw`)."""


def hold() -> None:
    """Collect ~1/140 as often until :func:`settle` (the command's start-up). Once: a second call changes nothing."""
    global _held
    if _held is not None:
        return
    _held = gc.get_threshold()
    gc.set_threshold(max(_held[0], START_UP_THRESHOLD), *_held[1:])


def settle() -> None:
    """The start-up is over: freeze what is alive (later collections skip it) and give the collector its thresholds
    back. Nothing where :func:`hold` did not run, or after the first call."""
    global _held, _froze
    if _held is None:
        return
    gc.freeze()
    gc.set_threshold(*_held)
    _held, _froze = None, True


def thaw() -> None:
    """Give what :func:`settle` froze back to the collector (``gc.unfreeze``), so that the next full collection can
    free it where a reference cycle is all that keeps it (a DDP wrapper that must go before its process group does).
    Nothing where :func:`settle` froze nothing."""
    global _froze
    if _froze:
        gc.unfreeze()
        _froze = False


def held() -> bool:
    """Whether :func:`hold` ran and :func:`settle` has not yet."""
    return _held is not None
