"""The report's charts: matplotlib figures rendered to inline SVG.

Figures are made with matplotlib's object API (``matplotlib.figure.Figure``), never through ``pyplot``: no backend
is selected, no window can open and no figure is left registered in a global list, whatever the caller's own
matplotlib state (a notebook's inline backend stays as it was). Text stays text in the SVG
(``svg.fonttype: none``): the browser's sans-serif font, and a file a fraction of the size.

Every function takes the runs and returns one SVG string, or None when no run holds what it draws. A run keeps
its colour in every chart. A series that no run holds at least :data:`MIN_POINTS` points of is not drawn (a chart
of single dots says less than the numbers): the page shows its values in a table instead (:func:`too_few`).

Where a run started again (``RunData.restarts``: a resume after an interruption) a chart against steps, images seen
or time marks it: a dash-dot line of the run's colour at the step it resumed from, and the steps it ran twice (from
there to where it had got before) shaded in its colour; on the memory chart, the time it was stopped shaded.

Text from a run (its folder's name, metric, column and layer names) is shown as text: it passes through
:func:`plain`, which escapes the ``$`` that would make matplotlib read it as mathtext, and LaTeX is off whatever the
caller's settings (``text.usetex``).
"""

from __future__ import annotations

import io
import math
import re
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter, LogFormatter, MaxNLocator, NullFormatter

from bigbatch.report.runs import PHASES, Advice, RunData

WIDTH = 10.0
"""Inches; the page scales the SVG to its column."""
MAX_POINTS = 1500
"""A longer series is thinned to every k-th point (its last kept) to keep the file light."""
MIN_POINTS = 3
"""The fewest points of a series (in one run at least) that get a chart; fewer (one evaluation, a one-step run, two
memory samples) are a table of values on the page: one point is a dot, two a straight line."""
RESTART = {"linestyle": (0, (5, 2, 1, 2)), "linewidth": 1.1}
"""How a restart is drawn: a dash-dot line in the run's colour."""
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f")
PHASE_COLOURS = {"data": "#e15759", "forward": "#4e79a7", "backward": "#76b7b2", "sync": "#f28e2b",
                 "update": "#59a14f", "other": "#bab0ac"}
SPLIT_STYLES = ("-", "--", ":", "-.")
_ids = count()

RC = {
    "svg.fonttype": "none",
    "text.usetex": False,  # a run's text is text, never LaTeX
    "svg.hashsalt": "bigbatch-report",  # stable ids; each chart's ids get their own prefix below
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.4,
}


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def plain(text: object) -> str:
    """``text`` as matplotlib shows it literally: each ``$`` escaped (``\\$``), so that no pair of them starts
    mathtext (a folder named ``run $\\frac{a}{$`` would stop the page: ``ParseFatalException``)."""
    return str(text).replace("$", r"\$")


def legend_label(run: RunData) -> str:
    label = f"{run.label} (batch {run.batch})" if run.batch is not None else run.label
    return plain(label)


@contextmanager
def _style() -> Iterator[None]:
    with matplotlib.rc_context(RC):
        yield


