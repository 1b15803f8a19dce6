"""AdaScale (``batch: {mode: adaptive, ...}``; Johnson, Agrawal, Gu and Guestrin, ICML 2020), measured: final top-1
and optimizer steps of the digits recipe at its base batch against AdaScale at 8 and 32 times it, several seeds.

Arms, each ``bigbatch train digits`` (small CNN, scikit-learn's digits, 25 epochs at the base batch with a 5-epoch
warmup and a cosine decay, SGD with momentum, LR 0.1 at 256 scaled linearly), the same base schedule throughout:

  base       the recipe at the base batch B0 = 32 (LR 0.0125; 1,123 steps), one micro-batch;
  linear8    the recipe as shipped: batch 256 = 8 x B0, the LR scaled linearly (0.1), its schedule in steps of 256
             (the linear scaling rule, for comparison: what AdaScale replaces);
  ada8       ``batch: {mode: adaptive, base: 32, max: 256}``, 8 micro-batches of 32;
  ada32      ``batch: {mode: adaptive, base: 32, max: 1024}``, 32 micro-batches of 32;
  grow       ``batch: {mode: adaptive, base: 32, max: 1024, grow: true}``, micro-batches of 16.

The adaptive arms end when their progress reaches the base schedule's 1,123 base steps; the steps they take are
measured.

    python benchmarks/adascale.py [--seeds 0 1 2] [--arms base linear8 ada8 ada32 grow] [--threads 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]

ARMS = {
    "base": ["batch=32", "subdivisions=1"],
    "linear8": [],
    "ada8": ["batch={mode: adaptive, base: 32, max: 256}", "subdivisions=8"],
    "ada32": ["batch={mode: adaptive, base: 32, max: 1024}", "subdivisions=32"],
    "grow": ["batch={mode: adaptive, base: 32, max: 1024, grow: true}", "subdivisions=2"],
}


def train(arm: str, seed: int, out: Path, threads: int) -> dict:
    """One ``bigbatch train digits``: its final top-1 (the run's own evaluation), steps, images and last batch."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(CHECKOUT)}
    command = [sys.executable, "-m", "bigbatch", "train", "digits", "--out", str(out), "--set", *ARMS[arm],
               f"seed={seed}", "log.tensorboard=false"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_records = [r for r in records if "loss" in r and "split" not in r]
    final = [r for r in records if r.get("split") == "val"][-1]
    last = train_records[-1]
    return {"top1": final["top1"], "loss": final["loss"], "steps": last["step"], "images": last["images"],
            "last_batch": last.get("batch", 32 if arm == "base" else 256), "progress": last.get("progress"),
            "mean_gain": statistics.mean(r["gain"] for r in train_records) if "gain" in last else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="a new or empty folder for the runs (kept)")
    args = parser.parse_args()
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir: {args.workdir} is not empty")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.threads} torch threads; seeds {args.seeds}", flush=True)
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            for arm in args.arms:
                result = train(arm, seed, work / f"{arm}-{seed}", args.threads)
                results[arm].append(result)
                extra = (f"  progress {result['progress']:.1f}  mean r {result['mean_gain']:.2f}"
                         if result["progress"] is not None else "")
                print(f"{arm:8s} seed {seed}  top1 {result['top1']:6.2f}  val loss {result['loss']:.4f}  steps "
                      f"{result['steps']:5d}  images {result['images']:6d}  last batch {result['last_batch']}{extra}",
                      flush=True)
    print("\narm, top-1 of each seed and mean, mean val loss, optimizer steps and images of each seed")
    for arm in args.arms:
        tops = [r["top1"] for r in results[arm]]
        spread = f" +- {statistics.stdev(tops):.2f}" if len(tops) > 1 else ""
        print(f"  {arm:8s} {', '.join(f'{t:.2f}' for t in tops)}  mean {statistics.mean(tops):.2f}{spread}  "
              f"loss {statistics.mean(r['loss'] for r in results[arm]):.4f}  "
              f"steps {', '.join(str(r['steps']) for r in results[arm])}  "
              f"images {', '.join(str(r['images']) for r in results[arm])}", flush=True)


if __name__ == "__main__":
    main()
