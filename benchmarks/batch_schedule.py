"""Growing the batch instead of decaying the LR (``schedule.batch``; Smith, Kindermans, Ying and Le, ICLR 2018),
measured: final top-1 and optimizer steps, several seeds, on two recipes.

Each recipe runs in arms of the same length in epochs, from the same initial batch and LR:

  decay    the recipe's step decay: the LR divided by ``k`` at each milestone;
  batch    the same milestones, the batch multiplied by ``k`` instead and the LR kept (``schedule.batch``);
  cosine   (digits only) the recipe as shipped, its warmup and cosine decay, for reference.

The recipes:

  digits   ``bigbatch train digits`` (small CNN, scikit-learn's digits, batch 256 = 8 x 32, 25 epochs, 5-epoch
           warmup), milestones at epochs 12 and 18, k = 2 (256 -> 512 -> 1024);
  resnet18 timm's ResNet-18 from scratch at 64 px on a folder of real JPEGs this script writes (crops of
           scikit-learn's two sample photographs, 4 classes: the top and bottom halves of each photograph,
           1,600 training and 400 validation images), batch 128 = 4 x 32, SGD with momentum, LR 0.1 at 256,
           a 1-epoch warmup, 12 epochs, milestones at epochs 6 and 9, k = 2 (128 -> 256 -> 512).

Smith et al. use k = 5; these sets are small (1,437 and 1,600 training images), and 5 x 5 would make a batch
larger than the set, so k = 2. Everything else is each recipe's own.

    python benchmarks/batch_schedule.py [--seeds 0 1 2] [--recipes digits resnet18] [--threads 2] [--workdir DIR]
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

import numpy as np
from PIL import Image

CHECKOUT = Path(__file__).resolve().parents[1]

DIGITS = {
    "base": ["digits"],
    "decay": ["schedule.decay.kind=multistep", "schedule.decay.milestones=[12 epochs, 18 epochs]",
              "schedule.decay.gamma=0.5"],
    "batch": ["schedule.decay.kind=constant",
              "schedule.batch=[{at: 12 epochs, factor: 2}, {at: 18 epochs, factor: 2}]"],
    "cosine": [],
}
RESNET = {
    "base": ["digits", "model.name=timm/resnet18", "data.name=folder", "data.size=64", "batch=128", "subdivisions=4",
             "epochs=12", "optim.lr=0.1", "optim.ref_batch=256", "data.preprocessing=standard",
             "data.standard.scale=[0.25,1.0]", "schedule.warmup=[{kind: linear, length: 1 epochs, start_factor: 0.1}]",
             "eval.every=3 epochs", "checkpoint.every=3 epochs", "eval.batch=100", "data.workers=1"],
    "decay": ["schedule.decay.kind=multistep", "schedule.decay.milestones=[6 epochs, 9 epochs]",
              "schedule.decay.gamma=0.5"],
    "batch": ["schedule.decay.kind=constant", "schedule.batch=[{at: 6 epochs, factor: 2}, {at: 9 epochs, factor: 2}]"],
}


def write_halves(root: Path, train: int = 1600, val: int = 400, seed: int = 0) -> Path:
    """An ImageFolder tree of real JPEGs, 4 classes: crops (96-160 px, quality 90) from the top or bottom half of
    scikit-learn's china.jpg or flower.jpg (427 x 640 each)."""
    from sklearn.datasets import load_sample_image

    photos = [load_sample_image(name) for name in ("china.jpg", "flower.jpg")]
    halves = [(photo, rows) for photo in photos for rows in ((0, 213), (214, 427))]  # rows 0-212 or 214-426
    return write_crops(root, [(photo, rows, (0, 640)) for photo, rows in halves], train, val, seed)


Region = tuple[np.ndarray, tuple[int, int], tuple[int, int]]
"""A class of :func:`write_crops`: a photograph (rows x columns x RGB) and the rows and columns, [first, end), its
crops lie in."""


def write_crops(root: Path, classes: list[Region], train: int, val: int, seed: int, sizes: tuple[int, int] = (96, 160)
                ) -> Path:
    """An ImageFolder tree of real JPEGs (``root``/train/classK/, ``root``/val/classK/): image i is of class
    i mod K, a square crop of ``sizes[0]``-``sizes[1]`` px at a random place inside that class's region (quality 90).
    The labels follow the content: classes whose regions do not overlap share no pixel."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            label = i % len(classes)
            photo, (first_row, end_row), (first_column, end_column) = classes[label]
            size = int(rng.integers(sizes[0], sizes[1] + 1))
            top = first_row + int(rng.integers(0, end_row - first_row - size + 1))
            left = first_column + int(rng.integers(0, end_column - first_column - size + 1))
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo[top:top + size, left:left + size]).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def train(recipe: dict[str, list[str]], arm: str, seed: int, out: Path, threads: int, data: Path | None) -> dict:
    """One ``bigbatch train``; its final top-1 (the run's own evaluation) and optimizer steps."""
    name, *sets = recipe["base"]
    sets = [*sets, *recipe[arm], f"seed={seed}"] + ([f"data.path={data}"] if data else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(CHECKOUT)}
    command = [sys.executable, "-m", "bigbatch", "train", name, "--out", str(out), "--set", *sets]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_records = [r for r in records if "loss" in r and "split" not in r]
    final = [r for r in records if r.get("split") == "val"][-1]
    return {"top1": final["top1"], "steps": train_records[-1]["step"], "images": train_records[-1]["images"],
            "last_batch": train_records[-1].get("batch", int(train_records[-1]["images"] / train_records[-1]["step"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="+", default=["digits", "resnet18"], choices=["digits", "resnet18"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="a new or empty folder for the runs (kept)")
    args = parser.parse_args()
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir: {args.workdir} is not empty")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.threads} torch threads; seeds {args.seeds}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for name in args.recipes:
            recipe = DIGITS if name == "digits" else RESNET
            data = write_halves(work / "halves") if name == "resnet18" else None
            arms = [arm for arm in recipe if arm != "base"]
            results: dict[str, list[dict]] = {arm: [] for arm in arms}
            for seed in args.seeds:
                for arm in arms:
                    result = train(recipe, arm, seed, work / f"{name}-{arm}-{seed}", args.threads, data)
                    results[arm].append(result)
                    print(f"{name:8s}  {arm:6s}  seed {seed}  top1 {result['top1']:6.2f}  steps {result['steps']:4d}  "
                          f"images {result['images']}  last batch {result['last_batch']}", flush=True)
            print(f"\n{name}: arm, top-1 of each seed, mean, optimizer steps")
            for arm in arms:
                tops = [r["top1"] for r in results[arm]]
                spread = f" +- {statistics.stdev(tops):.2f}" if len(tops) > 1 else ""
                print(f"  {arm:6s}  {', '.join(f'{t:.2f}' for t in tops)}  mean {statistics.mean(tops):.2f}{spread}  "
                      f"steps {results[arm][0]['steps']}", flush=True)
            print()


if __name__ == "__main__":
    main()
