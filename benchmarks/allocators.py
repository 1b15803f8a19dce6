"""TCMalloc (or jemalloc) in place of glibc's malloc with its freed memory kept: training speed and peak memory.

bigbatch keeps the host memory a step frees for the next micro-batch with glibc's own switches
(``memory.keep_freed``, ``engine/host_memory.py``); PyTorch's CPU performance tuning guide gets the same by loading
jemalloc or TCMalloc instead (``LD_PRELOAD``). Neither ships with the project's machine: this script takes the
shared library it is given (``--preload``: e.g. ``libtcmalloc_minimal.so`` built from gperftools' sources) and runs
the same training with each allocator, side by side:

  kept       glibc's malloc with ``memory.keep_freed=true`` (the default);
  preload    the given library loaded first (``LD_PRELOAD``); ``memory.keep_freed`` as the default (its ``mallopt``
             calls go to the preloaded library, which TCMalloc and jemalloc take and ignore);
  not-kept   (with ``--arms``) glibc's malloc as it is, ``memory.keep_freed=false``: for reference.

The run: torchvision's ResNet-18 at 128 px on a folder of real JPEGs (``plan_holds.py``'s: crops of scikit-learn's two
photographs, 400 training and 100 validation images), batch 128 in micro-batches of 32, 1 data worker, ``--steps``
optimizer steps, then its evaluation and checkpoint. images/s: the training records' (``log.every=1``) from the
second step to the last (the first warms up). Peak: the main process's ``ru_maxrss`` plus its workers' largest private
memory together (``plan_holds.run_measured``). Rounds alternate which arm goes first; medians are reported, and the
ratio of each arm to ``kept`` (per round, then the median).

``--loop`` measures the training step alone instead, on a loaded machine where whole runs take minutes: each arm is a
fresh process that trains torchvision's ResNet-18 on random 128 px images in micro-batches of 32 (forward, backward,
SGD with momentum; 2 warm-up steps, then ``--steps`` timed), images/s from its median step, and its ``ru_maxrss``; many
short rounds, alternated, so that both arms see the same load.

    python benchmarks/allocators.py --preload /path/to/libtcmalloc_minimal.so [--rounds 3] [--steps 6] [--loop]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_holds import CHECKOUT, MiB, machine, run_measured, write_data  # noqa: E402

SETS = ["epochs=null", "model.name=resnet18", "data.name=folder", "data.path={work}/halves", "data.size=128",
        "batch=128", "subdivisions=4", "data.workers=1", "log.tensorboard=false", "log.every=1"]


def images_per_s(out: Path) -> float:
    """Training images over training seconds, from the second step's record to the last."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if "images_per_s" in r][1:]
    images = [r["images"] - previous["images"] for previous, r in zip(train, train[1:], strict=False)]
    seconds = [i / r["images_per_s"] for i, r in zip(images, train[1:], strict=True)]
    return sum(images) / sum(seconds)


LOOP = """
import resource, statistics, sys, time
import torch, torchvision
from bigbatch.engine.host_memory import keep_freed
if sys.argv[1] == "true":
    keep_freed()
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images, labels = torch.randn(32, 3, 128, 128), torch.randint(0, 4, (32,))
times = []
for step in range(2 + int(sys.argv[2])):
    start = time.perf_counter()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - start)
print(32 / statistics.median(times[2:]), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def loop(arm: str, preload: Path, steps: int) -> tuple[float, float]:
    """(images/s of the median step, peak MiB) of one process of the step loop."""
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    if arm == "preload":
        env["LD_PRELOAD"] = str(preload)
    done = subprocess.run([sys.executable, "-c", LOOP, "false" if arm == "not-kept" else "true", str(steps)],
                          capture_output=True, text=True, env=env, check=True)
    rate, peak = done.stdout.split()
    return float(rate), int(peak) / MiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preload", type=Path, required=True, help="the allocator's shared library")
    parser.add_argument("--arms", nargs="+", default=["kept", "preload"], choices=["kept", "preload", "not-kept"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--loop", action="store_true", help="the training step alone, in many short processes")
    args = parser.parse_args()
    if not args.preload.is_file():
        raise SystemExit(f"error: --preload: no such file {args.preload}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="allocators-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.loop:
        write_data(work)
    sets = [*(s.format(work=work) for s in SETS), f"steps={args.steps}", f"eval.every={args.steps}",
            f"checkpoint.every={args.steps}"]
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {machine()}; load {os.getloadavg()[0]:.2f}; "
          f"preload {args.preload}")
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in args.arms}
    for round_ in range(args.rounds):
        order = args.arms[round_ % len(args.arms):] + args.arms[:round_ % len(args.arms)]  # who goes first rotates
        for arm in order:
            if args.loop:
                rate, peak = loop(arm, args.preload, args.steps)
                results[arm].append((rate, peak))
                print(f"round {round_} {arm:9s} {rate:6.1f} images/s  peak {peak:6.0f} MiB  "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
                continue
            env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
            arm_sets = [*sets, f"memory.keep_freed={'false' if arm == 'not-kept' else 'true'}"]
            if arm == "preload":
                env["LD_PRELOAD"] = str(args.preload)
            out = work / f"{arm}-{round_}"
            command = [sys.executable, "-m", "bigbatch", "train", "digits", "--out", str(out), "--set", *arm_sets]
            main_peak, children, seconds, _ = run_measured(command, env)
            rate, peak = images_per_s(out), (main_peak + children) / MiB
            results[arm].append((rate, peak))
            print(f"round {round_} {arm:9s} {rate:6.1f} images/s  peak {peak:6.0f} MiB (main {main_peak / MiB:.0f}, "
                  f"workers {children / MiB:.0f})  {seconds:.0f} s  load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\n{'arm':9s} {'images/s':>9s} {'ratio':>6s} {'peak MiB':>9s} {'ratio':>6s}   (medians over {args.rounds} "
          "rounds; ratios to kept, per round)")
    for arm, values in results.items():
        speed = statistics.median(r for r, _ in values)
        peak = statistics.median(p for _, p in values)
        ratios = [(r / k[0], p / k[1]) for (r, p), k in zip(values, results.get("kept", values), strict=True)]
        print(f"{arm:9s} {speed:9.1f} {statistics.median(r for r, _ in ratios):6.3f} {peak:9.0f} "
              f"{statistics.median(p for _, p in ratios):6.3f}")
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