def _figure(rows: int = 1, cols: int = 2, height: float = 3.2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(WIDTH, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def to_svg(fig: Figure) -> str:
    """``fig`` as an SVG element to inline in HTML: no XML prolog or DOCTYPE, and ids unique on the page."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]
    prefix = f"c{next(_ids)}-"
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'(url\(#|href="#)([^)"]+)', lambda m: f"{m.group(1)}{prefix}{m.group(2)}", svg)
    svg = svg.replace("<svg ", '<svg role="img" ', 1)
    return svg.strip()


def _thin(*columns: list[float]) -> tuple[list[float], ...]:
    n = len(columns[0])
    if n <= MAX_POINTS:
        return columns
    stride = math.ceil(n / MAX_POINTS)
    keep = [*range(0, n - 1, stride), n - 1]
    return tuple([column[i] for i in keep] for column in columns)


def _images_axis(ax: Axes) -> None:
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("images seen")


def _log_y(ax: Axes, base: float = 10) -> None:
    """A log y axis labelled in plain numbers (40, 100, 300; 1,024, 65,536), not powers (4 x 10^1)."""
    ax.set_yscale("log", base=base)
    if base == 2:
        # whole numbers up to 2^30 written out; beyond, as powers of 2 (a label of 30 digits would crowd out the plot)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if 1 <= v <= 2**30 else
                                                   f"2^{math.log2(v):.0f}" if v > 2**30 else f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.yaxis.set_major_formatter(LogFormatter(base=base))
        ax.yaxis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False, minor_thresholds=(1.5, 0.8)))


def _log_if_wide(ax: Axes, values: list[float]) -> None:
    """A log scale where positive values span more than 30x (a loss from 2.3 to 0.01)."""
    positive = [v for v in values if v > 0]
    if positive and len(positive) == len(values) and max(positive) / min(positive) > 30:
        _log_y(ax)


def _legend(fig: Figure, axes: list[Axes]) -> None:
    """One legend for the figure, below it, of the labels of all its axes (no repeats)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside lower center",
                   ncols=min(len(entries), 4))


LOG_KEYS = ("noise_scale", "loss_scale")
"""The training records' keys always drawn on a log axis: a value of theirs at or below 0 has no place on it."""


def series(run: RunData, key: str) -> tuple[list[float], list[float], list[float]]:
    """``run.series(key)``, the points a chart of ``key`` can place: on a log axis (:data:`LOG_KEYS`) the positive
    values only (:func:`off_log_axis` names the others, which the page shows as text)."""
    steps, images, values = run.series(key)
    if key in LOG_KEYS and any(v <= 0 for v in values):
        kept = [i for i, v in enumerate(values) if v > 0]
        return [steps[i] for i in kept], [images[i] for i in kept], [values[i] for i in kept]
    return steps, images, values


def off_log_axis(runs: list[RunData], key: str, most: int = 8) -> tuple[list[str], int]:
    """The values of ``key`` at or below 0, which its log axis cannot place: ``(the first ``most`` as text, how many
    in all)``; none for a key drawn on a linear axis."""
    if key not in LOG_KEYS:
        return [], 0
    found = [f"{run.label}: {value:g} at step {step:.0f}" for run in runs
             for step, _, value in zip(*run.series(key), strict=True) if value <= 0]
    return found[:most], len(found)


def drawn(runs: list[RunData], key: str) -> bool:
    """Whether the training records' ``key`` gets a chart: some run holds at least :data:`MIN_POINTS` points it can
    place (:func:`series`)."""
    return any(len(series(run, key)[0]) >= MIN_POINTS for run in runs)


def too_few(runs: list[RunData], key: str) -> bool:
    """Whether the runs hold points of ``key`` but too few to draw (the page shows them as a table)."""
    return any(run.series(key)[0] for run in runs) and not drawn(runs, key)


def _restart_steps(run: RunData) -> list[tuple[float, float | None]]:
    """``(step it resumed from, the highest step recorded before, if later)`` of each restart of ``run``."""
    return [(float(r.step), float(r.stopped_at) if r.stopped_at is not None and r.stopped_at > r.step else None)
            for r in run.restarts]


STEPS_AGAIN = "resumed here (dash-dot); shaded: steps run twice"
STOPPED = "resumed here (dash-dot); shaded: stopped"


def mark_restarts(ax: Axes, i: int, spans: list[tuple[float, float | None]], label: str | None = STEPS_AGAIN,
                  color: str | None = None) -> None:
    """Run ``i``'s restarts on ``ax``: a dash-dot line at each ``(x, end)`` in the run's colour (or ``color``), and
    from ``x`` to ``end`` shaded (the steps run twice; on the memory chart the time it was stopped, ``end`` then
    before ``x``). The first line carries ``label`` for the legend; each artist's SVG id says what it is
    (``restart-<run>-<k>``, ``redone-<run>-<k>``)."""
    color = color or colour(i)
    for k, (x, end) in enumerate(spans):
        if x is None or not math.isfinite(x):
            continue
        line = ax.axvline(x, color=color, gid=f"restart-{i}-{k}", **RESTART, label=label if k == 0 else None)
        line.set_zorder(1.5)
        if end is not None and math.isfinite(end) and end != x:
            ax.axvspan(min(x, end), max(x, end), color=color, alpha=0.12, linewidth=0, gid=f"redone-{i}-{k}")


def _mark_steps(ax: Axes, runs: list[tuple[int, RunData]], images: bool = False) -> None:
    """Each run's restarts on an axis of steps, or of images seen (``images``: step x batch)."""
    for i, run in runs:
        spans = _restart_steps(run)
        if images:
            spans = [(run.images_at(x), None if end is None else run.images_at(end)) for x, end in spans]
        mark_restarts(ax, i, [(x, end) for x, end in spans if x is not None], label=None if images else STEPS_AGAIN)


def steps_and_images(runs: list[RunData], key: str, title: str, ylabel: str, log: bool = True) -> str | None:
    """``key`` of the training records against steps (left) and images seen (right), the runs overlaid; a log
    y axis where the values span more than 30x and ``log``. None where no run holds :data:`MIN_POINTS` points."""
    runs_with = [(i, run) for i, run in enumerate(runs) if run.series(key)[0]]
    if not drawn(runs, key):
        return None
    with _style():
        fig, (by_step, by_images) = _figure()
        every: list[float] = []
        for i, run in runs_with:
            steps, images, values = _thin(*run.series(key))
            every += values
            by_step.plot(steps, values, color=colour(i), label=legend_label(run))
            by_images.plot(images, values, color=colour(i), label=legend_label(run))
        for ax, xlabel in ((by_step, "step"), (by_images, None)):
            ax.set_title(f"{title} vs {'steps' if xlabel else 'images seen'}")
            ax.set_ylabel(ylabel)
            if log:
                _log_if_wide(ax, every)
            if xlabel:
                ax.set_xlabel(xlabel)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            else:
                _images_axis(ax)
        _mark_steps(by_step, runs_with)
        _mark_steps(by_images, runs_with, images=True)
        _legend(fig, [by_step])
        return to_svg(fig)


METRIC_ORDER = ("top1", "top5", "mAP", "mAP50", "mAP75", "loss")
MAX_METRICS = 6


def eval_metrics(runs: list[RunData]) -> list[str]:
    """The numeric metrics of the evaluation records (per-class ones, with a ``/``, left out), best known first."""
    found = {metric: None for run in runs for curves in run.evals.values() for metric in curves}
    known = [m for m in METRIC_ORDER if m in found]
    return known + sorted(set(found) - set(known))


def eval_drawn(runs: list[RunData]) -> list[str]:
    """The metrics of :func:`eval_metrics` that get a chart: a split of a run holds :data:`MIN_POINTS` or more."""
    return [metric for metric in eval_metrics(runs)
            if any(len(curves[metric].steps) >= MIN_POINTS for run in runs for curves in run.evals.values()
                   if metric in curves)]


def evaluation(runs: list[RunData]) -> str | None:
    """Each metric (a row) against steps and images seen; each split of a run its own line style. Only the metrics
    of :func:`eval_drawn`, the first :data:`MAX_METRICS` of them."""
    metrics = eval_drawn(runs)[:MAX_METRICS]
    if not metrics:
        return None
    splits = sorted({split for run in runs for split in run.evals}, key=lambda s: (s != "val", s))
    with _style():
        fig, axes = _figure(rows=len(metrics), height=2.6)
        for row, metric in enumerate(metrics):
            by_step, by_images = axes[2 * row], axes[2 * row + 1]
            for i, run in enumerate(runs):
                for split, curves in run.evals.items():
                    if metric not in curves:
                        continue
                    steps, values = _thin(*curves[metric].points()[::2])
                    style = dict(color=colour(i), linestyle=SPLIT_STYLES[splits.index(split) % len(SPLIT_STYLES)],
                                 marker="o", markersize=3, label=f"{legend_label(run)} {plain(split)}")
                    by_step.plot(steps, values, **style)
                    images = [run.images_at(s) for s in steps]
                    if None not in images:
                        by_images.plot(images, values, **style)
            by_step.set_title(f"{plain(metric)} vs steps")
            by_images.set_title(f"{plain(metric)} vs images seen")
            by_step.set_xlabel("step")
            by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
            _images_axis(by_images)
            evaluated = [(i, run) for i, run in enumerate(runs)
                         if any(metric in curves for curves in run.evals.values())]
            _mark_steps(by_step, evaluated)
            _mark_steps(by_images, evaluated, images=True)
            for ax in (by_step, by_images):
                ax.set_ylabel(plain(metric))
        _legend(fig, axes)
        return to_svg(fig)


def memory_columns(runs: list[RunData]) -> list[str]:
    """The columns of the runs' ``memory.csv`` the memory chart draws: those with a non-zero value, in order."""
    skip = {"time", "elapsed_s", "step", "minutes"}
    columns: list[str] = []
    for run in runs:
        for name, values in run.memory.items():
            if name not in skip and name not in columns and any(math.isfinite(v) and v != 0 for v in values):
                columns.append(name)
    return columns


def memory_drawn(runs: list[RunData]) -> bool:
    """Whether a run holds :data:`MIN_POINTS` memory samples or more (fewer: the page's table of samples)."""
    return any(len(run.memory.get("minutes", ())) >= MIN_POINTS for run in runs)


def memory(runs: list[RunData]) -> str | None:
    """Each non-zero column of ``memory.csv`` (a panel) against minutes since the run started, the runs overlaid;
    where a run was stopped and resumed, the time between its last sample and its next shaded."""
    columns = memory_columns(runs)
    if not columns or not memory_drawn(runs):
        return None
    cols = min(3, len(columns))
    rows = math.ceil(len(columns) / cols)
    with _style():
        fig, axes = _figure(rows=rows, cols=cols, height=2.6)
        for ax, name in zip(axes, columns, strict=False):
            for i, run in enumerate(runs):
                if any(math.isfinite(v) and v != 0 for v in run.memory.get(name, [])):
                    minutes, values = _thin(run.memory["minutes"], run.memory[name])
                    ax.plot(minutes, values, color=colour(i), label=legend_label(run),
                            marker="." if len(values) <= 100 else None, markersize=3)
            unit = " (MiB)" if name.endswith("_mib") else ""
            ax.set_title(plain(name.removesuffix("_mib").replace("_", " ")) + unit)
            ax.set_xlabel("minutes since the run started")
            ax.set_ylim(bottom=0)
            for i, run in enumerate(runs):  # resumed at the second minute; stopped since the first
                if run.memory_breaks and name in run.memory:
                    mark_restarts(ax, i, [(after, before) for before, after in run.memory_breaks], label=STOPPED)
        for ax in axes[len(columns):]:
            ax.set_visible(False)
        _legend(fig, axes)
        return to_svg(fig)


def phases(runs: list[RunData]) -> str | None:
    """One horizontal bar a run: each phase's share of the mean step, stacked to 100 %."""
    measured = []
    for run in runs:
        found = run.phase_means()
        if found is not None:
            measured.append((run, found[0]))
    if not measured:
        return None
    with _style():
        fig = Figure(figsize=(WIDTH, 0.55 * len(measured) + 1.3), layout="constrained")
        ax = fig.subplots()
        labels = [legend_label(run) for run, _ in measured]
        left = [0.0] * len(measured)
        # records whose phases add up to more than their t_step (or hold a negative time) are no bigbatch run's:
        # their bars are shares of the phases' sum, so that they stay inside the 100 % the axis holds
        totals = [max(means["step"], sum(max(0.0, means[phase]) for phase in PHASES)) for _, means in measured]
        for phase in PHASES:
            shares = [100 * max(0.0, means[phase]) / total if total > 0 else 0.0
                      for (_, means), total in zip(measured, totals, strict=True)]
            bars = ax.barh(labels, shares, left=left, color=PHASE_COLOURS[phase], label=phase, height=0.6)
            for bar, share in zip(bars, shares, strict=True):
                if share >= 4:
                    ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2, f"{share:.0f}%",
                            ha="center", va="center", fontsize=8, color="white")
            left = [a + b for a, b in zip(left, shares, strict=True)]
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of the step time (%), mean over the logged steps")
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
        fig.legend(loc="outside lower center", ncols=len(PHASES))
        return to_svg(fig)


