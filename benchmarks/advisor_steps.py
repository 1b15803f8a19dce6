"""The advisor's steps prediction checked against runs: on digits (or a learnable JPEG folder, ``--folder``), from a
run at the smallest batch, predict the steps to a target validation loss at the larger batches (McCandlish et al.'s
S(B) = S_min (1 + B_noise / B), with S_min and B_noise from that run: ``advisor/from_run.py``, ``advisor/model.py``),
then run them and compare.

Each run is ``bigbatch train digits`` at its batch (2 micro-batches a step, so the noise scale is measured; the LR by
the recipe's linear rule; 25 epochs unless ``--set`` says otherwise; an evaluation every ``--eval-every`` steps), one
per seed, one thread each. The steps a run took are those of its first evaluation at or below the target, so they
are known to within ``--eval-every`` (one for every batch, or one per batch).

``--folder TRAIN,VAL`` trains the same recipe (the small CNN at 32 px) on a folder of real JPEGs instead, written
into the work folder by ``batch_schedule.py``'s ``write_halves`` (4 classes: the top and bottom halves of
scikit-learn's two sample photographs; TRAIN and VAL images).

The warmup: the recipe's is in epochs, so it is many more steps at a small batch than at a large one (1 epoch: 90
steps at batch 16, 6 at 256), and those steps count toward the small batch's S and so toward S_min. Give
``--set "schedule.warmup=[]"`` (and a constant LR, ``schedule.decay.kind=constant``) to leave it out: every
batch then trains at its linear-rule LR from the first step.

    python benchmarks/advisor_steps.py [--seeds 0,1,2] [--batches 16,64,256] [--target 0.1] [--workdir DIR]
        [--folder TRAIN,VAL] [--set KEY=VALUE ...]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bigbatch.advisor.from_run import reached  # noqa: E402
from bigbatch.advisor.model import s_min_from_run, steps_to_target  # noqa: E402
from bigbatch.errors import UserError  # noqa: E402


def train(out: Path, batch: int, seed: int, eval_every: int, extra: list[str]) -> None:
    if (out / "metrics.jsonl").is_file():
        return  # done in an earlier call with the same --workdir
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    command = [sys.executable, "-m", "bigbatch", "train", "digits", "--out", str(out), "--set", f"batch={batch}",
               "subdivisions=2", f"seed={seed}", f"eval.every={eval_every}", "log.tensorboard=false",
               "log.updates=false", "checkpoint.every=100000", *extra]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"train failed ({out}): {result.stderr[-2000:]}")


def smoothed(run: Path, target: float, k: int) -> tuple[int, float | None] | None:
    """(steps, B_simple there) where the mean of the last ``k`` validation losses first is at most ``target``: the
    same runs read with less of the evaluations' noise (None: never)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["step"], r["loss"]) for r in records if r.get("split") == "val" and "loss" in r]
    for i in range(k - 1, len(evals)):
        if statistics.fmean(v for _, v in evals[i - k + 1:i + 1]) <= target:
            step = evals[i][0]
            noise = [r["noise_scale"] for r in records if "noise_scale" in r and "split" not in r
                     and "event" not in r and r["step"] <= step]
            return step, noise[-1] if noise else None
    return None


