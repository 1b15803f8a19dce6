"""``bigbatch report RUN [RUN ...]``: one self-contained HTML page of one or more run directories.

The runs' headers and configs, and charts of loss, learning rate, evaluations, throughput, phase times, per-layer
update sizes, the gradient noise scale against the batch, the loss scale and skipped steps, and memory; several runs
overlaid in each chart (docs/report.md). The charts are matplotlib figures inlined as SVG: nothing is fetched when
the page is opened.

    runs.py    a run directory read: records, memory.csv, updates.csv, what is absent
    charts.py  the figures (matplotlib's object API, no pyplot: no backend is chosen, no global figure kept)
    page.py    the HTML
"""

from __future__ import annotations

from pathlib import Path

from bigbatch.errors import UserError
from bigbatch.floor import written
from bigbatch.floor.outputs import probe_writable

__all__ = ["write_report", "is_report"]

DEFAULT_NAME = "report.html"
_MARK = b'<meta name="generator" content="bigbatch report'


def _has_mark(path: Path) -> bool:
    """Whether ``path`` holds a report's generator meta tag near the top (a label: it proves nothing)."""
    try:
        with open(path, "rb") as f:
            return _MARK in f.read(4096)
    except OSError:
        return False


def is_report(path: Path) -> bool:
    """Whether ``path`` is a report bigbatch wrote, unchanged since: recorded as it was written
    (``floor/written.py``: its path, inode, size, time and SHA-256) and carrying the generator meta tag. The tag
    alone proves nothing: a user's page (an edited copy of a report, a page quoting the tag) may carry it too."""
    return written.is_ours(path) and _has_mark(path)


def default_out(runs: list[Path]) -> Path:
    """``RUN/report.html`` for one run, ``report.html`` in the current folder for several."""
    return Path(runs[0]) / DEFAULT_NAME if len(runs) == 1 else Path.cwd() / DEFAULT_NAME


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise UserError(f"report: --out: {out} is a folder; give the HTML file to write, e.g. {out / DEFAULT_NAME}")
    if (out.exists() or out.is_symlink()) and not is_report(out):
        if out.is_file() and not out.is_symlink() and _has_mark(out):
            raise UserError(f"report: --out: {out} looks like a report but bigbatch has no record of writing it "
                            f"as it is now (edited since, copied, or written by an older bigbatch); not overwritten "
                            f"(choose another --out, or move the file away)")
        raise UserError(f"report: --out: {out} already exists and is not a report bigbatch wrote; not overwritten "
                        f"(choose another --out, or move the file away)")
    if not out.parent.is_dir():
        raise UserError(f"report: --out: the folder {out.parent} does not exist")
    probe_writable(out.parent, "report: --out")


def _write_atomically(out: Path, text: str) -> None:
    """``floor/files.py``'s ``atomic_write``: a reader sees the old report or the new one, never part of one; a
    folder that cannot be written is one line. The file is recorded as bigbatch's (``floor/written.py``), the proof
    by which a later report may replace it."""
    from bigbatch.floor.files import atomic_write
    from bigbatch.report.runs import printable

    text = printable(text)  # a run folder's name that is not UTF-8: its bytes as \xff, the page stays UTF-8
    try:
        atomic_write(out, lambda f: f.write(text), mode="w", record=True)
    except OSError as error:  # a read-only file system, a full disk, no permission
        raise UserError(f"report: --out: cannot write in {out.parent} ({error.strerror or error})") from None


def write_report(runs: list[Path], out: Path | None = None) -> Path:
    """Write the HTML report of the run directories ``runs`` to ``out`` (default: ``RUN/report.html`` for one run,
    ``report.html`` in the current folder for several) and return the path written.

    A file already at ``out`` is replaced only if it is a report bigbatch wrote and recorded (:func:`is_report`),
    unchanged since; anything else there (a user's page, a report edited since, or one an older bigbatch wrote
    without a record), or a folder that is not a run (none of ``config.yaml``, ``metrics.jsonl`` and
    ``advisor.json``), is a :class:`~bigbatch.errors.UserError` naming it, and nothing is written."""
    from bigbatch.report.page import render
    from bigbatch.report.runs import read_runs

    if not runs:
        raise UserError("report: give at least one run directory")
    paths = [Path(run) for run in runs]
    data = read_runs(paths)
    out = Path(out) if out is not None else default_out(paths)
    _check_out(out)
    _write_atomically(out, render(data))
    return out
