"""``bigbatch schedule --csv`` and ``--png``: the learning rate of every step (and the global batch, under a batch
schedule) as a CSV file and as a plot.

Each file is recorded as bigbatch's as it is written (``floor/written.py``: its path, inode, size, time and
SHA-256), by which the next ``schedule`` knows it may replace it: anything else at that path, or the file changed
since, is the user's and is never overwritten. Content proves nothing here (a CSV of the user's may start
``step,lr``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from pathlib import Path

from bigbatch.floor import written

CSV_HEADER = b"step,lr\n"
"""The first line of a CSV ``schedule --csv`` wrote."""
CSV_HEADER_BATCH = b"step,lr,batch\n"
"""The first line of one it wrote for a batch schedule."""
SCHEDULE_PNG_MARK = b"bigbatch schedule"
"""The ``Software`` text of a PNG ``schedule --png`` wrote (a label; the proof it is ours is its record)."""


def is_schedule_csv(path: Path) -> bool:
    """Whether ``path`` is a CSV ``schedule --csv`` wrote, unchanged since (``written.is_ours``; its header alone
    proves nothing)."""
    return written.is_ours(path)


def is_schedule_png(path: Path) -> bool:
    """Whether ``path`` is a PNG ``schedule --png`` wrote, unchanged since (``written.is_ours``; its ``Software``
    text alone proves nothing)."""
    return written.is_ours(path)


def write_csv(path: Path, lrs: Sequence[float], batches: Sequence[int] | None = None) -> None:
    """Every step's learning rate, ``step,lr`` from step 0, each value as Python writes it (``repr``: exact); with
    ``batches`` (a batch schedule), ``step,lr,batch``. Written a block of rows at a time: at the bound of
    ``schedule --csv`` (10^7 steps) the whole text would be about 300 MB."""
    from bigbatch.floor.files import atomic_write

    if batches is None:
        header, rows = CSV_HEADER, (f"{step},{lr!r}\n" for step, lr in enumerate(lrs))
    else:
        header = CSV_HEADER_BATCH
        rows = (f"{step},{lr!r},{batch}\n" for step, (lr, batch) in enumerate(zip(lrs, batches, strict=True)))

    def write(f) -> None:
        f.write(header.decode())
        for block in iter(lambda: list(islice(rows, _ROWS_PER_WRITE)), []):
            f.write("".join(block))

    atomic_write(path, write, mode="w", record=True)


_ROWS_PER_WRITE = 65536


def plot_png(path: Path, lrs: Sequence[float], title: str, batches: Sequence[int] | None = None) -> None:
    """The learning rate against the optimizer step, 800 x 400 px, marked as bigbatch's own; with ``batches``, the
    global batch too, on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bigbatch.floor.files import atomic_write

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(len(lrs)), lrs)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if batches is not None:
        ax.plot([], [], color="C1", drawstyle="steps-post", label="global batch")  # one legend for both axes
        ax.legend(["learning rate", "global batch"], loc="upper right")
        other = ax.twinx()
        other.plot(range(len(batches)), batches, color="C1", drawstyle="steps-post")
        other.set_ylabel("global batch (images)")
        other.set_ylim(bottom=0)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100,
                                             metadata={"Software": SCHEDULE_PNG_MARK.decode()}), record=True)
    plt.close(fig)
