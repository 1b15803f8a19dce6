"""``metrics.jsonl``: every record, one JSON object a line (main process)."""

from __future__ import annotations

import json
from pathlib import Path

from bigbatch.engine.events import Record
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.outputs import keep_lines
from bigbatch.registry import HOOKS


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records past ``last_step`` (written by a run that died after its last checkpoint), and a line a kill
    cut short."""
    if path.exists():
        keep_lines(path, lambda line: record_step(line) is not None and record_step(line) <= last_step)


def record_step(line: str) -> int | None:
    """The ``step`` of a record's line, or None for a line that is not a whole record."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


class JsonLines(Hook):
    stage = "write"

    def before_train(self, run: Run) -> None:
        path = run.out_dir / "metrics.jsonl"
        truncate_metrics(path, run.state.step)
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self.file.write(json.dumps(record.values) + "\n")
        self.file.flush()

    def close(self, run: Run) -> None:
        self.file.close()


HOOKS.register("metrics_jsonl", lambda run: JsonLines() if run.proc.is_main else None)