def updates(run: RunData) -> str | None:
    """A heatmap of layers (rows, in the model's order) by logged steps (columns): log10 of ``‖ΔW‖ / ‖W‖``."""
    data = run.updates
    if data is None or not data.steps:
        return None
    import numpy as np

    values = np.array(data.relative, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(values > 0, np.log10(values), np.nan)
    n = len(data.layers)
    row_inches, margin_inches = 0.16, 1.4  # a 7-point label fits a row of 0.16 in
    height = max(2.4, min(14.0, row_inches * n + margin_inches))
    labelled = max(1, round((height - margin_inches) / row_inches))  # rows that fit a label each
    with _style():
        fig = Figure(figsize=(WIDTH, height), layout="constrained")
        ax = fig.subplots()
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#e6e6e6")
        image = ax.imshow(np.ma.masked_invalid(logs), aspect="auto", interpolation="nearest", cmap=cmap)
        every = max(1, math.ceil(n / labelled))  # every row up to 79 tensors; beyond, every k-th
        ax.set_yticks(range(0, n, every), [plain(data.layers[i]) for i in range(0, n, every)],
                      fontsize=7 if n > 20 else 8)
        columns = len(data.steps)
        ticks = sorted({round(j) for j in np.linspace(0, columns - 1, min(columns, 10))})
        ax.set_xticks(ticks, [str(data.steps[j]) for j in ticks])
        ax.set_xlabel("step")
        # a restart between the columns of the step it resumed from and the next; its redone steps' columns shaded
        at = [(bisect_right(data.steps, step) - 0.5, None if end is None else bisect_right(data.steps, end) - 0.5)
              for step, end in _restart_steps(run)]
        mark_restarts(ax, 0, at, label=None, color="white")
        ax.grid(False)
        ax.set_title(f"{plain(run.label)}: relative update per layer")
        bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.01)
        bar.set_label("log10 ‖ΔW‖ / ‖W‖")
        return to_svg(fig)


