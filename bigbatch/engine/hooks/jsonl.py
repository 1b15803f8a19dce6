"""``metrics.jsonl``: every record, one JSON object a line (main process)."""

from __future__ import annotations

import json
from pathlib import Path

from bigbatch.engine.events import Record
from bigbatch.engine.hooks.base import Hook
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records past ``last_step`` (written by a run that died after its last checkpoint)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


class JsonLines(Hook):
    def before_train(self, run: Run) -> None:
        path = run.out_dir / "metrics.jsonl"
        truncate_metrics(path, run.state.step)
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self.file.write(json.dumps(record.values) + "\n")
        self.file.flush()

    def close(self, run: Run) -> None:
        self.file.close()


HOOKS.register("metrics_jsonl", lambda run: JsonLines() if run.proc.is_main else None, order=60)
