"""The run directory's format: the name of every file a run writes in it, in one place. The writers (the hooks), the
run directory's keeper (``engine/run_dir.py``), ``bigbatch eval`` and ``bigbatch report`` take the names from here.

    RUN/config.yaml               the resolved config (CONFIG)
    RUN/metrics.jsonl             every record, one JSON object a line (METRICS)
    RUN/memory.csv                the memory log (MEMORY)
    RUN/updates.csv               the largest updates per step (UPDATES)
    RUN/tensorboard/              TensorBoard's event files (TENSORBOARD)
    RUN/checkpoints/last.pt       the last checkpoint, and best.pt by eval.metric (CHECKPOINTS, LAST, BEST)
    RUN/model.cfg                 a Darknet run's cfg as it trained it (MODEL_CFG)
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
MEMORY = "memory.csv"
UPDATES = "updates.csv"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
LAST = "last.pt"
BEST = "best.pt"
MODEL_CFG = "model.cfg"

RUN_FILES = (CONFIG, METRICS, MEMORY, TENSORBOARD, CHECKPOINTS, MODEL_CFG)
"""What marks a folder as a run directory of bigbatch's (``engine/run_dir.py``)."""


def last_checkpoint(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS / LAST
