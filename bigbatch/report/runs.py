"""A run directory read for the report: what each file holds, what is absent, and what could not be read.

Reading never fails on a run's contents: a crashed run's half-written last line, a column added by a later version,
a file that is absent, each becomes a note the report shows. Only a folder that is not a run at all (none of
``config.yaml``, ``metrics.jsonl`` and ``advisor.json``) is a :class:`~bigbatch.errors.UserError`.

``advisor.json`` (``bigbatch plan --devices --out RUN``) is read whole, up to :data:`MAX_ADVISOR_BYTES`: its rows'
device count, batch, predicted images/s and wall time with their uncertainties, and the recommended row
(:class:`Advice`). A file that is not bigbatch's, or a row without those numbers, is a note.

Nor does what it keeps grow with the files: ``metrics.jsonl``, ``memory.csv`` and ``updates.csv`` are read a line at
a time, each curve keeps at most :data:`MAX_POINTS` points (evenly spread, the first and last always among them),
and what the page sums up (the means, the best evaluation, the last record) is computed while reading.
``config.yaml`` is read by bigbatch's bounded YAML loader (``config.load_yaml``: no alias bomb).

A run folder may come from anyone: each of its files is read only where its real path (links and ``..`` followed)
lies inside the folder, so a link to a file elsewhere (``config.yaml -> ~/.ssh/id_rsa``) never puts that file's text
on the page, and only as a regular file, opened without blocking (a FIFO does not hang the report); any other is
a note, the file unread (:func:`_open_binary`).

Where the run started again (a resume after Ctrl-C or a crash) is read from the run's own records of each start
(``event: started`` / ``resumed``, with the world size); a run directory made before those records says it in
``memory.csv`` (its clock starts again at each start of the process) or, older still, in training records whose
step goes back.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from bigbatch.config.adaptive import MAX_ADVISOR_BYTES
from bigbatch.config.loading import MAX_CONFIG_BYTES
from bigbatch.errors import UserError
from bigbatch.floor import run_files
from bigbatch.floor.user_files import NotARegularFile, lies_inside, open_regular

PHASES = ("data", "forward", "backward", "sync", "update", "other")
"""The disjoint phases of a step, in the order the step runs them (``engine/phases.py``); ``t_step`` is their sum."""
_PHASE_KEYS = tuple(f"t_{phase}" for phase in PHASES)

FILES = (run_files.CONFIG, run_files.METRICS, run_files.MEMORY, run_files.UPDATES)
"""The files of a run directory the report reads."""
ADVISOR = "advisor.json"
"""What ``bigbatch plan --devices --out RUN`` writes (``advisor/command.py``); read where it is there, within
:data:`~bigbatch.config.adaptive.MAX_ADVISOR_BYTES`, the bound every reader of it keeps."""

MAX_POINTS = 2000
"""The most points a curve gives (a training key, an evaluation metric, a memory column), whatever the file's
length (while it reads, a :class:`Curve` holds at most twice as many); the charts thin them further to
``charts.MAX_POINTS``."""
MAX_SERIES = 128
"""The most curves a run keeps (training keys and evaluation metrics together; a bigbatch run has about 25)."""
MAX_UPDATE_STEPS = 600
"""The most steps (columns) the update heatmap keeps (about the width of the heatmap in pixels)."""
MAX_LAYERS = 1024
"""The most parameter tensors (rows) the update heatmap keeps, the first ones written (ResNet-50 has 161, YOLOv3
about 220)."""
MAX_EVENTS = 200
"""The events kept for the page's table (the first ones); the last of each kind is kept besides."""
MAX_KINDS = 64
"""The most kinds of events, and of evaluation splits, kept by name."""
MAX_LINE = 256 * 1024
"""The longest line of ``metrics.jsonl`` read (characters; a bigbatch record is about 1 KB); a longer one is skipped
as not a record."""
# MAX_CONFIG_BYTES (config/loading.py, 1 MiB): the largest ``config.yaml`` read (a resolved config is a few KB).
MAX_STEP = 2**53
"""Steps beyond this (in magnitude) are not a record's."""
MAX_RESTARTS = 200
"""The most starts of a run kept, of each source (a run resumed every few steps for weeks)."""
MAX_DRAWN = 1e200
"""The largest magnitude of a value the report draws or computes with. matplotlib places a value on an axis through
the axis's range (highest - lowest, with margins) and its ticks, and the page sums and scales values (means, shares,
step x batch): a value past this (``1e308`` and ``-1e308`` in one curve overflow the range, numpy's ``arange: cannot
compute length``), a whole number past a float (a 400-digit batch), NaN or infinity is shown as text in a note of
the run's and left out of the charts. A bigbatch run's values are far inside it (fp32's largest is 3.4e38)."""
MAX_COUNT = 2**53
"""The largest batch, world size, subdivisions or image count the report computes with (every whole number up to it
is exact as a float); a larger one is shown as text in the same note."""
MAX_UNDRAWN = 8
"""The values of that note shown (the first ones read); it counts them all."""


def _thinned(steps: list[int] | array, stride: int, most: int) -> tuple[list[int], int]:
    """The positions in ``steps`` (sorted, distinct) that stay when they are thinned to at most ``most``: the
    first step held in each span of ``stride`` steps (``step // stride``), and the last step; the stride doubles
    until at most ``most`` stay -> (positions, stride). A doubling merges the spans pairwise, so at least half of
    what was held stays: steps of any spacing or offset (all odd, every 391st) thin evenly and never collapse to
    the two ends. Which steps stay depends only on the steps, not on the order they came in, so thinning in
    stages keeps what thinning all at once would."""
    n = len(steps)
    while True:
        keep, run = [], None
        for i, step in enumerate(steps):
            if step // stride != run:
                keep.append(i)
                run = step // stride
        if keep and keep[-1] != n - 1:
            keep.append(n - 1)
        if len(keep) <= most:
            return keep, stride
        stride *= 2


