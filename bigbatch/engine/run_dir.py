"""The run directory, checked and held before any work starts.

``hold_run_dir(path)`` is what ``bigbatch train`` does first (rank 0 only under torchrun):

- **Check** that the run can write there: the folder is made if absent (a bad ``--out``, such as a path under
  a file, a name too long, a read-only place or ``/proc/...``, is one ``error: --out: ...`` line, exit 2),
  and an existing folder must be empty or a run bigbatch wrote (:func:`is_bigbatch_run`: what only bigbatch
  writes there, never a file a user may have, such as a ``config.yaml`` that reads as a config): any other folder
  is refused, naming one of its files, so nothing of the user's is overwritten; in a run, the files a run rewrites
  or appends to must be regular files (not links, which would lead the write elsewhere), and the folders it writes
  in (``checkpoints/``, ``tensorboard/``) folders of its own inside it (:func:`check_run_folders`).
- **Hold** it: an exclusive lock on ``.bigbatch.lock`` inside it, an OS record lock (``fcntl.lockf``) that the
  kernel releases when the process ends, however it ends, and that forked DataLoader workers do not inherit.
  A second ``train`` or ``--resume`` on a held folder stops at once: ``--out: DIR is in use by process PID``.
  The holding process reads its lock file only through the held descriptor: closing another would release it.
- **Tidy** what an earlier run of this folder left: the temporary files of a process killed while writing a
  checkpoint or the config (``checkpoints/.last.pt.tmp-PID-TOKEN``, :func:`remove_stale_temporaries`), whatever
  their PID (a resumed run in a container has the PID of the one killed). Only files of that exact naming are
  removed, and only while the lock is held, so no other bigbatch process can be writing them.
- **Leave nothing** when the run stops before it wrote anything (a data or config error found after the folder
  was made): the lock file it made and the folders it made are removed again, so a folder of the user's is left
  as it was.

A run directory is read as a folder anyone may have handed over: its files are read only where their real path
(links and ``..`` followed) lies inside it (:func:`run_file`, :func:`kept_overrides`), and as regular files.

Which run a folder holds: ``check_resumable`` (``--resume DIR``: a folder of a run with a checkpoint, held by no
one) and ``holds_this_run`` (``--out DIR`` of a run with the same config: resumed, as ``torchrun --max-restarts``
needs; another config's: refused). A run's own folder defaults to ``runs/<name>-<date>-<time>``
(:func:`timestamped`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigbatch.config.adaptive import ADVISOR_FILE
from bigbatch.errors import UserError
from bigbatch.floor import run_files, written
from bigbatch.floor.user_files import lies_inside

if TYPE_CHECKING:
    from bigbatch.config import RunConfig

LOCK_NAME = ".bigbatch.lock"
RUN_MARK = "run"
"""The lock file's second line once a run wrote into its folder (:func:`claim`): only then does the lock file prove
the folder bigbatch's. A run killed before it wrote anything leaves a lock file holding only a PID, which proves
nothing of a ``config.yaml`` a user puts beside it later."""
_HELD: dict[tuple[int, int], int] = {}
"""The lock files this process holds, by (device, inode): their descriptors. A record lock (``fcntl.lockf``) belongs
to the process, and closing ANY descriptor of the file releases it (POSIX ``fcntl``): a lock file this process holds
is read through its held descriptor, never opened and closed again (that let a second ``train --resume`` in)."""
RUN_FILES = run_files.RUN_FILES
"""What a run writes at the top of its folder (``floor/run_files.py``; besides ``eval-*.json`` from ``bigbatch
eval``); ``model.cfg``: a Darknet run's network, kept (:func:`keep_model_files`)."""


