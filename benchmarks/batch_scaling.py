"""The digits recipe at batch 64 and rescaled to batch 1024 with ``bigbatch scale``, side by side.

The batch-64 recipe is ``bigbatch scale digits --batch 64``; the batch-1024 one is that recipe
rescaled again (``bigbatch scale <64-recipe> --batch 1024``): LR by the linear rule, lengths kept in
images, micro-batch kept at 32. Each is trained for the recipe's epochs with a few seeds, through
the real CLI, one after the other; the table gives steps, wall time and final / best top-1.

    python benchmarks/batch_scaling.py [--seeds 0 1 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bigbatch(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "bigbatch", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", dest="overrides", nargs="+", default=[], help="overrides for the base recipe")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="batch-scaling-"))
    small, large = work / "digits-64.yaml", work / "digits-1024.yaml"
    base = ["--set", *args.overrides] if args.overrides else []
    print(bigbatch("scale", "digits", *base, "--batch", "64", "--out", str(small)).stdout)
    print(bigbatch("scale", str(small), "--batch", "1024", "--out", str(large)).stdout)

    rows = []
    for recipe in (small, large):
        finals, bests, seconds, steps = [], [], [], 0
        for seed in args.seeds:
            out = work / f"{recipe.stem}-seed{seed}"
            start = time.perf_counter()
            bigbatch("train", str(recipe), "--out", str(out), "--set", f"seed={seed}", "log.tensorboard=false")
            seconds.append(time.perf_counter() - start)
            evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            evals = [r for r in evals if r.get("split") == "val"]
            finals.append(evals[-1]["top1"])
            bests.append(max(r["top1"] for r in evals))
            steps = evals[-1]["step"]
        rows.append((recipe.stem, steps, statistics.median(seconds), finals, bests))

    print(f"{'recipe':12s} {'steps':>6s} {'time s':>7s}  final top-1 per seed       best top-1 per seed")
    for name, steps, seconds, finals, bests in rows:
        print(f"{name:12s} {steps:6d} {seconds:7.1f}  {' '.join(f'{v:6.2f}' for v in finals):26s} "
              f"{' '.join(f'{v:6.2f}' for v in bests)}")


if __name__ == "__main__":
    main()
