"""Behaviour check for a refactor: the same short runs, before and after, give the same checkpoints and records.

Runs 20 steps of `digits`, `shapes-detect` and `yolov3-tiny-shapes` (evaluation and checkpoints every 10 steps,
on a small generated shapes set), and two runs whose batch moves: `digits` under a batch schedule (`schedule.batch`,
the batch doubling at step 10) and an AdaScale run whose batch grows (`batch: {mode: adaptive, grow: true}`: 80 base
steps of 16, growing after step 20 and again after step 41), with the `bigbatch` this Python imports (a venv per
tree: an editable install wins over PYTHONPATH),
and writes a summary of each run: the sha256 of every checkpoint and the parsed metrics.jsonl records with the
fields a machine's clock and memory decide left out (WALL_CLOCK_FIELDS).

    /path/to/old/tree/.venv/bin/python benchmarks/behaviour_check.py run --out /tmp/before
    .venv/bin/python benchmarks/behaviour_check.py run --out /tmp/after
    .venv/bin/python benchmarks/behaviour_check.py compare /tmp/before /tmp/after

`compare` exits 1 naming the first difference, 0 when every checkpoint is byte-identical and every record equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

COMMON = ["steps=20", "eval.every=10", "checkpoint.every=10", "data.workers=0"]
SHAPES = ["data.shapes_images=200", "data.path=shapes"]  # relative: the same config wherever it runs
RUNS = {
    "digits": ["digits", *COMMON],
    "shapes-detect": ["shapes-detect", *COMMON, *SHAPES],
    "yolov3-tiny-shapes": ["yolov3-tiny-shapes", *COMMON, *SHAPES],
    "digits-batch-schedule": ["digits", *COMMON, "subdivisions=2", "schedule.batch=[{at: 10, factor: 2}]"],
    "digits-adascale-grow": ["digits", "batch={mode: adaptive, base: 16, max: 128, grow: true}", "subdivisions=2",
                             "steps=80", "data.size=16", "model.width=8", "eval.every=0.2 epochs",
                             "checkpoint.every=12", "ema.decay=0.9", "optim.name=momentum", "data.workers=0"],
}
"""Each run: the recipe, then its ``--set`` overrides."""
RECIPES = tuple(RUNS)

WALL_CLOCK_FIELDS = ("images_per_s", "memory", "rss", "cuda", "time")
"""Record fields (and prefixes: ``t_*`` times, ``memory_*``, ``rss_*``, ``peak_*``) that depend on the machine's
clock and memory, not on the code's behaviour (``time``: the wall clock of a ``started`` or ``resumed`` event)."""
WALL_CLOCK_PREFIXES = ("t_", "memory_", "rss_", "cuda_", "peak_")
WALL_CLOCK_EVENTS = ("memory_growth", "input_pipeline")
"""Events whose presence (memory sampling) or every value (the input pipeline's seconds and share) is wall-clock."""


def deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items()
            if k not in WALL_CLOCK_FIELDS and not k.startswith(WALL_CLOCK_PREFIXES)}


def summarise(run_dir: Path) -> dict:
    checkpoints = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                   for p in sorted((run_dir / "checkpoints").glob("*.pt"))}
    records = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") in WALL_CLOCK_EVENTS:
            continue
        records.append(deterministic(record))
    return {"checkpoints": checkpoints, "records": records,
            "config": (run_dir / "config.yaml").read_text()}


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=False)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    summary = {}
    for recipe, (source, *overrides) in RUNS.items():
        command = [sys.executable, "-m", "bigbatch", "train", source, "--out", str(out / recipe), "--set",
                   *overrides]
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True, env=env, cwd=out)
        summary[recipe] = summarise(out / recipe)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))


def compare(before: Path, after: Path) -> int:
    a = {recipe: summarise(before / recipe) for recipe in RECIPES}  # read again: the exclusions of this version
    b = {recipe: summarise(after / recipe) for recipe in RECIPES}
    failed = False
    for recipe in RECIPES:
        for name in sorted(set(a[recipe]["checkpoints"]) | set(b[recipe]["checkpoints"])):
            same = a[recipe]["checkpoints"].get(name) == b[recipe]["checkpoints"].get(name)
            print(f"{recipe} checkpoints/{name}: {'byte-identical' if same else 'DIFFERENT'}")
            failed |= not same
        ra, rb = a[recipe]["records"], b[recipe]["records"]
        same = ra == rb
        print(f"{recipe} metrics.jsonl: {len(ra)} and {len(rb)} records, {'equal' if same else 'DIFFERENT'}")
        if not same:
            failed = True
            for x, y in zip(ra, rb, strict=False):
                if x != y:
                    print(f"  first difference:\n    before {x}\n    after  {y}")
                    break
        same = a[recipe]["config"] == b[recipe]["config"]
        print(f"{recipe} config.yaml: {'identical' if same else 'DIFFERENT'}")
        failed |= not same
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