@contextlib.contextmanager
def hold_run_dir(path: Path, key: str = "--out") -> Iterator[Path]:
    """Check, make and lock the run folder ``path`` for the duration of the ``with`` block (see the module doc).

    Mistakes are ``UserError`` naming ``key``."""
    try:
        made = _make(path, key)
    except OSError as e:  # e.g. a name too long even to look up
        raise UserError(f"{key}: cannot make {path}: {e.strerror or e}") from None
    fd, lock_made, before = None, False, set()
    try:
        _check_not_foreign(path, key)
        before = {entry.name for entry in path.iterdir()}
        fd, lock_made = _lock(path, key)
        held = os.fstat(fd)
        _HELD[held.st_dev, held.st_ino] = fd
        remove_stale_temporaries(path)
        yield path
    finally:
        try:
            # With the lock still held, so that nobody can take the lock file while it is removed.
            if lock_made and {entry.name for entry in path.iterdir()} - before == {LOCK_NAME}:
                (path / LOCK_NAME).unlink()  # the run wrote nothing: the folder is left as it was
            for folder in reversed(made):  # the folders this call made, deepest first, if still empty
                folder.rmdir()
        except OSError:
            pass  # written into, in use again, or gone: leave it
        if fd is not None:
            _HELD.pop(next((k for k, v in _HELD.items() if v == fd), None), None)
            os.close(fd)  # releases the lock


def _make(path: Path, key: str) -> list[Path]:
    """Make ``path`` (and its parents) if absent; the folders this call made, outermost first."""
    if path.is_symlink() and not path.exists():
        raise UserError(f"{key}: {path} is a link to nothing; give a new or empty folder")
    if path.exists() and not path.is_dir():
        raise UserError(f"{key}: {path} is a file, not a folder")
    if path.is_dir():
        return []
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"{key}: cannot make {path}: {blocking} is a file, not a folder")
    missing = [p for p in reversed([path, *path.parents]) if not p.exists()]
    made = []
    for folder in missing:
        try:
            folder.mkdir()
        except FileExistsError:  # made meanwhile by another process
            continue
        except OSError as e:
            for done in reversed(made):
                done.rmdir()
            raise UserError(f"{key}: cannot make {path}: {e.strerror or e}") from None
        made.append(folder)
    return made


REWRITTEN = (run_files.CONFIG, run_files.METRICS, run_files.MEMORY, run_files.UPDATES)
"""The files at the top of a run directory that a run replaces, cuts back or appends to: in a run's folder each must
be a regular file of its own, not a link (a write through it would land elsewhere) nor a FIFO or a device."""


def _check_not_foreign(path: Path, key: str) -> None:
    """An existing folder is written into only when it is empty (but for a lock file a run left) or is a run of
    bigbatch's (:func:`is_bigbatch_run`). Nothing of the user's is written beside, nor a ``config.yaml`` or
    ``metrics.jsonl`` of theirs overwritten."""
    if (path / LOCK_NAME).is_symlink():
        raise UserError(f"{key}: {path / LOCK_NAME} is a symbolic link, not bigbatch's lock file; choose another "
                        f"folder")
    held = sorted(entry.name for entry in path.iterdir() if entry.name != LOCK_NAME)
    if not held or held == [ADVISOR_FILE] and written.is_ours(path / ADVISOR_FILE):
        return  # empty, or prepared by ``plan --devices --out DIR`` for the run (``batch.max: advisor`` reads it)
    if not is_bigbatch_run(path):
        taken = [name for name in RUN_FILES if name in held]
        what = (f"already holds {path / taken[0]}, which the run would overwrite" if taken else
                f"holds {path / held[0]}" + (f" and {len(held) - 1} more" if len(held) > 1 else ""))
        raise UserError(f"{key}: {path} is not a bigbatch run directory and {what}; choose a new or empty folder")
    for name in REWRITTEN:
        _refuse_other_than_regular(path / name, key)
    check_run_folders(path, key)


WRITTEN_IN = (run_files.CHECKPOINTS, run_files.TENSORBOARD)
"""The folders of a run directory a run writes in: each must be a folder of its own inside it, not a link (the
checkpoints would replace a ``best.pt`` wherever it leads, the start's tidy remove files there), as
:func:`run_file` reads only inside the folder."""


