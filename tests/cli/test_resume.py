"""A real ``bigbatch train`` killed with SIGKILL and resumed ends bit-identical to an
uninterrupted run with the same seed (CPU)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import torch

from tests.helpers import HANG_GUARD_S, PAUSE_AT, PAUSING_BIGBATCH, ROOT, run_main

STEPS = 60
ARGS = [
    "digits", "--set", f"steps={STEPS}", "batch=64", "subdivisions=4", "data.size=16", "model.width=8",
    "checkpoint.every=5", "eval.every=10", "log.every=1", "log.tensorboard=false",
    # the recipe's stateful pieces must resume exactly too
    "optim.name=momentum", "optim.momentum_correction=true", "schedule.warmup=[{kind: linear, length: 8}]",
    "schedule.decay.kind=cosine", "clip.max_norm=1.0", "ema.decay=0.9", "ema.warmup=true",
    "norm.running_stats=per_step", "model.dropout=0.3",  # dropout draws from the global torch RNG
]


WALL_CLOCK_EVENTS = ("memory_growth",)
"""Events whose presence depends on wall-clock time: the memory trend needs enough samples (taken every
``memory.interval`` seconds) after the first evaluation, which a busy machine may or may not give a run."""
ONLY_RESUMED = ("resumed",)
"""The record of the resume (where, on how many processes), which the run that was never interrupted has not."""


def metrics_steps(path) -> list[int]:
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in records if r.get("event") not in WALL_CLOCK_EVENTS + ONLY_RESUMED]


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    reference = run_main("train", *ARGS, "--out", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr

    run_dir = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    with open(tmp_path / "killed.stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", PAUSING_BIGBATCH, "train", *ARGS, "--out", str(run_dir)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        paused = "paused" in (line.strip() for line in proc.stdout)  # reads up to "paused", or to the end
        assert paused, (tmp_path / "killed.stderr").read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HANG_GUARD_S)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert max(metrics_steps(run_dir / "metrics.jsonl")) == PAUSE_AT
    killed_at = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert killed_at == 10

    resumed = run_main("train", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr

    expected = torch.load(tmp_path / "reference" / "checkpoints" / "last.pt", weights_only=True)
    actual = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert actual["step"] == expected["step"] == STEPS
    assert expected["model"].keys() == actual["model"].keys()
    for key, value in expected["model"].items():
        assert torch.equal(value, actual["model"][key]), key
    for key, value in expected["ema"]["module"].items():
        assert torch.equal(value, actual["ema"]["module"][key]), key
    # The metrics log reads as one run: each step once, in order.
    steps = [s for s in metrics_steps(run_dir / "metrics.jsonl")]
    train_steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   if "loss" in line and "split" not in line]
    assert train_steps == list(range(1, STEPS + 1))
    assert steps == metrics_steps(tmp_path / "reference" / "metrics.jsonl")


class Terminal(io.StringIO):
    """stderr as a terminal: the console draws its progress bar (tqdm) into it."""

    def isatty(self) -> bool:
        return True


def test_ctrl_c_says_the_checkpoint_kept_the_steps_lost_and_the_command_that_resumes(tmp_path, monkeypatch):
    """Interrupted after step 5 with its checkpoint at step 4: the progress bar is closed before the summaries (drawn
    once more at most, not after each), the last lines say what is kept and print the command; that command, run as
    printed, starts with "resumed from step 4 of 8"."""
    import contextlib
    import shlex

    from bigbatch.cli import main
    from bigbatch.registry import HOOKS
    from tests.helpers import StopAfter

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    settings = ["data.size=8", "model.width=4", "subdivisions=2", "batch=64", "steps=8", "eval.every=100",
                "checkpoint.every=2", "log.tensorboard=false", "memory.interval=60"]
    stdout, stderr = io.StringIO(), Terminal()
    HOOKS.register("stop_after_5", lambda run: StopAfter(5))
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["train", "digits", "--out", str(out), "--set", *settings])
    finally:
        HOOKS.unregister("stop_after_5")
    assert code == 130
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["step"] == 4
    err = stderr.getvalue()
    assert err.endswith(f"interrupted after step 5 of 8; kept: {out / 'checkpoints' / 'last.pt'} at step 4 (the 1 "
                        f"step after it will run again); resume with:\n  bigbatch train --resume {out}\n"), err[-500:]
    assert "input pipeline: waited" in stdout.getvalue()  # a summary after the steps
    assert err.count("5/8 [") <= 2, err  # the bar's last state: drawn when it got there, and once as it closed
    command = err.splitlines()[-1].split()
    resumed = run_main(*command[1:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == f"resumed from step 4 of 8 ({out / 'checkpoints' / 'last.pt'})"
    assert shlex.join(command) == f"bigbatch train --resume {out}"


def test_sigterm_stops_a_run_as_ctrl_c_does_saying_what_is_kept(tmp_path):
    """``kill``, ``timeout`` and a scheduler's stop send SIGTERM: the run died at once with exit code 143 and no
    word; it now stops as Ctrl-C stops it (the checkpoints written reach the disk, the last lines say what is kept and
    the command that resumes), with SIGTERM's exit code, 143."""
    import time

    from tests.helpers import bigbatch_command

    out = tmp_path / "run"
    settings = ["data.size=8", "model.width=4", "subdivisions=1", "batch=64", "steps=100000", "eval.every=100000",
                "checkpoint.every=1", "log.tensorboard=false", "memory.interval=60"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    process = subprocess.Popen(bigbatch_command("train", "digits", "--out", str(out), "--set", *settings), cwd=ROOT,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        last = out / "checkpoints" / "last.pt"
        waited = 0.0
        while not last.exists() and process.poll() is None and waited < HANG_GUARD_S:  # a hang guard, not a speed
            time.sleep(0.2)
            waited += 0.2
        assert last.exists(), process.communicate(timeout=HANG_GUARD_S)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=HANG_GUARD_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr[-2000:]
    assert "interrupted after step" in stderr and stderr.endswith(f"resume with:\n  bigbatch train --resume {out}\n"), \
        stderr[-1000:]
    kept = torch.load(last, weights_only=True)["step"]
    assert f"kept: {last} at step {kept}" in stderr
