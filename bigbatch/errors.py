"""The exceptions the CLI turns into one line: :class:`UserError`, a mistake a user can make (config, files, data),
printed as ``error: ...`` on stderr with exit code 2, without a traceback; :class:`TrainingStopped`, a run that
cannot go on (exit code 1). Everything else is a bug and keeps its traceback. Nothing here imports torch, so that the
CLI answers ``--help`` and a config mistake before torch loads."""


class UserError(Exception):
    """A mistake in the user's input: the message names the key, file or line and what is expected."""


class TrainingStopped(Exception):
    """Training cannot go on (the CLI prints the message and exits with code 1): ``engine/step.py``'s non-finite
    gradients and out-of-memory stops, and a checkpoint that cannot be written (``engine/state.py``'s
    ``CheckpointWriteFailed``: a full disk)."""