def check_run_folders(run_dir: Path, key: str = "--out") -> None:
    """Before a run writes in its folders (:data:`WRITTEN_IN`): each absent, or a folder (not a link) whose real path
    lies inside ``run_dir``; else one ``UserError`` naming ``key`` and the entry, nothing written there."""
    for name in WRITTEN_IN:
        entry = run_dir / name
        if not os.path.lexists(entry):
            continue
        if entry.is_symlink() or not entry.is_dir() or not lies_inside(run_dir, entry):
            kind = ("a symbolic link" if entry.is_symlink() else "not a folder" if not entry.is_dir()
                    else f"outside {run_dir}")
            raise UserError(f"{key}: {entry} is {kind}, not a folder of the run's own; a run writes only inside its "
                            f"folder: nothing written there (move it away or choose another folder)")


def is_bigbatch_run(path: Path) -> bool:
    """Whether bigbatch wrote the folder ``path``, proven by what only bigbatch writes there, never by a file a user
    may have of their own (a ``config.yaml`` that reads as a config, a ``metrics.jsonl``, a ``checkpoints/``
    folder): its lock file (``.bigbatch.lock``, a regular file holding a PID and :data:`RUN_MARK`: made by every
    ``train`` since the run directory was locked, marked before the run's first write there, :func:`claim`, and
    kept once the run wrote anything), or, for a run written before that, a
    ``checkpoints/last.pt`` inside it that is a bigbatch checkpoint (a dict of every part a resume needs,
    ``checkpoint.RESUME_KEYS``, its tensors left in the file)."""
    return _holds_lock_file(path) or _holds_checkpoint(path)


def _holds_lock_file(path: Path) -> bool:
    """A lock file of a run that wrote into the folder: a regular file holding a PID and :data:`RUN_MARK`."""
    with _lock_file(path / LOCK_NAME) as fd:
        return fd is not None and stat.S_ISREG(os.fstat(fd).st_mode) and _lock_text(fd)[1]


def claim(path: Path) -> None:
    """Mark the lock file of the run folder ``path``, held by this process, as a run's (:data:`RUN_MARK`), before
    the run's first write there; nothing where this process does not hold it (a rank other than 0, ``train`` called
    without ``hold_run_dir``)."""
    with _lock_file(path / LOCK_NAME) as fd:
        if fd is None or not _is_held(fd):
            return
        _write_lock(fd, marked=True)


@contextlib.contextmanager
def _lock_file(lock: Path) -> Iterator[int | None]:
    """A descriptor of the lock file ``lock`` to read (not through a link): the held one where this process holds
    it (see :data:`_HELD`), else one opened for the ``with`` block; None where there is none."""
    try:
        named = os.stat(lock, follow_symlinks=False)
    except OSError:
        yield None
        return
    held = _HELD.get((named.st_dev, named.st_ino))
    if held is not None:
        yield held
        return
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _is_held(fd: int) -> bool:
    return fd in _HELD.values()


def _holds_checkpoint(path: Path) -> bool:
    last = last_checkpoint(path)
    if last.is_symlink() or not last.is_file() or not lies_inside(path, last):
        return False
    from bigbatch.engine.checkpoint import RESUME_KEYS
    from bigbatch.floor.files import load_tensors

    try:
        state = load_tensors(last, "checkpoint", mmap=True)
    except UserError:
        return False
    return (isinstance(state, dict) and all(key in state for key in RESUME_KEYS)
            and isinstance(state["config"], dict) and type(state["step"]) is int)


def run_file(run_dir: Path, name: str, key: str) -> Path | None:
    """The file ``name`` of the run directory ``run_dir`` to read: its real path, once it is known to lie inside the
    folder and to be a regular file; None where there is none. A file leading outside (a link to a file of someone
    else's) or that is not a regular file (a FIFO, a device) is one ``UserError`` naming ``key``, never read."""
    path = run_dir / name
    if not os.path.lexists(path):
        return None
    if not lies_inside(run_dir, path):
        raise UserError(f"{key}: {path} leads outside {run_dir} (a link?); a run directory's files are read only "
                        f"from inside it: not read")
    if not path.is_file():
        raise UserError(f"{key}: {path} is not a regular file: not read")
    return Path(os.path.realpath(path))