class Curve:
    """Points ``(step, x, value)`` by step: at most :data:`MAX_POINTS` of them when read, however many are put (at
    most twice as many held meanwhile).

    A point at a step already held replaces it (a resumed run's repeated steps: the last wins). Past twice the
    bound, and when read, the points are thinned (:func:`_thinned`): the first step held in each span of ``stride``
    steps stays, and the last step; the stride doubles until at most :data:`MAX_POINTS` remain: deterministic,
    evenly spread over the steps, the first and last points always kept. The running figures (``count``, the mean
    but the first, the lowest and highest value with their steps) are over every point put, in the order put."""

    __slots__ = ("steps", "xs", "values", "stride", "count", "first", "_rest", "low", "high")

    def __init__(self) -> None:
        self.steps = array("q")
        self.xs = array("d")
        self.values = array("d")
        self.stride = 1
        self.count = 0
        self.first: float | None = None
        self._rest = 0.0  # the sum of the values put after the first
        self.low: tuple[float, int] | None = None
        self.high: tuple[float, int] | None = None

    def put(self, step: int, x: float, value: float) -> None:
        steps, stride = self.steps, self.stride
        n = len(steps)
        if n and step > steps[-1]:  # the usual case: a later step than any held
            if n >= 2 and steps[-2] // stride == steps[-1] // stride == step // stride:
                # the last point held is neither the first of its span nor the last any more: thinning would drop
                # it, so the new point takes its place
                steps[-1], self.xs[-1], self.values[-1] = step, x, value
            else:
                steps.append(step)
                self.xs.append(x)
                self.values.append(value)
                if n + 1 > 2 * MAX_POINTS:
                    self._thin()
        else:
            i = bisect_left(steps, step)
            if i < n and steps[i] == step:
                self.xs[i], self.values[i] = x, value
            else:
                steps.insert(i, step)
                self.xs.insert(i, x)
                self.values.insert(i, value)
                if n + 1 > 2 * MAX_POINTS:
                    self._thin()
        if self.first is None:
            self.first = value
        else:
            self._rest += value
        self.count += 1
        if self.low is None or value < self.low[0]:
            self.low = (value, step)
        if self.high is None or value > self.high[0]:
            self.high = (value, step)

    def drop(self, step: int) -> None:
        """Forget the point at ``step`` (a later record of that step holds no value here); the running figures
        keep it."""
        i = bisect_left(self.steps, step)
        if i < len(self.steps) and self.steps[i] == step:
            del self.steps[i], self.xs[i], self.values[i]

    def _thin(self) -> None:
        n = len(self.steps)
        keep, self.stride = _thinned(self.steps, self.stride, MAX_POINTS)  # the stride so far applies to all
        if len(keep) < n:
            self.steps, self.xs, self.values = (array(a.typecode, (a[i] for i in keep))
                                                for a in (self.steps, self.xs, self.values))

    def points(self) -> tuple[list[float], list[float], list[float]]:
        """``(steps, xs, values)``, by step."""
        self._thin()
        return [float(s) for s in self.steps], list(self.xs), list(self.values)

    def mean_but_first(self) -> float | None:
        """The mean of the values put but the first (or the first, when it is the only one)."""
        return self._rest / (self.count - 1) if self.count > 1 else self.first


@dataclass
class Updates:
    """Per-layer update sizes: ``relative[i][j]`` is layer ``layers[i]`` at step ``steps[j]`` (NaN: not measured)."""

    steps: list[int]
    layers: list[str]
    relative: list[list[float]]
    source: str
    """``updates.csv``, or the training records' ``top_updates`` (the largest ten per step) when it is absent."""


class _Heatmap:
    """Update sizes by step and layer, at most :data:`MAX_UPDATE_STEPS` steps (thinned as :class:`Curve` thins)
    of at most :data:`MAX_LAYERS` layers, in the order they first came (the model's); a later value of a step and
    layer replaces the earlier one. A step's column is an array by layer (NaN: not measured)."""

    def __init__(self) -> None:
        self.layers: dict[str, int] = {}
        self.columns: dict[int, array] = {}
        self.stride = 1
        self.refused = False  # a layer past MAX_LAYERS was left out

    def put(self, step: int, layer: str, value: float) -> None:
        row = self.layers.get(layer)
        if row is None:
            if len(self.layers) >= MAX_LAYERS:
                self.refused = True
                return
            row = self.layers[layer] = len(self.layers)
        column = self.columns.get(step)
        if column is None:
            column = self.columns[step] = array("d", [math.nan]) * len(self.layers)
            if len(self.columns) > 2 * MAX_UPDATE_STEPS:
                self._thin()
        if row >= len(column):
            column.extend([math.nan] * (row + 1 - len(column)))
        column[row] = value

    def _thin(self) -> None:
        steps = sorted(self.columns)
        keep, self.stride = _thinned(steps, self.stride, MAX_UPDATE_STEPS)
        self.columns = {steps[i]: self.columns[steps[i]] for i in keep}

    def result(self, source: str) -> Updates | None:
        if not self.columns:
            return None
        self._thin()
        columns = [self.columns[s] for s in sorted(self.columns)]
        relative = [[column[row] if row < len(column) else math.nan for column in columns]
                    for row in range(len(self.layers))]
        return Updates(steps=sorted(self.columns), layers=list(self.layers), relative=relative, source=source)


