"""A resumed run remembers what its hooks learned: after an interruption and ``--resume``, the noise scale's running
averages and the memory log's baseline (the first evaluation's step) are the uninterrupted run's, and so is every
deterministic field of every training and evaluation record. An older checkpoint, without hook states, still
resumes: its hooks start fresh."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import pytest
import torch

from bigbatch.cli import main
from bigbatch.engine.hooks import Hook, Hooks
from bigbatch.engine.hooks.memory import MemoryLog
from bigbatch.errors import UserError
from bigbatch.registry import HOOKS

STEPS, INTERRUPT_AT, CHECKPOINT_EVERY = 20, 12, 5  # the run resumes from step 10: steps 11 and 12 are run twice
ARGS = ["digits", "--set", f"steps={STEPS}", "batch=32", "subdivisions=2", "data.size=16", "model.width=8",
        "log.tensorboard=false", "log.every=1", "log.noise_scale=true", "eval.every=5",
        f"checkpoint.every={CHECKPOINT_EVERY}", "memory.interval=60"]

NOT_DETERMINISTIC = ("images_per_s", "t_*")
"""Record fields that are wall-clock readings (throughput, the phase and data-wait times): left out of the
comparison. The training records hold no memory readings (those are in memory.csv and the end-of-run events)."""


class Interrupt(Hook):
    """Ctrl-C once the record of step INTERRUPT_AT is written (after every built-in hook): past the last
    checkpoint, as a real interruption is."""

    stage = "write"

    def after_step(self, run):
        if run.state.step == INTERRUPT_AT:
            raise KeyboardInterrupt


def records(out: Path) -> list[dict]:
    """The training and evaluation records of metrics.jsonl, without their wall-clock fields."""
    kept = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "event" not in record:
            kept.append({k: v for k, v in record.items()
                         if not any(fnmatch.fnmatch(k, pattern) for pattern in NOT_DETERMINISTIC)})
    return kept


def update_rows(out: Path) -> list[tuple[str, str]]:
    """``(step, name)`` of each row of updates.csv, the header first."""
    return [tuple(line.split(",")[:2]) for line in (out / "updates.csv").read_text().splitlines()]


def hook_states(out: Path) -> dict:
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True).get("hooks")


def test_a_resumed_run_keeps_what_its_hooks_learned(tmp_path):
    reference = tmp_path / "reference"
    assert main(["train", *ARGS, "--out", str(reference)]) == 0

    interrupted = tmp_path / "interrupted"
    HOOKS.register("toy_interrupt", lambda run: Interrupt())
    try:
        assert main(["train", *ARGS, "--out", str(interrupted)]) == 130
    finally:
        HOOKS.unregister("toy_interrupt")
    assert max(r["step"] for r in records(interrupted)) == INTERRUPT_AT
    assert torch.load(interrupted / "checkpoints" / "last.pt", weights_only=True)["step"] == 10
    older = tmp_path / "older"  # the same checkpoint as a bigbatch without hook states wrote it
    shutil.copytree(interrupted, older)
    state = torch.load(older / "checkpoints" / "last.pt", weights_only=True)
    state.pop("hooks", None)
    torch.save(state, older / "checkpoints" / "last.pt")

    assert main(["train", "--resume", str(interrupted)]) == 0
    expected, actual = records(reference), records(interrupted)
    assert [r["step"] for r in actual] == [r["step"] for r in expected]
    assert sum("noise_scale" in r for r in expected) > STEPS - CHECKPOINT_EVERY  # defined after the resume point
    for want, got in zip(expected, actual, strict=True):
        assert got == want, f"step {want['step']}"
    # updates.csv: the rows of the steps run twice are there once, as in the uninterrupted run
    assert update_rows(interrupted) == update_rows(reference)
    saved = hook_states(reference)
    assert saved["noise_scale"]["steps"] == STEPS and saved["memory_log"] == {"first_eval": 5}
    assert hook_states(interrupted) == saved

    # An older checkpoint resumes too, its hooks fresh: the averages count the steps after the resume only, and the
    # memory baseline is the resumed process's first evaluation.
    assert main(["train", "--resume", str(older)]) == 0
    fresh = hook_states(older)
    assert fresh["noise_scale"]["steps"] == STEPS - 10 and fresh["memory_log"] == {"first_eval": 15}


def test_a_saved_hook_state_that_does_not_fit_is_one_error_naming_the_hook():
    hooks = Hooks(None, [MemoryLog()], ["memory_log"])
    hooks.load_state_dict({"another_hook": {"x": 1}})  # no state of its own: it starts fresh
    assert hooks.state_dict() == {"memory_log": {"first_eval": None}}
    hooks.load_state_dict({"memory_log": {"first_eval": 7}})
    assert hooks.state_dict() == {"memory_log": {"first_eval": 7}}
    with pytest.raises(UserError, match="hook 'memory_log' does not fit"):
        hooks.load_state_dict({"memory_log": {"baseline": 7}})


def test_a_resume_drops_log_lines_past_the_checkpoint_and_a_line_a_kill_cut(tmp_path):
    from bigbatch.engine.hooks.jsonl import truncate_metrics
    from bigbatch.telemetry.update_sizes import drop_rows_after

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "lr": 0.1}\n{"step": 2, "lr": 0.2}\n{"step": 3, "lr": 0.3}\n{"step": 4, "l')
    truncate_metrics(metrics, 2)
    assert metrics.read_text() == '{"step": 1, "lr": 0.1}\n{"step": 2, "lr": 0.2}\n'
    updates = tmp_path / "updates.csv"
    updates.write_text("step,name,max_abs,relative\n1,a.weight,0.1,0.01\n1,\"b,c\",0.2,\n3,a.weight,0.1,0.01\n3,a.we")
    assert drop_rows_after(updates, 2) == 2
    assert updates.read_text() == 'step,name,max_abs,relative\n1,a.weight,0.1,0.01\n1,"b,c",0.2,\n'
    mine = tmp_path / "mine.csv"  # not an update-size log: left as it is
    mine.write_text("my,own\n9,rows\n")
    assert drop_rows_after(mine, 2) == 0 and mine.read_text() == "my,own\n9,rows\n"
