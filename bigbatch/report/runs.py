"""A run directory read for the report: what each file holds, what is absent, and what could not be read.

Reading never fails on a run's contents: a crashed run's half-written last line, a column added by a later version,
a file that is absent, each becomes a note the report shows. Only a folder that is not a run at all (neither
``config.yaml`` nor ``metrics.jsonl``) is a :class:`~bigbatch.errors.UserError`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bigbatch.errors import UserError

PHASES = ("data", "forward", "backward", "sync", "update", "other")
"""The disjoint phases of a step, in the order the step runs them (``engine/phases.py``); ``t_step`` is their sum."""

FILES = ("config.yaml", "metrics.jsonl", "memory.csv", "updates.csv")
"""The files of a run directory the report reads."""


@dataclass
class Updates:
    """Per-layer update sizes: ``relative[i][j]`` is layer ``layers[i]`` at step ``steps[j]`` (NaN: not measured)."""

    steps: list[int]
    layers: list[str]
    relative: list[list[float]]
    source: str
    """``updates.csv``, or the training records' ``top_updates`` (the largest ten per step) when it is absent."""


@dataclass
class RunData:
    path: Path
    label: str = ""
    """How charts and tables name the run: its folder's name, made unique among the runs of one report."""
    config: dict[str, Any] = field(default_factory=dict)
    config_text: str | None = None
    train: list[dict[str, Any]] = field(default_factory=list)
    """Training records (those with ``lr``), one per step (a resumed run's repeated steps: the last), by step."""
    evals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Evaluation records by ``split`` (``val``, ``val_ema``, ...), one per step, by step."""
    events: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, list[float]] = field(default_factory=dict)
    """``memory.csv`` by column; ``minutes``: since the first sample (NaN where a resumed run starts again)."""
    updates: Updates | None = None
    absent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # --- what the header shows -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.path.name)

    @property
    def task(self) -> str | None:
        return self.config.get("task")

    @property
    def batch(self) -> int | None:
        batch = self.config.get("batch")
        if isinstance(batch, int) and batch > 0:
            return batch
        batches = [e["batch"] for e in self.events if isinstance(e.get("batch"), int)]
        if batches:
            return batches[-1]
        for record in self.train:  # images = step x batch in every training record
            if record.get("step") and isinstance(record.get("images"), int):
                return record["images"] // record["step"]
        return None

    @property
    def subdivisions(self) -> Any:
        subdivisions = self.config.get("subdivisions")
        recut = [e["subdivisions"] for e in self.events if e.get("event") == "out_of_memory" and "subdivisions" in e]
        return recut[-1] if recut else subdivisions

    @property
    def world(self) -> int | None:
        """The number of processes, where the run recorded it (``world`` in the config or a record)."""
        for source in (self.config, *reversed(self.events), *reversed(self.train)):
            if isinstance(source.get("world"), int):
                return source["world"]
        return None

    @property
    def planned_steps(self) -> int | None:
        steps = self.config.get("steps")
        return steps if isinstance(steps, int) else None

    @property
    def steps_done(self) -> int | None:
        return self.train[-1]["step"] if self.train else None

    @property
    def images_seen(self) -> int | None:
        if not self.train:
            return None
        images = self.train[-1].get("images")
        return images if isinstance(images, int) else None

    def images_at(self, step: float) -> float | None:
        """The training images seen after ``step`` optimizer steps: step x batch (the batch is fixed for a run)."""
        batch = self.batch
        return None if batch is None else step * batch

    def event(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    def series(self, key: str) -> tuple[list[float], list[float], list[float]]:
        """``(steps, images, values)`` of the training records holding a number under ``key``."""
        rows = [r for r in self.train if _number(r.get(key)) is not None]
        steps = [float(r["step"]) for r in rows]
        images = [float(r["images"]) if _number(r.get("images")) is not None else math.nan for r in rows]
        return steps, images, [float(r[key]) for r in rows]

    def phase_means(self) -> tuple[dict[str, float], int] | None:
        """Mean seconds per step of each phase and of the whole step (``t_step``), over the training records that
        hold phase times, the first of them excepted when there are more (it warms up: allocations, first kernels;
        the run's own table leaves it out too) -> ``({"data": s, ..., "step": s}, records)``, or None. ``bn_sync`` (the
        cross-device BN all-reduces, inside forward and backward) is there when the records have it."""
        rows = [r for r in self.train if any(_number(r.get(f"t_{p}")) is not None for p in PHASES if p != "data")]
        if len(rows) > 1:
            rows = rows[1:]
        if not rows:
            return None
        sums = dict.fromkeys((*PHASES, "step"), 0.0)
        for row in rows:
            times = {p: _number(row.get(f"t_{p}")) or 0.0 for p in PHASES}
            total = _number(row.get("t_step"))
            if total is None:
                total = sum(times.values())
            if _number(row.get("t_other")) is None:  # older records: the rest of the step is "other"
                times["other"] = max(0.0, total - sum(times.values()))
            for phase, seconds in times.items():
                sums[phase] += seconds
            sums["step"] += total
        means = {key: value / len(rows) for key, value in sums.items()}
        synced = [inside for row in rows if (inside := _number(row.get("t_bn_sync"))) is not None]
        if synced:  # a sub-phase, inside forward and backward: the mean over the records that have it
            means["bn_sync"] = sum(synced) / len(synced)
        return means, len(rows)


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (booleans, strings, NaN, absent)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_run(path: Path) -> RunData:
    """Read the run directory ``path`` (see the module docstring)."""
    if not path.exists():
        raise UserError(f"report: {path} does not exist; give a bigbatch run directory (the --out of bigbatch train)")
    if not path.is_dir() or not ((path / "config.yaml").is_file() or (path / "metrics.jsonl").is_file()):
        raise UserError(f"report: {path} is not a bigbatch run directory (it holds neither config.yaml nor "
                        f"metrics.jsonl)")
    run = RunData(path=path)
    run.absent = [name for name in FILES if not (path / name).is_file()]
    _read_config(run)
    _read_metrics(run)
    _read_memory(run)
    _read_updates(run)
    return run


def _read_text(run: RunData, name: str) -> str | None:
    try:
        return (run.path / name).read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        run.notes.append(f"{name} could not be read ({error.strerror or error})")
        return None


def _read_config(run: RunData) -> None:
    if "config.yaml" in run.absent:
        return
    run.config_text = _read_text(run, "config.yaml")
    if run.config_text is None:
        return
    try:
        config = yaml.safe_load(run.config_text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        run.notes.append(f"config.yaml is not valid YAML{where}: shown as it is, its values unused")
        return
    if isinstance(config, dict):
        run.config = config
    else:
        run.notes.append("config.yaml does not hold a mapping of keys: shown as it is, its values unused")


def _read_metrics(run: RunData) -> None:
    if "metrics.jsonl" in run.absent:
        return
    text = _read_text(run, "metrics.jsonl")
    if text is None:
        return
    train: dict[int, dict[str, Any]] = {}
    evals: dict[str, dict[int, dict[str, Any]]] = {}
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        if not isinstance(record, dict) or _number(record.get("step")) is None:
            bad.append(number)
            continue
        if "event" in record:
            run.events.append(record)
        elif "split" in record:
            evals.setdefault(str(record["split"]), {})[int(record["step"])] = record
        elif "lr" in record:
            train[int(record["step"])] = record  # a resumed run repeats the steps after its checkpoint: the last wins
        else:
            bad.append(number)
    run.train = [train[step] for step in sorted(train)]
    run.evals = {split: [by_step[s] for s in sorted(by_step)] for split, by_step in evals.items()}
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        run.notes.append(f"metrics.jsonl: {len(bad)} line(s) not a bigbatch record, skipped (line {shown}; a run "
                         f"killed while writing leaves its last line cut)")


def _read_memory(run: RunData) -> None:
    if "memory.csv" in run.absent:
        return
    text = _read_text(run, "memory.csv")
    if text is None:
        return
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        run.notes.append("memory.csv holds no samples")
        return
    columns: dict[str, list[float]] = {name: [] for name in rows[0] if name}
    for row in rows:
        for name in columns:
            try:
                value = float(row.get(name) or "nan")
            except ValueError:
                value = math.nan
            columns[name].append(value)
    if "time" in columns and any(math.isfinite(t) for t in columns["time"]):
        start = next(t for t in columns["time"] if math.isfinite(t))
        minutes = [(t - start) / 60 for t in columns["time"]]
    elif "elapsed_s" in columns:
        minutes = [t / 60 for t in columns["elapsed_s"]]
    else:
        minutes = [float(i) for i in range(len(rows))]
        run.notes.append("memory.csv has neither time nor elapsed_s: plotted by sample")
    elapsed = columns.get("elapsed_s", [])
    for i in range(1, len(elapsed)):  # a resumed run appends with its own clock: no line across the gap
        if elapsed[i] < elapsed[i - 1]:
            minutes[i - 1] = math.nan
    run.memory = {"minutes": minutes, **columns}


def _read_updates(run: RunData) -> None:
    cells: dict[tuple[int, str], float] = {}
    if "updates.csv" not in run.absent:
        text = _read_text(run, "updates.csv")
        if text is None:
            return
        source = "updates.csv"
        for row in csv.DictReader(text.splitlines()):
            try:
                step = int(row["step"])
                name = row["name"]
            except (KeyError, TypeError, ValueError):
                continue
            try:
                cells[step, name] = float(row.get("relative") or "nan")
            except ValueError:
                cells[step, name] = math.nan
    else:
        source = "the largest ten updates per step in metrics.jsonl (updates.csv is absent)"
        for record in run.train:
            for update in record.get("top_updates") or []:
                if isinstance(update, dict) and isinstance(update.get("name"), str):
                    cells[int(record["step"]), update["name"]] = _number(update.get("relative")) or math.nan
    if not cells:
        return
    layers = list(dict.fromkeys(name for _, name in cells))  # the order they were written in: the model's
    steps = sorted({step for step, _ in cells})
    relative = [[cells.get((step, layer), math.nan) for step in steps] for layer in layers]
    run.updates = Updates(steps=steps, layers=layers, relative=relative, source=source)


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
        run.label = label if labels.count(label) == 1 else f"{label} #{seen[label]}"
    return runs
