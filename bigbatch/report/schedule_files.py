"""``bigbatch schedule --csv`` and ``--png``: the learning rate of every step as a CSV file and as a plot.

Each file carries a mark of bigbatch's own (the CSV's header line, the PNG's ``Software`` text), by which the next
``schedule`` knows it may replace the file: anything else at that path is the user's and is never overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bigbatch.outputs import starts_with

CSV_HEADER = b"step,lr\n"
"""The first line of a CSV ``schedule --csv`` wrote."""
SCHEDULE_PNG_MARK = b"bigbatch schedule"
"""The ``Software`` text of a PNG ``schedule --png`` wrote: such a file may be replaced by the next one."""


def is_schedule_csv(path: Path) -> bool:
    """Whether ``path`` is a CSV ``schedule --csv`` wrote (it starts with :data:`CSV_HEADER`)."""
    return starts_with(CSV_HEADER, len(CSV_HEADER))(path)


def is_schedule_png(path: Path) -> bool:
    """Whether ``path`` is a PNG ``schedule --png`` wrote (:data:`SCHEDULE_PNG_MARK` in its first 4 KiB)."""
    return starts_with(SCHEDULE_PNG_MARK)(path)


def write_csv(path: Path, lrs: Sequence[float]) -> None:
    """Every step's learning rate, ``step,lr`` from step 0, each value as Python writes it (``repr``: exact)."""
    from bigbatch.engine.checkpoint import atomic_write

    rows = "".join(f"{step},{lr!r}\n" for step, lr in enumerate(lrs))
    atomic_write(path, lambda f: f.write(CSV_HEADER.decode() + rows), mode="w")


def plot_png(path: Path, lrs: Sequence[float], title: str) -> None:
    """The learning rate against the optimizer step, 800 x 400 px, marked as bigbatch's own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bigbatch.engine.checkpoint import atomic_write

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(len(lrs)), lrs)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100,
                                             metadata={"Software": SCHEDULE_PNG_MARK.decode()}))
    plt.close(fig)