def noise_scale(runs: list[RunData]) -> str | None:
    """The noise scale against steps and images seen, each run's batch a dashed line of its colour."""
    runs_with = [(i, run) for i, run in enumerate(runs) if series(run, "noise_scale")[0]]
    if not drawn(runs, "noise_scale"):
        return None
    with _style():
        fig, (by_step, by_images) = _figure()
        for i, run in runs_with:
            steps, images, values = _thin(*series(run, "noise_scale"))
            by_step.plot(steps, values, color=colour(i), label=f"{legend_label(run)}: noise scale")
            by_images.plot(images, values, color=colour(i))
            if run.batch is not None:
                for ax in (by_step, by_images):
                    ax.axhline(run.batch, color=colour(i), linestyle="--", linewidth=1.1,
                               label=f"{plain(run.label)}: its batch, {run.batch}")
        for ax in (by_step, by_images):
            _log_y(ax)
            ax.set_ylabel("images")
        by_step.set_title("noise scale B_simple vs steps")
        by_step.set_xlabel("step")
        by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
        by_images.set_title("noise scale B_simple vs images seen")
        _images_axis(by_images)
        _mark_steps(by_step, runs_with)
        _mark_steps(by_images, runs_with, images=True)
        _legend(fig, [by_step])
        return to_svg(fig)


