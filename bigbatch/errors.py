"""The exceptions the CLI turns into one line: :class:`UserError`, a mistake a user can make (config, files, data),
printed as ``error: ...`` on stderr with exit code 2, without a traceback; :class:`TrainingStopped`, a run that
cannot go on (exit code 1). Everything else is a bug and keeps its traceback. Nothing here imports torch, so that the
CLI answers ``--help`` and a config mistake before torch loads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class UserError(Exception):
    """A mistake in the user's input: the message names the key, file or line and what is expected."""


class TrainingStopped(Exception):
    """Training cannot go on (the CLI prints the message and exits with code 1): ``engine/step.py``'s non-finite
    gradients and out-of-memory stops, and a checkpoint that cannot be written (``engine/state.py``'s
    ``CheckpointWriteFailed``: a full disk)."""


@contextlib.contextmanager
def named_as(key: str, instead_of: str) -> Iterator[None]:
    """Inside, a :class:`UserError` that names ``instead_of`` (its message begins ``instead_of: ``) names ``key``: a
    part shared by two commands says the option of the command the user typed (``eval X.onnx`` has no ``--from``)."""
    try:
        yield
    except UserError as error:
        text = str(error)
        if not text.startswith(f"{instead_of}: "):
            raise
        raise UserError(f"{key}: {text.removeprefix(f'{instead_of}: ')}") from None