@dataclass
class Phases:
    """The phase times of the training records that have them, summed as they are read, the first such record
    aside (it warms up: allocations, first kernels; the run's own table leaves it out too)."""

    first: tuple[dict[str, float], float | None] | None = None
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys((*PHASES, "step"), 0.0))
    rows: int = 0
    bn_sync: float = 0.0
    bn_rows: int = 0

    def add(self, record: dict[str, Any]) -> None:
        """Records with a phase time but ``t_data`` count; ``t_step`` is the sum of the phases where absent, and
        the rest of ``t_step`` is ``other`` where a record has no ``t_other`` (older records)."""
        if all(drawable(record.get(key)) is None for key in _PHASE_KEYS[1:]):
            return
        times = {p: drawable(record.get(key)) or 0.0 for p, key in zip(PHASES, _PHASE_KEYS, strict=True)}
        total = drawable(record.get("t_step"))
        if total is None:
            total = sum(times.values())
        if drawable(record.get("t_other")) is None:
            times["other"] = max(0.0, total - sum(times.values()))
        times["step"] = total
        bn_sync = drawable(record.get("t_bn_sync"))
        if self.first is None:
            self.first = (times, bn_sync)
            return
        self.rows += 1
        for key, seconds in times.items():
            self.sums[key] += seconds
        if bn_sync is not None:
            self.bn_sync += bn_sync
            self.bn_rows += 1

    def means(self) -> tuple[dict[str, float], int] | None:
        if self.first is None:
            return None
        if not self.rows:  # the only record with phase times: it is the mean
            times, bn_sync = self.first
            return {**times, **({"bn_sync": bn_sync} if bn_sync is not None else {})}, 1
        means = {key: value / self.rows for key, value in self.sums.items()}
        if self.bn_rows:  # a sub-phase, inside forward and backward: the mean over the records that have it
            means["bn_sync"] = self.bn_sync / self.bn_rows
        return means, self.rows


@dataclass
class Segment:
    """One start of the run's process(es): the first (at step 0), or a restart (a resume from the checkpoint of
    ``step``, or a start from scratch over an earlier attempt)."""

    step: int
    """The optimizer steps done when it started: 0, or the step of the checkpoint it resumed from."""
    resumed: bool = True
    world: int | None = None
    """The number of processes it ran on, where recorded."""
    time: float | None = None
    """When it started (seconds since the epoch), where recorded."""
    stopped_at: int | None = None
    """The highest step recorded before it started (where the run before it got to), where known: the steps from
    ``step`` to it were run twice."""
    source: str = run_files.METRICS
    """What says so: ``metrics.jsonl`` (the run's record of its start), ``memory.csv`` (the clock starting again),
    or ``training records`` (their step going back)."""

    @property
    def restart(self) -> bool:
        """A start after another: a resume, or a start over an earlier attempt that had recorded steps."""
        return self.resumed or self.stopped_at is not None


@dataclass(frozen=True)
class AdviceRow:
    devices: int
    batch: int
    images_per_s: float
    images_per_s_sd: float
    wall: float | None
    """Predicted wall time (seconds; per S_min step where ``Advice.relative``), None without a noise scale."""
    wall_sd: float
    """Relative."""


@dataclass(frozen=True)
class Advice:
    """What ``bigbatch plan --devices`` predicted (``advisor.json``): a row per device count and global batch."""

    rows: list[AdviceRow]
    recommended: AdviceRow | None
    relative: bool
    """The wall time is per S_min step (no ``--from RUN --target-loss L``)."""
    link: str