def loss_scale_and_skipped(runs: list[RunData]) -> str | None:
    """The loss scale (log 2 axis) and the skipped steps so far, against steps; None when neither says anything:
    no loss scale recorded and no step skipped."""
    scaled = [(i, run) for i, run in enumerate(runs) if series(run, "loss_scale")[0]] \
        if drawn(runs, "loss_scale") else []
    skipped = [(i, run) for i, run in enumerate(runs)
               if ("skipped" in run.curves and run.curves["skipped"].high[0] > 0) or run.skips.count]
    if not scaled and not skipped:
        return None
    with _style():
        fig, (scale_ax, skip_ax) = _figure()
        for i, run in scaled:
            steps, _, values = _thin(*series(run, "loss_scale"))
            scale_ax.plot(steps, values, color=colour(i), label=legend_label(run), drawstyle="steps-post")
        if scaled:
            _log_y(scale_ax, base=2)
        else:
            few = too_few(runs, "loss_scale")
            scale_ax.text(0.5, 0.5, "too few records of the loss scale to draw: the table below" if few else
                          "no loss scale recorded (fp32, or bf16 without one)", ha="center", va="center",
                          transform=scale_ax.transAxes)
        scale_ax.set_title("loss scale")
        _mark_steps(scale_ax, scaled)
        _mark_steps(skip_ax, skipped)
        for i, run in enumerate(runs):
            steps, _, values = _thin(*run.series("skipped"))
            if steps:
                skip_ax.plot(steps, values, color=colour(i), label=legend_label(run), drawstyle="steps-post")
            if run.skips.count:
                at, _, counts = run.skips.points()
                skip_ax.plot([s + 1 for s in at], counts, "x", color=colour(i), markersize=6)
        skip_ax.set_title("skipped steps so far (x: each non-finite step)")
        skip_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        for ax in (scale_ax, skip_ax):
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _legend(fig, [scale_ax, skip_ax])
        return to_svg(fig)


