"""The built-in hooks (``base.py`` says what a hook is). Importing this package registers them, in order."""

from bigbatch.engine.hooks import (  # noqa: F401 - imported to register
    batch_control,
    checkpointing,
    console,
    evaluation,
    faults,
    freeze_layers,
    freeze_norm,
    input_pipeline,
    jsonl,
    memory,
    noise_scale,
    phase_timing,
    tensorboard,
    training_log,
    update_sizes,
)
from bigbatch.engine.hooks.base import Hook, Hooks, build_hooks

__all__ = ["Hook", "Hooks", "build_hooks"]