@dataclass
class RunData:
    path: Path
    label: str = ""
    """How charts and tables name the run: its folder's name, made unique among the runs of one report."""
    config: dict[str, Any] = field(default_factory=dict)
    config_text: str | None = None
    curves: dict[str, Curve] = field(default_factory=dict)
    """A curve per numeric key of the training records (those with ``lr``), by step (a resumed run's repeated
    steps: the last record)."""
    last: dict[str, Any] | None = None
    """The training record of the highest step."""
    train_records: int = 0
    evals: dict[str, dict[str, Curve]] = field(default_factory=dict)
    """Evaluation curves by ``split`` (``val``, ``val_raw``, ...), then metric (per-class ones, with a ``/``, left
    out)."""
    last_evals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The evaluation record of the highest step of each split."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The first :data:`MAX_EVENTS` events; ``events_total`` counts them all."""
    events_total: int = 0
    last_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The last event of each kind (``event``)."""
    skips: Curve = field(default_factory=Curve)
    """The ``skipped`` events: the skipped steps so far, by step."""
    phases: Phases = field(default_factory=Phases)
    memory: dict[str, list[float]] = field(default_factory=dict)
    """``memory.csv`` by column; ``minutes``: since the first sample (NaN where a resumed run starts again)."""
    updates: Updates | None = None
    absent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)
    """What the records say of the run: ``batch`` and ``world`` (the last event or training record giving one),
    ``subdivisions`` (the last out-of-memory re-cut), ``images_batch`` (images / step of the lowest step)."""
    segments: list[Segment] = field(default_factory=list)
    """Each start the run recorded (``event: started`` or ``resumed``), in the order written: at most
    :data:`MAX_RESTARTS`."""
    clock_restarts: list[Segment] = field(default_factory=list)
    """Where ``memory.csv``'s clock starts again (a run directory made before the start records)."""
    record_restarts: list[Segment] = field(default_factory=list)
    """Where a training record's step goes back (older runs kept the records past the checkpoint)."""
    undrawn: list[str] = field(default_factory=list)
    """The first :data:`MAX_UNDRAWN` values the report could not draw or count with, as text with where each was
    (``gain 1e+308 (step 2)``); ``undrawn_total`` counts them all. Read: a note of the run's."""
    undrawn_total: int = 0
    advice: Advice | None = None
    """The rows of the run directory's ``advisor.json`` (None: no such file, or none readable)."""
    memory_breaks: list[tuple[float, float]] = field(default_factory=list)
    """``(minutes, minutes)`` of the last sample before each restart of ``memory.csv``'s clock and the first after
    it, on the ``minutes`` axis (runs whose samples carry their wall-clock ``time``)."""

    # --- what the header shows -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return printable(str(self.config.get("name") or self.path.name))

    @property
    def task(self) -> str | None:
        return self.config.get("task")

    @property
    def batch(self) -> int | None:
        batch = count(self.config.get("batch"))
        if batch is not None:
            return batch
        for key in ("batch", "images_batch"):  # an event's batch; else images = step x batch in every record
            if self.recorded.get(key) is not None:
                return self.recorded[key]
        return None

    @property
    def subdivisions(self) -> Any:
        return self.recorded.get("subdivisions", self.config.get("subdivisions"))

    @property
    def world(self) -> int | None:
        """The number of processes (of the last start), where the run recorded it (``world`` in the config or a
        record: each start's ``started``/``resumed`` event)."""
        if count(self.config.get("world")) is not None:
            return self.config["world"]
        return self.recorded.get("event_world", self.recorded.get("train_world"))

    @property
    def worlds(self) -> list[tuple[int, int]]:
        """``(step, world)`` where the recorded world size changes, the first start's first: ``[(0, 2), (40, 4)]``
        for a run resumed at step 40 on 4 processes (torchrun allows it); empty where no start recorded one."""
        changes: list[tuple[int, int]] = []
        for segment in self.segments:
            if segment.world is not None and (not changes or changes[-1][1] != segment.world):
                changes.append((segment.step, segment.world))
        return changes

    @property
    def restarts(self) -> list[Segment]:
        """Where the run started again, in the order it did: from its own records of each start where it has any,
        else from ``memory.csv``'s clock, else from its training records' steps going back."""
        if self.segments:
            return [segment for segment in self.segments if segment.restart]
        return self.clock_restarts or self.record_restarts

    @property
    def planned_steps(self) -> int | None:
        return count(self.config.get("steps"), low=0)

    @property
    def steps_done(self) -> int | None:
        return self.last["step"] if self.last else None

    @property
    def images_seen(self) -> int | None:
        images = self.last.get("images") if self.last else None
        return images if isinstance(images, int) else None

    def images_at(self, step: float) -> float | None:
        """The training images seen after ``step`` optimizer steps: step x batch (the batch is fixed for a run), or,
        for a run with a batch schedule (its records hold ``batch``), interpolated between its records' images."""
        curve = self.curves.get("batch")
        if curve is not None:
            steps, images, _ = curve.points()
            steps, images = [0.0, *steps], [0.0, *images]
            k = min(max(bisect_left(steps, step), 1), len(steps) - 1)  # between records k - 1 and k (or past the last)
            if steps[k] > steps[k - 1]:
                at = images[k - 1] + (step - steps[k - 1]) * (images[k] - images[k - 1]) / (steps[k] - steps[k - 1])
                return at if math.isfinite(at) else None  # a record without its images (NaN): not known
        batch = self.batch
        return None if batch is None else step * batch

    def series(self, key: str) -> tuple[list[float], list[float], list[float]]:
        """``(steps, images, values)`` of the training records holding a number under ``key``, at most
        :data:`MAX_POINTS` of them."""
        curve = self.curves.get(key)
        return curve.points() if curve is not None else ([], [], [])

    def mean(self, key: str) -> float | None:
        """The mean of ``key`` over the training records holding it, the first excepted when there are more (its
        rate includes start-up)."""
        curve = self.curves.get(key)
        return curve.mean_but_first() if curve is not None else None

    def phase_means(self) -> tuple[dict[str, float], int] | None:
        """Mean seconds per step of each phase and of the whole step (``t_step``), over the training records that
        hold phase times, the first of them excepted when there are more -> ``({"data": s, ..., "step": s},
        records)``, or None. ``bn_sync`` (the cross-device BN all-reduces, inside forward and backward) is there when
        the records have it."""
        return self.phases.means()


def drawable(value: Any) -> float | None:
    """``value`` as a float the charts can draw (finite, at most :data:`MAX_DRAWN` in magnitude), or None: not a
    number (a boolean, a string, absent) or one the report cannot draw (NaN, infinite, ``1e308``, a whole number past
    a float's range: JSON reads ``1`` followed by 400 zeros as an int). :func:`is_number` tells the two apart."""
    if type(value) is float:  # the usual case, first
        return value if -MAX_DRAWN <= value <= MAX_DRAWN else None  # NaN fails both
    if not is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if -MAX_DRAWN <= number <= MAX_DRAWN else None


