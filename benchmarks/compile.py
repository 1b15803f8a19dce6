"""``model.compile`` (torch.compile) against eager, side by side: the compile time and the steady-state images/s.

Each side is one ``bigbatch train`` process, as a user runs it, on the same config but for ``model.compile``:

  eager         ``model.compile=false``;
  default       ``model.compile=default``, inductor's cache (``TORCHINDUCTOR_CACHE_DIR``) a new, empty folder: what
                a first run pays;
  default+      the same again, the cache as ``default`` left it: what a later run of the same model pays.

Cases: ResNet-18 (torchvision's, channels-last) on the digits set upscaled to 64 and to 128 px, batch 32 in one
micro-batch, SGD; ``yolov4-tiny-3l-shapes`` (the recipe: 128 px letterboxed, batch 32, AdamW, weight EMA) on a
generated shapes set of ``--images`` images. Each run trains ``--steps`` steps and records every step
(``log.every=1``); the input pipeline runs in the training process (``data.workers=0``). The losses of each
compiled run are compared with eager's, step by step (their largest relative gap is printed).

From each run's ``metrics.jsonl``:

  first step    the first step's ``t_step``: the compilation (forward and backward, traced and built by inductor)
                plus what every first step pays (oneDNN's kernels chosen, memory first touched);
  compile       the compiled run's first step minus eager's first step, in the same round;
  img/s         batch / median over the steps after the first ``--warmup`` of (``t_step`` - ``t_data``): the
                training step itself, the wait for the data left out.

Rounds alternate the order of the sides (eager first in even rounds, last in odd ones); the report gives each
round's numbers and the median of the compiled / eager images/s ratios. The machine, the date, the torch version and
the load (``uptime`` before and after) are printed with them.

    python benchmarks/compile.py [--cases resnet18-64,resnet18-128,yolov4-tiny-3l] [--rounds 2] [--steps 12]
                                 [--warmup 4] [--threads 1] [--images 400] [--batch 32] [--subdivisions 1]
                                 [--modes default[,reduce-overhead,max-autotune]] [--gpu] [--workdir DIR]

On a GPU (``--gpu``; benchmarks/gpu_check.sh runs it) each mode of ``--modes`` is a side of its own (and its
``+``, the warm cache's), against the same eager run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = ["log.every=1", "log.tensorboard=false", "data.workers=0", "schedule.warmup=[]"]

CASES = {
    "resnet18-64": ("digits", ["model.name=resnet18", "data.size=64", "eval.batch=64"]),
    "resnet18-128": ("digits", ["model.name=resnet18", "data.size=128", "eval.batch=64"]),
    "yolov4-tiny-3l": ("yolov4-tiny-3l-shapes", []),
}
"""Case name -> (recipe, its settings); ``--batch`` and ``--subdivisions`` are added to each."""


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{platform.node()}: {os.cpu_count()} cores, {cpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def train(recipe: str, settings: list[str], out: Path, threads: int, cache: Path, gpu: bool) -> dict:
    """One ``bigbatch train`` process; its per-step records and wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "PYTHONUNBUFFERED": "1", **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""})}
    env.pop("WORLD_SIZE", None)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bigbatch", "train", recipe, "--out", str(out), "--set", *settings],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bigbatch train failed ({' '.join(settings)}):\n{done.stderr[-3000:]}")
    if "model.compile" in done.stderr:
        sys.exit(f"the compiled run fell back to eager:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"train": [r for r in records if "lr" in r], "wall": wall}


def summary(run: dict, warmup: int, batch: int) -> dict:
    steps = run["train"]
    steady = [r["t_step"] - r["t_data"] for r in steps[warmup:]]
    return {"first": steps[0]["t_step"], "img_s": batch / statistics.median(steady), "wall": run["wall"],
            "losses": [r["loss"] for r in steps]}


def gap(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference of two runs' losses, step by step."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the steady state")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--images", type=int, default=400, help="images of the generated shapes set")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--subdivisions", type=int, default=1)
    parser.add_argument("--modes", default="default", help="model.compile modes compared with eager, comma-separated "
                        "(reduce-overhead: CUDA graphs on a GPU)")
    parser.add_argument("--gpu", action="store_true", help="let the runs see the CUDA devices (else the CPU)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bigbatch-compile-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}\n# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; before: {load()}", flush=True)
    print(f"# {' '.join(sys.argv)}", flush=True)
    shapes = work / "shapes"
    if "yolov4-tiny-3l" in args.cases and not shapes.exists():
        subprocess.run([sys.executable, "-m", "bigbatch", "data", "shapes", "--out", str(shapes), "--images",
                        str(args.images)], check=True, capture_output=True)
    ratios: dict[str, list[float]] = {}
    for case in args.cases.split(","):
        recipe, settings = CASES[case]
        settings = [*settings, *COMMON, f"steps={args.steps}", f"batch={args.batch}",
                    f"subdivisions={args.subdivisions}", *([f"data.path={shapes}"] if "shapes" in recipe else [])]
        modes = args.modes.split(",")
        for r in range(args.rounds):
            sides = [("eager", "false")]
            for mode in modes:  # the first run of a mode fills its new cache; the second finds it full
                sides += [(mode, mode), (f"{mode}+", mode)]
            order = sides if r % 2 == 0 else sides[1:] + sides[:1]
            got = {}
            for name, mode in order:
                cache = work / f"cache-{case}-{r}-{mode}"
                if not name.endswith("+"):
                    shutil.rmtree(cache, ignore_errors=True)
                run = train(recipe, [*settings, f"model.compile={mode}"], work / f"run-{case}", args.threads, cache,
                            args.gpu)
                got[name] = summary(run, args.warmup, args.batch)
            eager = got["eager"]
            print(f"{case} round {r + 1} ({', '.join(n for n, _ in order)}):", flush=True)
            for name, _ in sides:
                side = got[name]
                extra = "" if name == "eager" else (f"  compile {side['first'] - eager['first']:6.1f} s  x"
                                                    f"{side['img_s'] / eager['img_s']:.2f} img/s  losses within "
                                                    f"{gap(side['losses'], eager['losses']):.1e}")
                print(f"  {name:16s} first step {side['first']:6.1f} s  {side['img_s']:7.1f} img/s  "
                      f"process {side['wall']:6.1f} s{extra}", flush=True)
            for mode in modes:
                ratios.setdefault(f"{case} {mode}", []).append(got[mode]["img_s"] / eager["img_s"])
    print("# median compiled / eager img/s: " + ", ".join(f"{key} {statistics.median(v):.2f}"
                                                          for key, v in ratios.items()))
    print(f"# after: {load()}", flush=True)


if __name__ == "__main__":
    main()
