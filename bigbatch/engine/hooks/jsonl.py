"""``metrics.jsonl``: every record, one JSON object a line (main process); each start of the process (a run's
first, and every resume) begins with a record of where and on how many processes it starts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bigbatch.engine.events import Record
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.engine.run_dir import check_run_file
from bigbatch.floor import run_files
from bigbatch.floor.files import naming
from bigbatch.floor.outputs import keep_lines
from bigbatch.registry import HOOKS


def truncate_metrics(path: Path, last_step: int) -> int | None:
    """Drop records past ``last_step`` (written by a run that died after its last checkpoint), and a line a kill
    cut short -> the highest step a record of the file had before (how far the run that wrote it got), or None
    (no file, or no record in it)."""
    if not path.exists():
        return None
    highest: int | None = None

    def keep(line: str) -> bool:
        nonlocal highest
        step = record_step(line)
        if step is not None and (highest is None or step > highest):
            highest = step
        return step is not None and step <= last_step

    keep_lines(path, keep)
    return highest


def record_step(line: str) -> int | None:
    """The ``step`` of a record's line, or None for a line that is not a whole record."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def segment_record(run: Run, highest: int | None) -> tuple[str, dict[str, Any], str]:
    """What the process's start records (``event``, values, message): ``started`` at step 0 or ``resumed`` at the
    checkpoint's step, the ``world`` size (a resumed run may run on another one) with the ``subdivisions`` and
    ``micro_batch`` in effect on it (``engine/relaunch.py``), the wall-clock ``time``, and
    ``stopped_at``: the highest step the file recorded before (where an interrupted run got to), if any."""
    step, world = run.progress.step, run.proc.world
    step_in_effect = run.train_step
    values: dict[str, Any] = {"world": world, "subdivisions": step_in_effect.subdivisions,
                              "micro_batch": run.plan.micro_batch // step_in_effect.split,
                              "time": round(time.time(), 3)}
    processes = f"{world} process{'es' if world != 1 else ''}"
    if highest is not None:
        values["stopped_at"] = highest
    if not step:
        return "started", values, f"started on {processes}"
    before = f"; the run before had recorded up to step {highest}" if highest is not None else ""
    return "resumed", values, f"running on {processes}{before}"


class JsonLines(Hook):
    """``metrics.jsonl``: every record as one JSON line, a resumed run's cut back to its checkpoint first."""

    stage = "write"

    def before_train(self, run: Run) -> None:
        path = run.out_dir / run_files.METRICS
        check_run_file(run.out_dir, run_files.METRICS)  # cut back and appended to only in a folder bigbatch wrote
        highest = truncate_metrics(path, run.progress.step)
        self.file = open(path, "a", encoding="utf-8")
        run.events.event(run.progress.step, *segment_record(run, highest))

    def write(self, record: Record) -> None:
        with naming(self.file.name):  # a full disk: one line naming metrics.jsonl
            self.file.write(json.dumps(record.values) + "\n")
            self.file.flush()

    def close(self, run: Run) -> None:
        self.file.close()


HOOKS.register("metrics_jsonl", lambda run: JsonLines() if run.proc.is_main else None)
