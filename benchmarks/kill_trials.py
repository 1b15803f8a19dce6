"""Kill a real ``bigbatch train`` with SIGKILL at random moments, start it again, and check that nothing is lost.

Each trial starts a short digits run in its own folder, kills it after a random delay (a moment in data loading,
a step, an evaluation or a checkpoint write, wherever it falls), then runs the same command again, which resumes
from the last checkpoint (or starts over when none was written yet); up to ``--kills`` kills per trial. A trial
passes when the final checkpoint is bit-identical to an uninterrupted run's, every checkpoint seen after a kill
loaded (``weights_only=True``) with weights and step from the same write, no temporary checkpoint file is left,
and metrics.jsonl holds each training step once, in order.

    .venv/bin/python benchmarks/kill_trials.py --trials 10 --kills 2

Results: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SETTINGS = ["steps=24", "batch=64", "subdivisions=4", "data.size=16", "model.width=8", "checkpoint.every=3",
            "eval.every=8", "log.every=1", "log.tensorboard=false", "memory.interval=0.2", "ema.decay=0.9",
            "norm.running_stats=per_step", "model.dropout=0.2"]


def command(out: Path) -> list[str]:
    return [sys.executable, "-m", "bigbatch", "train", "digits", "--out", str(out), "--set", *SETTINGS]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}


def run_to_end(out: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command(out), env=env(), check=True, capture_output=True)
    return time.perf_counter() - started


def trial(out: Path, reference: dict, duration: float, kills: int, rng: random.Random) -> list[str]:
    """Kill ``kills`` times, then finish; the problems found (none: the trial passed)."""
    problems = []
    for _ in range(kills):
        proc = subprocess.Popen(command(out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, duration))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        last = out / "checkpoints" / "last.pt"
        if last.exists():
            state = torch.load(last, weights_only=True)  # a partial file would raise here
            if state["data"]["step"] != state["step"]:
                problems.append("a checkpoint mixes two writes")
    subprocess.run(command(out), env=env(), check=True, capture_output=True)
    final = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    if any(not torch.equal(v, final["model"][k]) for k, v in reference["model"].items()):
        problems.append("final weights differ from the uninterrupted run")
    left = [p.name for p in (out / "checkpoints").iterdir() if ".tmp-" in p.name]
    if left:
        problems.append(f"temporary files left: {left}")
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line and '"split"' not in line]
    if steps != list(range(1, 25)):
        problems.append(f"metrics.jsonl training steps {steps}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kills", type=int, default=2, help="kills per trial before it may finish")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        duration = run_to_end(root / "reference")
        reference = torch.load(root / "reference" / "checkpoints" / "last.pt", weights_only=True)
        print(f"uninterrupted run: {duration:.1f} s; kills at uniform(0.2, {duration:.1f}) s after each start")
        passed = 0
        for i in range(args.trials):
            problems = trial(root / f"trial{i}", reference, duration, args.kills, rng)
            passed += not problems
            print(f"trial {i}: {'ok' if not problems else '; '.join(problems)}", flush=True)
    print(f"{passed}/{args.trials} trials passed ({args.trials * args.kills} kills)")


if __name__ == "__main__":
    main()
