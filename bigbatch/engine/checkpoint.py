"""Checkpoints: the full training state, written atomically, loaded without running code.

A checkpoint is a plain dict that ``torch.load(path, weights_only=True)`` reads; its layout is the training
state's (``engine/state.py``, where it is written down). This module reads and checks such files, gathers and
restores the random generators' states, and writes them off the training thread: a training run serializes its
state in memory and hands the bytes to a :class:`BackgroundWriter`, so that the disk's time is not the training's;
the writes themselves are ``floor/files.py``'s (atomic, a hard link for a second name).
"""

from __future__ import annotations

import io
import queue
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigbatch.errors import UserError
from bigbatch.floor.files import load_tensors

FORMAT = 1
"""The checkpoint layout's version. It changes only when a reader of the previous format would misread a new file;
an added optional part does not change it (``hooks``: older checkpoints lack it and resume with fresh hooks, an older
bigbatch ignores it)."""


def serialized(obj: Any) -> memoryview:
    """``torch.save`` of ``obj`` into memory: the bytes a checkpoint file holds, taken now."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer()


class BackgroundWriter:
    """Runs checkpoint writes on a thread of its own, one at a time and in the order given, so that training goes on
    while the bytes reach the disk (on this project's CPU machine a 90 MB checkpoint took 0.3-0.45 s to write inside
    a run, where the disk was busy, against 0.05 s to serialize; docs/benchmarks.md).

    ``submit(job)`` queues a write (waiting while ``pending`` are queued: at most that many serialized checkpoints
    are held in memory) and first raises the error of an earlier one; after an error the queued writes are skipped,
    so a failed ``best.pt`` is not followed by a ``last.pt`` linked to it. ``wait()`` returns once every queued write
    is done, raising the first error, and ends the thread (the next ``submit`` starts another). A write interrupted
    by the process's end leaves its temporary file and the previous checkpoint whole (``atomic_write``)."""

    def __init__(self, pending: int = 2) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=pending)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="bigbatch-checkpoints", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def wait(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)  # the thread's last job: it ends once the writes before it are done
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                if self._error is None:
                    job()
            except BaseException as e:  # noqa: BLE001 - handed to the training thread by submit or wait
                self._error = e


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": {
            "kind": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )


RESUME_KEYS = ("format", "step", "model", "optimizer", "scaler", "skipped", "rng", "data", "best", "config")
"""What a checkpoint must hold to resume a run (``ema`` too when the run has a weight EMA; ``hooks`` when it has
them, else the hooks start fresh)."""
EVAL_KEYS = ("step", "model", "config")
"""What a checkpoint must hold to be evaluated."""


def load(path: str | Path, needs: tuple[str, ...] = ("model",)) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True`` (an untrusted file cannot run code) and check its layout: a
    dict with each key of ``needs``, of a format this version reads. Anything else is a ``UserError``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint: {path} does not exist")
    state = load_tensors(path, "checkpoint")
    if not isinstance(state, dict):
        raise UserError(f"checkpoint: {path} is not a bigbatch checkpoint (it holds a {type(state).__name__}, "
                        f"not a dict)")
    version = state.get("format", FORMAT)
    if not isinstance(version, int) or isinstance(version, bool):
        raise UserError(f"checkpoint: {path} has an unknown format {version!r}")
    if version > FORMAT:
        raise UserError(f"checkpoint: {path} is of format {version}, newer than this bigbatch reads (format "
                        f"{FORMAT}); upgrade bigbatch to read it")
    missing = [key for key in needs if key not in state]
    if missing:
        has = ", ".join(repr(k) for k in list(state)[:6]) + (", ..." if len(state) > 6 else "")
        raise UserError(f"checkpoint: {path} lacks {', '.join(repr(k) for k in missing)} (it holds {has or 'nothing'});"
                        f" a bigbatch checkpoint holds {', '.join(RESUME_KEYS)}")
    for key in needs:
        _check_part(path, key, state[key])
    return state


def read_part(path: str | Path, key: str) -> Any:
    """The part ``key`` of the checkpoint at ``path`` (e.g. its small ``data``), its tensors left in the file
    (``torch.load(mmap=True)``); None where the checkpoint has no such part. A file that is no checkpoint is the
    ``UserError`` of :func:`load`."""
    state = load_tensors(Path(path), "checkpoint", mmap=True)
    return state.get(key) if isinstance(state, dict) else None


_PART_TYPES = {"format": int, "step": int, "skipped": int, "model": dict, "optimizer": dict, "scaler": dict,
               "data": dict, "rng": dict, "best": dict, "config": dict}
_PART_KEYS = {"data": ("step",), "rng": ("torch", "cuda", "python", "numpy"),
              "best": ("metric", "mode", "value", "step")}


def _check_part(path: Path, key: str, value: Any) -> None:
    """One part of a checkpoint has the type (and, for the small dicts, the keys) that resuming reads."""
    kind = _PART_TYPES.get(key)
    if kind is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        article = "an" if kind is int else "a"
        raise UserError(f"checkpoint: {path}: '{key}' is a {type(value).__name__}, not {article} {kind.__name__}")
    lacking = [k for k in _PART_KEYS.get(key, ()) if k not in value]
    if lacking:
        raise UserError(f"checkpoint: {path}: '{key}' lacks {', '.join(repr(k) for k in lacking)}")
    if key == "data" and not isinstance(value["step"], int):
        raise UserError(f"checkpoint: {path}: 'data' has a step of type {type(value['step']).__name__}")