def is_number(value: Any) -> bool:
    """Whether a value read from a run's files is a number (an int or a float, never a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def count(value: Any, low: int = 1) -> int | None:
    """``value`` as a count the report computes with (a batch, a world size, images): an int in [``low``,
    :data:`MAX_COUNT`], else None."""
    return value if type(value) is int and low <= value <= MAX_COUNT else None


def as_text(value: Any) -> str:
    """A number read from a run, as text for a person: a whole number of more than 24 digits by its first and last
    digits and its length (``100000…000 (401 digits)``), a float as Python writes it (``1e+308``, ``nan``)."""
    if type(value) is int and abs(value) >= 10**24:
        try:
            digits = str(abs(value))
        except ValueError:  # past Python's limit for int -> str (4,300 digits)
            return f"{'-' if value < 0 else ''}a number of about {int(value.bit_length() * 0.30103) + 1} digits"
        return f"{'-' if value < 0 else ''}{digits[:6]}…{digits[-3:]} ({len(digits)} digits)"
    if isinstance(value, str):
        return value[:40] + ("…" if len(value) > 40 else "")
    return repr(value) if type(value) is float else str(value)


def _undrawn(run: RunData, key: str, value: Any, where: str) -> None:
    """Note ``value`` of ``key`` as one the report cannot draw or count with (``where``: in what file, step, line)."""
    run.undrawn_total += 1
    if len(run.undrawn) < MAX_UNDRAWN:
        run.undrawn.append(f"{as_text(key)} {as_text(value)} ({where})")


def _step(value: Any) -> int | None:
    """A record's step as an int, or None (not a number, or past :data:`MAX_STEP`)."""
    step = drawable(value)
    return int(step) if step is not None and abs(step) < MAX_STEP else None


def read_run(path: Path) -> RunData:
    """Read the run directory ``path`` (see the module docstring)."""
    if not path.exists():
        raise UserError(f"report: {path} does not exist; give a bigbatch run directory (the --out of bigbatch train)")
    if not path.is_dir() or not any((path / name).is_file() for name in (run_files.CONFIG, run_files.METRICS, ADVISOR)):
        raise UserError(f"report: {path} is not a bigbatch run directory (it holds none of config.yaml, "
                        f"metrics.jsonl and {ADVISOR})")
    run = RunData(path=path)
    run.absent = [name for name in FILES if not (path / name).is_file()]
    _read_config(run)
    heatmap = _Heatmap()
    _read_metrics(run, heatmap if run_files.UPDATES in run.absent else None)
    _read_memory(run)
    _read_advice(run)
    if run_files.UPDATES not in run.absent:
        _read_updates(run, heatmap)
    run.updates = heatmap.result(run_files.UPDATES if run_files.UPDATES not in run.absent else
                                 "the largest ten updates per step in metrics.jsonl (updates.csv is absent)")
    if heatmap.refused:
        run.notes.append(f"the update heatmap shows the first {MAX_LAYERS} parameter tensors only")
    if run.undrawn_total:
        more = run.undrawn_total - len(run.undrawn)
        run.notes.append(f"{run.undrawn_total} value(s) the report cannot draw or count with (NaN, infinite, beyond "
                         "±1e200, or a count past 2^53), shown here as text and left out of the charts: "
                         + "; ".join(run.undrawn) + (f"; and {more} more" if more else ""))
    return run


def _open_binary(run: RunData, name: str) -> io.FileIO | None:
    """``name`` in the run opened for reading, or None and a note: only where its real path lies inside the run's
    folder (a link leading elsewhere is never opened), and only a regular file (``open_regular``: opened without
    blocking, checked on the open descriptor)."""
    real = Path(os.path.realpath(run.path / name))
    if not lies_inside(run.path, real):
        run.notes.append(f"{name} leads outside the run folder (a link?): not read")
        return None
    try:
        return open_regular(real, limit=2**63 - 1, what=name)
    except NotARegularFile:
        run.notes.append(f"{name} is not a regular file: not read")
    except OSError as error:
        run.notes.append(f"{name} could not be read ({error.strerror or error})")
    return None


def _open(run: RunData, name: str, newline: str | None = "") -> TextIO | None:
    """``name`` in the run (:func:`_open_binary`), as text (``newline=""``: as the csv module reads), or None and a
    note."""
    raw = _open_binary(run, name)
    if raw is None:
        return None
    return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace", newline=newline)


