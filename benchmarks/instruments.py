"""The cost of the run's instruments: the same training run with them (phase timing, the gradient noise scale, the
per-layer update sizes) and without, side by side.

Each round trains the digits recipe (small CNN, batch 256 in 8 micro-batches) for ``--steps`` steps twice, once with
``log.timing=events log.noise_scale=true log.updates=true`` (the defaults) and once with all three off, in
alternating order; evaluation and checkpoints are pushed past the end. The time is the median step time of the
run's own training records (``images_per_s``, every 10 steps after the first 10), so start-up is not counted. The
median over rounds of the ratio with / without is reported.

    python benchmarks/instruments.py [--rounds 5] [--steps 60] [--only timing|noise_scale|updates]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

INSTRUMENTS = {"timing": ("log.timing=events", "log.timing=off"),
               "noise_scale": ("log.noise_scale=true", "log.noise_scale=false"),
               "updates": ("log.updates=true", "log.updates=false")}


def seconds_per_step(out: Path, on: bool, steps: int, measured: list[str]) -> float:
    from bigbatch.config import load_config
    from bigbatch.engine.trainer import train

    flags = [INSTRUMENTS[name][0 if on else 1] for name in measured]
    flags += [INSTRUMENTS[name][1] for name in INSTRUMENTS if name not in measured]  # the others: off on both sides
    cfg = load_config("digits", [f"steps={steps}", "eval.every=100000", "checkpoint.every=100000",
                                 "log.tensorboard=false", "log.every=10", *flags])
    train(cfg, out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r and r["step"] > 10]
    return cfg.batch / statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", choices=sorted(INSTRUMENTS), help="measure this instrument alone (default: all)")
    args = parser.parse_args()
    measured = [args.only] if args.only else list(INSTRUMENTS)
    torch.set_num_threads(1)
    ratios, with_, without = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            times = {}
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                times[on] = seconds_per_step(Path(tmp) / f"r{r}-{on}", on, args.steps, measured)
            with_.append(times[True])
            without.append(times[False])
            ratios.append(times[True] / times[False])
            print(f"round {r}: with {times[True] * 1000:.1f} ms/step, without {times[False] * 1000:.1f} ms/step, "
                  f"ratio {ratios[-1]:.4f}", flush=True)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
          f"measured: {', '.join(measured)}")
    print(f"median ms/step: with {statistics.median(with_) * 1000:.1f}, without "
          f"{statistics.median(without) * 1000:.1f}; median ratio {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f})")


if __name__ == "__main__":
    main()