def check_run_files(run_dir: Path, key: str = "--out") -> None:
    """:func:`check_run_file` for each file a run rewrites (:data:`REWRITTEN`), and :func:`check_run_folders`, before
    the first is written."""
    for name in REWRITTEN:
        check_run_file(run_dir, name, key)
    check_run_folders(run_dir, key)


def check_run_file(run_dir: Path, name: str, key: str = "--out") -> None:
    """Before a run replaces, cuts back or appends to ``run_dir/name``: nothing is there, or a regular file (not a
    link) of a folder bigbatch wrote (:func:`is_bigbatch_run`); else one ``UserError`` naming ``key``, the file
    untouched. ``hold_run_dir`` checks this before any work; the writers check again (``train`` may be called
    without it)."""
    path = run_dir / name
    if not os.path.lexists(path):
        return
    _refuse_other_than_regular(path, key)
    if not is_bigbatch_run(run_dir):
        raise UserError(f"{key}: {run_dir} is not a bigbatch run directory and already holds {path}, which the run "
                        f"would overwrite; choose a new or empty folder")


def _lock(path: Path, key: str) -> tuple[int, bool]:
    """Take the run's lock: (its descriptor, whether this call made the lock file). The lock file holds the
    holder's PID for the message a second process prints."""
    lock = path / LOCK_NAME
    with _lock_file(lock) as fd:
        if fd is not None and _is_held(fd):  # a second hold in this process: its close would release the first
            raise UserError(f"{key}: {path} is in use by process {os.getpid()} (this one)")
    for _ in range(10):
        made = not lock.exists()
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise UserError(f"{key}: cannot write in {path}: {e.strerror or e}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise UserError(f"{key}: cannot lock {lock}: {e.strerror or e}") from None
            holder = _read_pid(lock)
            who = f"process {holder}" if holder is not None else "another process"
            raise UserError(f"{key}: {path} is in use by {who}") from None
        if _same_file(fd, lock):
            break
        os.close(fd)  # the file was removed (by a run that wrote nothing) between our open and our lock: again
    else:
        raise UserError(f"{key}: cannot lock {lock}: it keeps being replaced")
    try:
        _write_lock(fd, marked=not made and _lock_text(fd)[1])  # a run's folder stays one
    except OSError as e:
        os.close(fd)
        raise UserError(f"{key}: cannot write in {path}: {e.strerror or e}") from None
    return fd, made


def _write_lock(fd: int, *, marked: bool) -> None:
    """The lock file's text: this process's PID, and :data:`RUN_MARK` on a second line once the run wrote."""
    text = f"{os.getpid()}\n" + (f"{RUN_MARK}\n" if marked else "")
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    os.fsync(fd)


def holder(path: Path) -> str | None:
    """Who holds the run folder ``path`` ("process PID", or "another process" when its lock file names none), or
    None when nobody does. Only looks: the lock is taken and released at once, and nothing is made."""
    with _lock_file(path / LOCK_NAME) as fd:
        if fd is not None and _is_held(fd):
            return f"process {os.getpid()}"
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file (or not one of ours): nobody holds the folder through it
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            return None
        pid = _read_pid(path / LOCK_NAME)
        return f"process {pid}" if pid is not None else "another process"
    finally:
        os.close(fd)
    return None


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file named ``path`` (not a removed or replaced one)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _read_pid(lock: Path) -> int | None:
    """The PID in the lock file ``lock`` (read as a regular file, not through a link, at most a few bytes)."""
    with _lock_file(lock) as fd:
        return _lock_text(fd)[0] if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode) else None


def _refuse_other_than_regular(path: Path, key: str) -> None:
    """``UserError`` naming ``key`` where ``path`` is a link or something other than a regular file."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_file()):
        kind = "a symbolic link" if path.is_symlink() else "not a regular file"
        raise UserError(f"{key}: {path} is {kind}, not a file bigbatch wrote; not overwritten (choose another "
                        f"folder)")


def _lock_text(fd: int) -> tuple[int | None, bool]:
    """What a lock file's descriptor holds, as :func:`_write_lock` writes it: (the PID, or None where the text is
    not a lock file's; whether :data:`RUN_MARK` follows it)."""
    try:
        lines = os.pread(fd, 64, 0).decode("ascii", errors="replace").split("\n")
    except OSError:
        return None, False
    pid, rest = lines[0], [line for line in lines[1:] if line]
    if not (pid.isdigit() and len(pid) < 20) or rest not in ([], [RUN_MARK]):
        return None, False
    return int(pid), rest == [RUN_MARK]