def loss(runs: list[RunData]) -> str | None:
    return steps_and_images(runs, "loss", "training loss", "loss")


def learning_rate(runs: list[RunData]) -> str | None:
    return steps_and_images(runs, "lr", "learning rate", "lr", log=False)


def global_batch(runs: list[RunData]) -> str | None:
    """The global batch in effect, for runs with a batch schedule (their records say it)."""
    return steps_and_images(runs, "batch", "global batch", "images per step", log=False)


def adascale_gain(runs: list[RunData]) -> str | None:
    """AdaScale's gain r of each step, for adaptive runs (``batch: {mode: adaptive}``; their records say it)."""
    return steps_and_images(runs, "gain", "AdaScale gain r", "r (LR multiplier, base steps per step)", log=False)


def adascale_progress(runs: list[RunData]) -> str | None:
    """AdaScale's progress through the base schedule, in base steps, for adaptive runs."""
    return steps_and_images(runs, "progress", "base-schedule progress", "base steps done", log=False)


def throughput(runs: list[RunData]) -> str | None:
    return steps_and_images(runs, "images_per_s", "throughput", "images / s")


def grad_norm(runs: list[RunData]) -> str | None:
    return steps_and_images(runs, "grad_norm", "gradient norm", "norm")


def _wall_formatter(relative: bool) -> FuncFormatter:
    if relative:
        return FuncFormatter(lambda v, _: f"{v:.3g} s")
    return FuncFormatter(lambda v, _: f"{v / 3600:.3g} h" if v >= 3600 else f"{v / 60:.3g} min" if v >= 60
                         else f"{v:.3g} s")


def advice(run: RunData) -> str | None:
    """``bigbatch plan --devices``'s prediction (``advisor.json``): images/s (left) and wall time to the target
    (right, per S_min step without a target) against the global batch, a line per device count, error bars of one
    standard deviation (the uncertainty the table prints), the recommended row starred. None without one."""
    advice_: Advice | None = run.advice
    if advice_ is None:
        return None
    with _style():
        fig, (rate_ax, wall_ax) = _figure()
        counts = sorted({row.devices for row in advice_.rows})
        walls = False
        for k, devices in enumerate(counts):
            rows = sorted((row for row in advice_.rows if row.devices == devices), key=lambda row: row.batch)
            label = f"{devices} device{'s' if devices > 1 else ''}"
            rate_ax.errorbar([r.batch for r in rows], [r.images_per_s for r in rows],
                             yerr=[r.images_per_s_sd for r in rows], color=colour(k), marker="o", markersize=3,
                             capsize=2, label=label)
            timed = [r for r in rows if r.wall is not None]
            if timed:
                walls = True
                wall_ax.errorbar([r.batch for r in timed], [r.wall for r in timed],
                                 yerr=[r.wall * r.wall_sd for r in timed], color=colour(k), marker="o",
                                 markersize=3, capsize=2, label=label)
        best = advice_.recommended
        if best is not None:
            star = dict(marker="*", markersize=13, color="black", linestyle="none",
                        label=f"recommended: batch {best.batch} on {best.devices}")
            rate_ax.plot([best.batch], [best.images_per_s], **star)
            if best.wall is not None:
                wall_ax.plot([best.batch], [best.wall], **star)
        for ax in (rate_ax, wall_ax):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("global batch")
        rate_ax.set_title(f"{plain(run.label)}: predicted images/s (link {plain(advice_.link)})")
        rate_ax.set_ylabel("images/s")
        rate_ax.yaxis.set_major_formatter(EngFormatter(sep=""))
        if walls:
            wall_ax.set_title("predicted wall time per S_min step" if advice_.relative else
                              "predicted wall time to the target")
            wall_ax.set_ylabel("wall / S_min" if advice_.relative else "wall time")
            _log_y(wall_ax)
            wall_ax.yaxis.set_major_formatter(_wall_formatter(advice_.relative))
            wall_ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            wall_ax.text(0.5, 0.5, "no noise scale measured: no steps, no wall time", ha="center", va="center",
                         transform=wall_ax.transAxes)
            wall_ax.set_title("predicted wall time")
        _legend(fig, [rate_ax, wall_ax])
        return to_svg(fig)