def _read_advice(run: RunData) -> None:
    """``advisor.json``'s rows (module docstring); what cannot be read is a note."""
    if not (run.path / ADVISOR).is_file():
        return
    f = _open_binary(run, ADVISOR)
    if f is None:
        return
    try:
        with f:
            raw = f.read(MAX_ADVISOR_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_ADVISOR_BYTES else None
    except (OSError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or data.get("bigbatch_advisor") != 1 or not isinstance(data.get("rows"), list):
        run.notes.append(f"{ADVISOR} is not an advisor file bigbatch wrote (or could not be read): not drawn")
        return
    rows: list[AdviceRow | None] = [_advice_row(row) for row in data["rows"]]
    kept = [row for row in rows if row is not None]
    if len(kept) < len(rows):
        run.notes.append(f"{ADVISOR}: {len(rows) - len(kept)} of its {len(rows)} rows lack a number the chart needs: "
                         "left out")
    if not kept:
        return
    best = data.get("recommended")
    recommended = rows[best] if type(best) is int and 0 <= best < len(rows) else None
    target, link = data.get("target"), data.get("link")
    relative = not (isinstance(target, dict) and is_number(target.get("s_min")))
    name = as_text(link.get("name")) if isinstance(link, dict) else "?"
    run.advice = Advice(kept, recommended, relative, name)


def _advice_row(row: Any) -> AdviceRow | None:
    """One row of ``advisor.json``, or None where a number the chart needs is missing or not finite."""
    if not isinstance(row, dict):
        return None
    devices, batch = count(row.get("devices")), count(row.get("batch"))
    rate, step, step_sd = (drawable(row.get(key)) for key in ("images_per_s", "step", "step_sd"))
    wall, wall_sd = row.get("wall_s"), drawable(row.get("wall_sd"))
    wall = None if wall is None else drawable(wall)
    if None in (devices, batch, rate, step, step_sd, wall_sd) or not rate > 0 or not step > 0:
        return None
    if row.get("wall_s") is not None and (wall is None or not wall > 0):
        return None
    return AdviceRow(devices, batch, rate, rate * abs(step_sd) / step, wall, abs(wall_sd))


def _read_config(run: RunData) -> None:
    from bigbatch.config import YAMLTooLarge, load_yaml

    if run_files.CONFIG in run.absent:
        return
    f = _open_binary(run, run_files.CONFIG)
    if f is None:
        return
    try:
        with f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        run.notes.append(f"config.yaml could not be read ({error.strerror or error})")
        return
    if len(raw) > MAX_CONFIG_BYTES:
        run.notes.append(f"config.yaml is larger than {MAX_CONFIG_BYTES >> 20} MiB, far more than a config: not read")
        return
    run.config_text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    try:
        config = load_yaml(run.config_text)
    except YAMLTooLarge as error:
        run.notes.append(f"config.yaml refused: {error.problem}; shown as it is, its values unused")
        return
    except (yaml.YAMLError, RecursionError) as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        run.notes.append(f"config.yaml is not valid YAML{where}: shown as it is, its values unused")
        return
    if isinstance(config, dict):
        run.config = config
        for key in ("batch", "world", "steps"):  # what the page computes with
            value = config.get(key)
            if type(value) is int and count(value, low=0) is None:
                _undrawn(run, key, value, run_files.CONFIG)
    else:
        run.notes.append("config.yaml does not hold a mapping of keys: shown as it is, its values unused")


def _lines(f: TextIO) -> Iterator[str | None]:
    """The lines of ``f``, one at a time; None for a line longer than :data:`MAX_LINE` (skipped, never held
    whole)."""
    while line := f.readline(MAX_LINE):
        if len(line) == MAX_LINE and not line.endswith("\n"):
            while (rest := f.readline(MAX_LINE)) and not rest.endswith("\n"):
                pass
            yield None
        else:
            yield line


def _read_metrics(run: RunData, heatmap: _Heatmap | None) -> None:
    """Every line of ``metrics.jsonl``, one at a time: an event (``event``), an evaluation (``split``) or a
    training record (``lr``); ``heatmap``: where the training records' ``top_updates`` go (updates.csv is
    absent)."""
    if run_files.METRICS in run.absent:
        return
    f = _open(run, run_files.METRICS, newline=None)
    if f is None:
        return
    bad: list[int] = []
    bad_count = 0
    back = 0  # training records at or below the highest step before them: a resumed run's repeats
    with f:
        for number, line in enumerate(_lines(f), 1):
            if line is not None and not line.strip():
                continue
            try:
                record = json.loads(line) if line is not None else None
            except (ValueError, RecursionError):  # not JSON; an int of 4,301+ digits; nested too deeply
                record = None
            step = _step(record.get("step")) if isinstance(record, dict) else None
            if step is None or not ("event" in record or "split" in record or "lr" in record):
                bad_count += 1
                if len(bad) < 5:
                    bad.append(number)
            elif "event" in record:
                _event(run, record, step)
            elif "split" in record:
                _evaluation(run, record, step)
            else:
                back += _training(run, record, step, heatmap)
    if bad_count:
        shown = ", ".join(map(str, bad)) + (f" and {bad_count - 5} more" if bad_count > 5 else "")
        run.notes.append(f"metrics.jsonl: {bad_count} line(s) not a bigbatch record, skipped (line {shown}; a run "
                         f"killed while writing leaves its last line cut)")
    if "refused" in run.recorded:
        run.notes.append(f"metrics.jsonl: more than {MAX_SERIES} numeric keys; the first {MAX_SERIES} are kept "
                         f"({run.recorded['refused'][:40]!r} and later ones left out)")
    if back:
        run.notes.append(f"metrics.jsonl: {back} training record(s) repeat an earlier step (a resumed run): the "
                         "charts show each step's last record, the means count every record")


def _series_left(run: RunData, key: str) -> bool:
    """Whether the run may keep one more curve (:data:`MAX_SERIES`); if not, ``key`` is noted as left out."""
    if len(run.curves) + sum(map(len, run.evals.values())) < MAX_SERIES:
        return True
    run.recorded.setdefault("refused", key)
    return False


def _training(run: RunData, record: dict[str, Any], step: int, heatmap: _Heatmap | None) -> int:
    """Put a training record in its curves; 1 if it repeats or goes back to an earlier step, else 0."""
    repeat = run.last is not None and step <= run.last["step"]
    previous = run.recorded.get("previous_train_step")
    if previous is not None and step <= previous and len(run.record_restarts) < MAX_RESTARTS:
        # a resumed run's first record is of the step after its checkpoint's (training_log: the first and every
        # log.every); the one before was as far as the run had got
        run.record_restarts.append(Segment(step=max(step - 1, 0), stopped_at=previous, source="training records"))
    run.recorded["previous_train_step"] = step
    if repeat:  # the last record of a step wins, in every curve
        for curve in run.curves.values():
            curve.drop(step)
        if heatmap is not None:
            heatmap.columns.pop(step, None)
    if run.last is None or step >= run.last["step"]:
        run.last = {**record, "step": step}
    run.train_records += 1
    images = drawable(record.get("images"))
    x = images if images is not None else math.nan
    curves = run.curves
    for key, value in record.items():
        # floats are most values: the fast path; NaN fails both bounds
        number = value if type(value) is float and -MAX_DRAWN <= value <= MAX_DRAWN else drawable(value)
        if number is None or key == "step":
            if number is None and is_number(value):
                _undrawn(run, key, value, f"step {step}")
            continue
        curve = curves.get(key)
        if curve is None:
            if not _series_left(run, key):
                continue
            curve = curves[key] = Curve()
        curve.put(step, x, number)
    run.phases.add(record)
    images = count(record.get("images"), low=0)
    if step and images is not None and step <= run.recorded.get("images_step", step):
        run.recorded["images_step"] = step
        run.recorded["images_batch"] = count(images // step)
    world = count(record.get("world"))  # a number out of range: noted with the curves above
    if world is not None and step >= run.recorded.get("train_world_step", step):
        run.recorded["train_world"], run.recorded["train_world_step"] = world, step  # the highest step's
    updates = record.get("top_updates")
    if heatmap is not None and isinstance(updates, list):
        for update in updates:
            if isinstance(update, dict) and isinstance(update.get("name"), str):
                relative = update.get("relative")
                number = drawable(relative)
                if number is None and is_number(relative):
                    _undrawn(run, f"top_updates {update['name']} relative", relative, f"step {step}")
                heatmap.put(step, update["name"], number or math.nan)
    return int(repeat)


def _evaluation(run: RunData, record: dict[str, Any], step: int) -> None:
    split = str(record["split"])
    curves = run.evals.get(split)
    if curves is None:
        if len(run.evals) >= MAX_KINDS:
            return
        curves = run.evals[split] = {}
    for key, value in record.items():
        if key in ("step", "images", "split") or "/" in key:
            continue
        number = drawable(value)
        if number is None:
            if is_number(value):
                _undrawn(run, f"{split} {key}", value, f"step {step}")
            continue
        if key not in curves and _series_left(run, key):
            curves[key] = Curve()
        if key in curves:
            curves[key].put(step, math.nan, number)
    last = run.last_evals.get(split)
    if last is None or step >= last["step"]:
        run.last_evals[split] = {**record, "step": step}


def _event(run: RunData, record: dict[str, Any], step: int) -> None:
    run.events_total += 1
    if len(run.events) < MAX_EVENTS:
        run.events.append(record)
    kind = str(record["event"])
    if kind in run.last_events or len(run.last_events) < MAX_KINDS:
        run.last_events[kind] = record
    where = f"{as_text(kind)} event, step {step}"
    batch, world = _count(run, record, "batch", where), _count(run, record, "world", where)
    if batch is not None:
        run.recorded["batch"] = batch
    if world is not None:
        run.recorded["event_world"] = world
    if kind in ("out_of_memory", "started", "resumed") and "subdivisions" in record:  # in effect from then on
        subdivisions = record["subdivisions"]
        if not is_number(subdivisions) or count(subdivisions) is not None:  # a number: one to compute with
            run.recorded["subdivisions"] = subdivisions
        else:
            _undrawn(run, "subdivisions", subdivisions, where)
    if kind in ("started", "resumed") and len(run.segments) < MAX_RESTARTS:
        stopped = _event_number(run, record, "stopped_at", where)
        run.segments.append(Segment(
            step=step, resumed=kind == "resumed", world=world, time=_event_number(run, record, "time", where),
            stopped_at=int(stopped) if stopped is not None and abs(stopped) < MAX_STEP else None))
    if kind == "skipped":
        run.skips.put(step, math.nan, _event_number(run, record, "skipped", where) or 0.0)
    if kind == "input_pipeline":
        _event_number(run, record, "share", where)  # the page's "waiting for data"


def _event_number(run: RunData, record: dict[str, Any], key: str, where: str) -> float | None:
    """``record[key]`` as a number the report uses (:func:`drawable`); a number it cannot use is noted."""
    value = record.get(key)
    number = drawable(value)
    if number is None and is_number(value):
        _undrawn(run, key, value, where)
    return number


def _count(run: RunData, record: dict[str, Any], key: str, where: str) -> int | None:
    """``record[key]`` as a count (:func:`count`); a whole number out of its range is noted, anything else (absent,
    not a whole number) is None unnoted, as before."""
    value = record.get(key)
    if type(value) is not int:
        return None
    if count(value) is None:
        _undrawn(run, key, value, where)
    return count(value)


class _Samples:
    """Rows of a file by position, at most :data:`MAX_POINTS`: those whose index is a multiple of ``stride`` and
    the last, the stride doubling when they would be more. A row marked as the last before a gap (a resumed run's
    clock starting again) passes the mark to the row kept before it when it is dropped, so no line crosses it."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []  # [index, gap after it, values]
        self.stride = 1
        self.count = 0

    def add(self, values: list[float]) -> None:
        if self.rows and self.rows[-1][0] % self.stride:  # the last row, kept only while it was the last
            _, gap, _ = self.rows.pop()
            self.rows[-1][1] |= gap
        self.rows.append([self.count, False, values])
        self.count += 1
        while len(self.rows) > MAX_POINTS:
            self.stride *= 2
            kept = [self.rows[0]]
            for row in self.rows[1:-1]:
                if row[0] % self.stride == 0:
                    kept.append(row)
                else:
                    kept[-1][1] |= row[1]
            self.rows = [*kept, self.rows[-1]]

    def gap(self) -> None:
        """A gap after the last row added."""
        self.rows[-1][1] = True


def _csv_lines(f: TextIO) -> Iterator[str]:
    """The lines of a CSV file for the csv module, a line longer than :data:`MAX_LINE` left out."""
    return (line for line in _lines(f) if line is not None)


def _read_memory(run: RunData) -> None:
    """``memory.csv``, a row at a time (blank rows skipped, as ``csv.DictReader`` skips them; of two columns of one
    name, the last, as it keeps it), into at most :data:`MAX_POINTS` samples."""
    if run_files.MEMORY in run.absent:
        return
    f = _open(run, run_files.MEMORY)
    if f is None:
        return
    samples = _Samples()
    names: list[str] = []
    start = None  # the first finite time
    breaks: list[tuple[float, float]] = []  # the times of the last sample before a restart of the clock and the next
    last_time, last_step = math.nan, math.nan
    with f:
        reader = csv.reader(_csv_lines(f))
        try:
            header = next(reader, [])
            names = list(dict.fromkeys(name for name in header if name))[:MAX_SERIES]
            chosen = set(names)
            where = {name: i for i, name in enumerate(header) if name in chosen}
            previous = math.nan
            for row in reader:
                if not row:
                    continue
                values = [_cell(run, name, row[where[name]] if where[name] < len(row) else None, run_files.MEMORY,
                                reader.line_num) for name in names]
                sample = dict(zip(names, values, strict=True))
                if start is None and math.isfinite(sample.get("time", math.nan)):
                    start = sample["time"]
                elapsed, step = sample.get("elapsed_s", math.nan), sample.get("step", math.nan)
                # a resumed run appends with its own clock (and from its checkpoint's step): no line across the gap
                if elapsed < previous or step < last_step:
                    samples.gap()
                    now = sample.get("time", math.nan)
                    if len(run.clock_restarts) < MAX_RESTARTS:
                        run.clock_restarts.append(Segment(
                            step=int(step) if math.isfinite(step) and abs(step) < MAX_STEP else 0,
                            time=now if math.isfinite(now) else None, source=run_files.MEMORY,
                            stopped_at=int(last_step) if math.isfinite(last_step) and abs(last_step) < MAX_STEP
                            else None))
                        if math.isfinite(last_time) and math.isfinite(now):
                            breaks.append((last_time, now))
                previous = elapsed
                last_time, last_step = sample.get("time", math.nan), sample.get("step", math.nan)
                samples.add(values)
        except csv.Error as error:
            run.notes.append(f"memory.csv: line {reader.line_num} could not be read ({error}); the samples before "
                             "it are plotted")
    if not samples.count:
        run.notes.append("memory.csv holds no samples")
        return
    columns = {name: [row[2][i] for row in samples.rows] for i, name in enumerate(names)}
    if start is not None:
        minutes = [(t - start) / 60 for t in columns["time"]]
        run.memory_breaks = [((before - start) / 60, (after - start) / 60) for before, after in breaks]
    elif "elapsed_s" in columns:
        minutes = [t / 60 for t in columns["elapsed_s"]]
    else:
        minutes = [float(row[0]) for row in samples.rows]
        run.notes.append("memory.csv has neither time nor elapsed_s: plotted by sample")
    run.memory = {"minutes": [math.nan if row[1] else m for row, m in zip(samples.rows, minutes, strict=True)],
                  **columns}


def _cell(run: RunData, name: str, text: str | None, file: str, line: int) -> float:
    """A CSV cell as a number to draw; NaN for an empty cell (not measured), one that is not a number, and one the
    report cannot draw (noted: :func:`drawable`)."""
    if not text:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        return math.nan
    if -MAX_DRAWN <= value <= MAX_DRAWN:
        return value
    _undrawn(run, name, text.strip(), f"{file} line {line}")
    return math.nan


def _read_updates(run: RunData, heatmap: _Heatmap) -> None:
    f = _open(run, run_files.UPDATES)
    if f is None:
        return
    with f:
        reader = csv.DictReader(_csv_lines(f))
        try:
            for row in reader:
                try:
                    step = int(row["step"])
                    name = row["name"]
                except (KeyError, TypeError, ValueError):
                    continue
                if abs(step) >= MAX_STEP or not isinstance(name, str):
                    continue
                heatmap.put(step, name, _cell(run, f"relative of {name}", row.get("relative"), run_files.UPDATES,
                                              reader.line_num))
        except csv.Error as error:
            run.notes.append(f"updates.csv: line {reader.line_num} could not be read ({error}); the rows before it "
                             "are drawn")


def read_runs(paths: list[Path]) -> list[RunData]:
    """Read every run and give each a unique label: its folder's name, with its parent's where two share one."""
    runs = [read_run(Path(path)) for path in paths]
    names = [run.path.resolve().name or str(run.path) for run in runs]
    labels = []
    for run, name in zip(runs, names, strict=True):
        parent = run.path.resolve().parent.name
        labels.append(f"{parent}/{name}" if names.count(name) > 1 and parent else name)
    seen: dict[str, int] = {}
    for run, label in zip(runs, labels, strict=True):
        seen[label] = seen.get(label, 0) + 1
        run.label = printable(label if labels.count(label) == 1 else f"{label} #{seen[label]}")
    return runs


def printable(name: str) -> str:
    """Text holding a file name, to draw and write: a byte of the name that is not UTF-8 (Python keeps it as a lone
    surrogate, which matplotlib's fonts and a UTF-8 page refuse) written as ``\\xff``; the rest as it is."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