TIDIED = {".": (run_files.CONFIG, run_files.MODEL_CFG), run_files.CHECKPOINTS: (run_files.LAST, run_files.BEST)}
"""The files, by folder of the run, whose ``atomic_write`` temporaries a start tidies: those only a run writes, and
only with the run's lock held (``eval`` writes its ``eval-*.json`` without it: a temporary of one may be in flight)."""


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Remove the temporary files a process killed mid-write left in the run folder ``run_dir``
    (``checkpoints/.last.pt.tmp-PID-TOKEN``, ``.config.yaml.tmp-PID-TOKEN``; ``.last.pt.tmp-PID`` of earlier versions):
    of the files :data:`TIDIED` names only, regular files, whatever their PID (in a container every run is PID 1).

    Called with the run's lock held, so no other bigbatch process writes these; a write this process has in flight is
    spared (``files.remove_temporary``). A ``checkpoints`` that is a link is not followed. Returns what was removed."""
    from bigbatch.floor import files

    removed = []
    for sub, targets in TIDIED.items():
        folder = run_dir / sub if sub != "." else run_dir
        try:  # the run folder as named; its checkpoints/ never through a link
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | (os.O_NOFOLLOW if sub != "." else 0) | os.O_CLOEXEC)
        except OSError:
            continue  # none yet, or a link (refused before any work: check_run_folders)
        try:
            for name in sorted(os.listdir(fd)):
                if files.temporary_target(name) in targets and files.remove_temporary(fd, name):
                    removed.append(folder / name)
        finally:
            os.close(fd)
    return removed


def keep_model_files(run_dir: Path, cfg: RunConfig, model: Any) -> None:
    """Write the model's own files into the run directory (``MODELS``' ``keeps``: a Darknet run's ``model.cfg``, for
    the classes it trains), each under its config key's name, unless the run was started from that very copy (a
    resumed run). A file of that name is replaced only if it is already the text to write, or bigbatch wrote it and
    nothing changed it since (``floor/written.py``'s record): a ``model.cfg`` edited by hand is the user's, whatever
    its first line says."""
    from bigbatch.config import flatten
    from bigbatch.floor import written
    from bigbatch.floor.files import atomic_write
    from bigbatch.floor.user_files import read_regular

    keeps = cfg.model.part().info.get("keeps") or {}
    given = flatten(cfg.model_dump(mode="json"))
    for key, text_of in keeps.items():
        path = run_dir / key
        if given.get(key) and Path(given[key]).resolve() == path.resolve():
            continue  # resumed from its own copy: kept as it is
        text = text_of(model)
        if path.exists() or path.is_symlink():
            wanted, same = text.encode(), False
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    same = bytes(read_regular(path, len(wanted), "a kept model file")) == wanted
            if not (same or written.is_ours(path)):
                raise UserError(f"--out: {path} is not a file bigbatch kept as it is now (edited since, or another's); "
                                "not overwritten (move it away, or choose another --out)")
        atomic_write(path, lambda f, text=text: f.write(text), mode="w", record=True)


def kept_overrides(run_dir: Path, config: dict[str, Any]) -> list[str]:
    """``--set`` overrides that point a run's config (``config``, as saved) at the files the run directory kept
    (:func:`keep_model_files`), for ``eval``, ``--resume`` and ``export`` of a run whose files were moved since. A
    kept file that leads outside the run directory (a link to a file elsewhere) is one ``UserError`` naming its
    key, never read (:func:`run_file`)."""
    from bigbatch.registry import MODELS

    model = config.get("model") if isinstance(config, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    if not isinstance(name, str) or name not in MODELS.names():
        return []  # the config's own check says what is wrong
    keeps = MODELS.get(name).info.get("keeps") or {}
    kept = {key: run_file(run_dir, key, key) for key in keeps if os.path.lexists(run_dir / key)}
    # the path as a JSON string, which YAML reads back whatever it holds (": ", "#")
    return [f"{key}={json.dumps(str(path))}" for key, path in kept.items() if path is not None]


def kept_run_files(run_dir: Path) -> list[str]:
    """:func:`kept_overrides` for the run's own ``config.yaml`` (``train --resume DIR``)."""
    from bigbatch.config import read_yaml

    config = run_file(run_dir, run_files.CONFIG, "--resume")
    if config is None:
        return []  # loading the config says what is wrong
    try:
        saved = read_yaml(config)
    except UserError:
        return []  # loading the config says what is wrong with it
    return kept_overrides(run_dir, saved)


def set_aside_unrecorded_best(run_dir: Path, step: int, best_step: int | None) -> str | None:
    """Resuming at ``step`` from a checkpoint whose best evaluation was at ``best_step`` (None: none yet): a
    ``best.pt`` of another step was written by the process that stopped, after its last checkpoint, from steps this
    run runs again. The run's records, cut back to ``step``, no longer hold its evaluation, and the resumed steps may
    not repeat it (a changed LR, another world size, a GPU's kernels). It is renamed
    ``best-stepN-before-resume.pt`` (kept: bigbatch wrote it, and it may be the best weights you have), so ``best.pt``
    holds only what this run's records show: the next evaluation better than the best recorded writes it again.
    Returns the line that says so, or None where there is nothing to set aside (no ``best.pt``, a link, one that is
    no checkpoint, or the one of ``best_step``)."""
    from bigbatch.engine import checkpoint

    best = run_dir / run_files.CHECKPOINTS / run_files.BEST
    if best.is_symlink() or not best.is_file():
        return None
    try:
        saved = checkpoint.read_part(best, "step")
    except (UserError, OSError):
        return None
    if not isinstance(saved, int) or isinstance(saved, bool) or saved == best_step:
        return None
    target, n = best.with_name(f"best-step{saved}-before-resume.pt"), 1
    while target.exists() or target.is_symlink():
        n += 1
        target = best.with_name(f"best-step{saved}-before-resume-{n}.pt")
    os.rename(best, target)
    recorded = f"the best it records is step {best_step}'s" if best_step is not None else "it records no evaluation"
    return (f"note: {best} held step {saved}, which the checkpoint resumed from (step {step}) does not record "
            f"({recorded}): kept as {target.name}; best.pt follows this run's evaluations from here on")


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory of a checkpoint in its ``checkpoints/`` folder, else None."""
    return checkpoint.parent.parent if checkpoint.parent.name == run_files.CHECKPOINTS else None


def interrupted_message(stop: Any, run_dir: Path) -> str:
    """What an interrupted ``train`` says (``stop``: ``engine.step.Interrupted``): the steps done, the checkpoint
    kept and the steps a resume runs again, and the command that resumes."""
    import shlex

    done = f"interrupted after step {stop.done} of {stop.steps}"
    if stop.checkpoint is None:
        return (f"{done}; no checkpoint had been written yet, so nothing is kept: the same command starts the run "
                f"again")
    lost = stop.done - stop.checkpoint_step
    again = f"the {lost} step{'s' if lost != 1 else ''} after it will run again" if lost else "no step is lost"
    return (f"{done}; kept: {stop.checkpoint} at step {stop.checkpoint_step} ({again}); resume with:\n"
            f"  bigbatch train --resume {shlex.quote(str(run_dir))}")


RENAMING_KEYS = ("model.name", "model.cfg", "data.name", "data.path")
"""``--set`` keys that make a run of another model or data than its recipe's: its default folder is named after them."""


def run_name(cfg: RunConfig, overrides: list[str]) -> str:
    """The name of a run's default folder: the recipe's (``digits``); ``<model>-<data>`` when ``--set`` changed the
    recipe's model or data (``resnet18-photos``: the model's name, or its cfg's, and the data folder's name, or the
    format's), so that a folder run borrowing the digits recipe is not named ``digits``."""
    keys = {text.partition("=")[0].strip() for text in overrides}
    if not keys & set(RENAMING_KEYS):
        return cfg.name
    model = Path(cfg.model.cfg).stem if getattr(cfg.model, "cfg", None) else cfg.model.name.rpartition("/")[2]
    data = Path(cfg.data.path).resolve().name if cfg.data.path else cfg.data.name
    name = re.sub(r"[^\w.+-]+", "_", f"{model}-{data}").strip("._") or cfg.name
    return name[:100]


def timestamped(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``: the folder of a run (or a profile) not given one, by the local time."""
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_checkpoint(run_dir: Path, key: str) -> Path | None:
    """The run's ``checkpoints/last.pt`` to read (:func:`run_file`: inside the folder, a regular file), or None where
    there is none; a link leading outside is one ``UserError`` naming ``key``."""
    return run_file(run_dir, str(last_checkpoint(run_dir).relative_to(run_dir)), key)


def last_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a run continues from and ``eval`` and ``export`` read by default: ``checkpoints/last.pt``."""
    return run_files.last_checkpoint(run_dir)


def check_resumable(run_dir: Path) -> None:
    """``--resume DIR``: a folder, not held by a run still going (looked at on rank 0 only), with a last checkpoint
    (which, in a folder not otherwise proven bigbatch's, must be a bigbatch checkpoint) and a ``config.yaml`` inside
    it; else one ``UserError`` saying which."""
    from bigbatch.floor import distributed

    if not run_dir.is_dir():
        raise UserError(f"--resume: {run_dir} is not a folder (expected the run directory of bigbatch train)")
    held_by = holder(run_dir) if distributed.rank_from_env() == 0 else None
    if held_by is not None:  # a run still going, perhaps before its first checkpoint
        raise UserError(f"--resume: {run_dir} is in use by {held_by}")
    check_run_folders(run_dir, "--resume")  # a linked checkpoints/: a folder the run would write in, read or not
    if run_checkpoint(run_dir, "--resume") is None:
        raise UserError(f"--resume: {run_dir} holds no checkpoints/last.pt")
    run_file(run_dir, run_files.CONFIG, "--resume")  # read as the run's config: inside the folder, a regular file
    for name in REWRITTEN:  # hold_run_dir checks these too, naming --out
        _refuse_other_than_regular(run_dir / name, "--resume")
    if not is_bigbatch_run(run_dir):  # what the checkpoint lacks, rather than hold_run_dir's "not a run directory"
        from bigbatch.engine import checkpoint

        checkpoint.load(last_checkpoint(run_dir), needs=checkpoint.RESUME_KEYS)


def holds_this_run(out_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``out_dir`` already holds a checkpoint of this very run, which ``train`` then resumes (a worker
    restarted by ``torchrun --max-restarts`` runs the same command again). A checkpoint of another config is
    refused rather than overwritten. ``subdivisions`` may differ: the layout does not change the training."""
    if run_checkpoint(out_dir, "--out") is None:
        return False
    from bigbatch.config import flatten, load_config

    try:
        config = run_file(out_dir, run_files.CONFIG, "--out")
        saved = flatten(load_config(str(config)).model_dump(mode="json")) if config is not None else {}
    except UserError:
        saved = {}
    wanted = flatten(cfg.model_dump(mode="json"))
    kept = {key.split("=", 1)[0] for key in kept_run_files(out_dir)}  # a resumed run's config names its kept copies
    differ = [k for k in sorted(saved.keys() | wanted.keys()) if k != "subdivisions" and saved.get(k) != wanted.get(k)
              and not (k in kept and saved.get(k) == str((out_dir / k).resolve()))]
    if differ:
        first = differ[0]
        raise UserError(f"--out: {out_dir} already holds a run of another config ({first}: {saved.get(first)!r} "
                        f"there, {wanted.get(first)!r} here); continue it with --resume {out_dir}, "
                        f"or choose another --out")
    return True  # the run says "resumed from step N of M" first
