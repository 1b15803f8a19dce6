"""Checkpoints: the full training state, written atomically, loaded without running code.

A checkpoint is a plain dict that ``torch.load(path, weights_only=True)`` reads; its layout is the training
state's (``engine/state.py``, where it is written down). This module reads and checks such files, gathers every
rank's random generators' states to rank 0 and restores each rank's own, and writes them off the training thread: a
training run serializes its state in memory and hands the bytes to a :class:`BackgroundWriter`, so that the disk's
time is not the training's; the writes themselves are ``floor/files.py``'s (atomic, a hard link for a second name).
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
import torch.distributed as dist

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
    """This process's random generators: torch's CPU one, its own CUDA device's (the current device: under torchrun
    ``cuda:LOCAL_RANK``, ``floor/distributed.py``; a one-entry list, empty without CUDA), Python's and NumPy's."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": {
            "kind": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
    }


def process_group() -> tuple[int, int]:
    """(rank, world size) of the process group this process is in; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gathered_rng_states() -> list[dict[str, Any]] | None:
    """Every rank's :func:`rng_state`, in rank order, on rank 0 (None on the other ranks); ``[rng_state()]`` without a
    process group. A collective under torchrun: every rank calls it (``TrainingState.save``)."""
    rank, world = process_group()
    own = rng_state()
    if world == 1:
        return [own]
    states: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(own, states, dst=0)
    return states


def rng_part(states: list[dict[str, Any]]) -> dict[str, Any]:
    """A checkpoint's ``rng``: rank 0's states at the top (the layout every bigbatch reads: an older one resumes rank 0
    from it, as it always did) and every rank's, in rank order, under ``ranks`` (rank 0's entry is the same objects:
    ``torch.save`` writes them once)."""
    return {**states[0], "ranks": states}


def restore_rng_state(state: dict[str, Any], own_device: bool = True) -> None:
    """Set this process's generators to ``state`` (one rank's). ``own_device``: its ``cuda`` is this process's own
    device's state (what :func:`rng_state` writes); False: every visible device's, in device order (the layout of
    checkpoints written before ``ranks``, where the process that saved was rank 0)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        if own_device:
            torch.cuda.set_rng_state(state["cuda"][0])
        else:
            torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )


def derive_rng_state(seed: int, rank: int, step: int) -> None:
    """Seed this process's generators (torch CPU and CUDA, NumPy, Python) afresh from ``(seed, rank, step)``, where a
    checkpoint holds no state of this rank's (a resume on another world size; an older checkpoint's ranks >= 1).
    NumPy's ``SeedSequence`` hashes the three into independent streams (its documented way to seed parallel
    generators), so every rank of the resumed run draws its own, and the same again when the run is resumed the same
    way. Nothing else depends on them: data order and augmentation are keyed by sample (``data/pipeline/order.py``)."""
    words = np.random.SeedSequence([seed, rank, step]).generate_state(4, np.uint32)
    torch.manual_seed(int(words[0]) << 32 | int(words[1]))  # every CUDA device's too
    np.random.seed(words)
    random.seed(int.from_bytes(words.tobytes(), "little"))


def restore_rng(saved: dict[str, Any], seed: int, step: int) -> str:
    """Resume this process's generators from a checkpoint's ``rng`` (:func:`rng_part`), by this process's rank: its
    own entry where the checkpoint was written by as many ranks as run now; else (another world size,
    ``engine/relaunch.py``) fresh states from ``(seed, rank, step)`` (:func:`derive_rng_state`) on every rank. A
    checkpoint written before ``ranks`` holds rank 0's states alone (each rank then ran with the same seed): rank 0
    restores them as it always did, the other ranks derive theirs. Returns how: ``"restored"`` or ``"derived"``."""
    rank, world = process_group()
    ranks = saved.get("ranks")
    if ranks is None:  # an older checkpoint: rank 0's states, its cuda every device's
        if rank == 0:
            restore_rng_state(saved, own_device=False)
            return "restored"
    elif len(ranks) == world:
        restore_rng_state(ranks[rank])
        return "restored"
    derive_rng_state(seed, rank, step)
    return "derived"


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
        raise UserError(f"checkpoint: {path} " + ("is not a regular file; not read" if path.exists() else
                                                  "does not exist"))
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
    (``files.load_tensors``: ``torch.load(weights_only=True, mmap=True)``); None where the checkpoint has no such
    part. A file that is no checkpoint is the ``UserError`` of :func:`load`."""
    state = load_tensors(Path(path), "checkpoint", mmap=True)
    return state.get(key) if isinstance(state, dict) else None


_PART_TYPES = {"format": int, "step": int, "skipped": int, "model": dict, "optimizer": dict, "scaler": dict,
               "data": dict, "rng": dict, "best": dict, "config": dict}
_RNG_KEYS = ("torch", "cuda", "python", "numpy")
_PART_KEYS = {"data": ("step",), "rng": _RNG_KEYS,
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
    if key == "rng" and "ranks" in value:
        ranks = value["ranks"]
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
            raise UserError(f"checkpoint: {path}: 'rng' has 'ranks' of type {type(ranks).__name__}, not a list of "
                            f"dicts, one a rank")
        for index, entry in enumerate(ranks):
            lacking = [k for k in _RNG_KEYS if k not in entry]
            if lacking:
                raise UserError(f"checkpoint: {path}: 'rng' rank {index} lacks {', '.join(repr(k) for k in lacking)}")
    if key == "data" and not isinstance(value["step"], int):
        raise UserError(f"checkpoint: {path}: 'data' has a step of type {type(value['step']).__name__}")