def fitted_noise_scale(s_small: float, b_small: int, s_big: float, b_big: int) -> float:
    """The B_noise that makes S(B) = S_min (1 + B_noise / B) go through both runs' steps."""
    return (s_small - s_big) / (s_big / b_small - s_small / b_big)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--target", type=float, default=0.1)
    parser.add_argument("--eval-every", default="5", metavar="N[,N,...]",
                        help="steps between evaluations: one for every batch, or one per batch (e.g. 8,4,2)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--folder", default=None, metavar="TRAIN,VAL",
                        help="train on a folder of JPEGs this writes (training and validation images)")
    parser.add_argument("--smooth", type=int, default=3, metavar="K",
                        help="also count the steps where the mean of the last K validation losses reaches the target")
    parser.add_argument("--set", dest="extra", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more overrides for every run (e.g. a shorter recipe: epochs=8)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="advisor-steps-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.folder is not None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from batch_schedule import write_halves

        n_train, n_val = (int(n) for n in args.folder.split(","))
        folder = work / f"halves-{n_train}-{n_val}"
        if not folder.exists():
            write_halves(folder, train=n_train, val=n_val)
        args.extra = ["data.name=folder", f"data.path={folder}", "data.size=32", *args.extra]
    seeds = [int(s) for s in args.seeds.split(",")]
    batches = sorted(int(b) for b in args.batches.split(","))
    every = [int(n) for n in args.eval_every.split(",")]
    every = dict(zip(batches, every * len(batches) if len(every) == 1 else every, strict=True))
    print(f"# {' '.join(sys.argv)}\n# {platform.machine()}, nproc {os.cpu_count()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}", flush=True)
    errors: dict[int, list[float]] = {b: [] for b in batches[1:]}
    smooth_errors: dict[int, list[float]] = {}
    for seed in seeds:
        for batch in batches:
            train(work / f"b{batch}-s{seed}", batch, seed, every[batch], args.extra)
        base = reached(work / f"b{batches[0]}-s{seed}", args.target)
        if base.noise_scale is None:
            print(f"seed {seed}: the batch-{batches[0]} run recorded no noise scale by step {base.steps}")
            continue
        s_min = s_min_from_run(base.steps, base.batch, base.noise_scale)
        line = [f"seed {seed}: batch {batches[0]} took {base.steps} steps to val loss {args.target:g}, B_noise there "
                f"{base.noise_scale:.1f}, S_min {s_min:.1f}"]
        for batch in batches[1:]:
            predicted = steps_to_target(s_min, base.noise_scale, batch)
            try:
                got = reached(work / f"b{batch}-s{seed}", args.target)
            except UserError as e:
                line.append(f"batch {batch}: predicted {predicted:.0f}, {e}")
                continue
            errors[batch].append(predicted / got.steps - 1)
            fit = fitted_noise_scale(base.steps, base.batch, got.steps, batch)
            line.append(f"batch {batch}: predicted {predicted:.0f} steps, took {got.steps} (B_noise there "
                        f"{got.noise_scale or float('nan'):.1f}; the B_noise that fits {fit:.0f}); error "
                        f"{100 * errors[batch][-1]:+.0f} %")
        print("; ".join(line), flush=True)
        small = smoothed(work / f"b{batches[0]}-s{seed}", args.target, args.smooth)
        if small is None or small[1] is None:
            continue
        s_min = s_min_from_run(small[0], batches[0], small[1])
        line = [f"  smoothed ({args.smooth} evaluations): batch {batches[0]} {small[0]} steps, B_noise {small[1]:.1f}"]
        for batch in batches[1:]:
            got_smooth = smoothed(work / f"b{batch}-s{seed}", args.target, args.smooth)
            if got_smooth is None:
                continue
            predicted = steps_to_target(s_min, small[1], batch)
            smooth_errors.setdefault(batch, []).append(predicted / got_smooth[0] - 1)
            line.append(f"batch {batch}: predicted {predicted:.0f}, took {got_smooth[0]}; error "
                        f"{100 * smooth_errors[batch][-1]:+.0f} %")
        print("; ".join(line), flush=True)
    for batch, errs in errors.items():
        if errs:
            print(f"batch {batch}: error of the predicted steps, mean {100 * statistics.fmean(errs):+.0f} % "
                  f"(seeds: {', '.join(f'{100 * e:+.0f} %' for e in errs)})")
    for batch, errs in smooth_errors.items():
        print(f"batch {batch}, smoothed: mean {100 * statistics.fmean(errs):+.0f} % (seeds: "
              f"{', '.join(f'{100 * e:+.0f} %' for e in errs)})")
    print(f"# load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
