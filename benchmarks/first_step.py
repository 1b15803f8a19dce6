"""Time from the command to the first training step: bigbatch's digits recipe against timm's ``train.py``.

"The first step" is the moment the first optimizer step returns (``torch.optim.Optimizer.step``, after the
step's forward and backward passes of all its micro-batches). Every side runs under the same wrapper
(:data:`FIRST_STEP`): as soon as ``import torch`` has ended (done by the command itself: the wrapper imports
nothing earlier than the command would), it registers two of torch's global hooks: one after every optimizer step
(``register_optimizer_step_post_hook``), which writes the wall-clock time and ends the process (the rest of the
run is not measured), and one before every module's forward (``register_module_forward_pre_hook``), which writes
the time of the first forward in training (a module in train mode, gradients on, an input not on the ``meta``
device), then removes itself. Each time is counted from just before the side's process is started (the parent's
clock): "to the first step", and within it "torch imported" and "first forward" (so "first forward" to "first
step" is the first step's own work: its micro-batches' forward and backward and the update, where torch's
kernels run for the first time).

The sides, each a fresh process, 2 torch threads (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``), no DataLoader workers:

- ``bigbatch digits``: ``bigbatch train digits --out DIR``, the recipe as it is: the small CNN on scikit-learn's
  digits held in memory, 32 px, batch 256 as 8 micro-batches of 32;
- ``timm train.py``: timm's ``train.py FOLDER --model resnet18 --num-classes 10 --img-size 32 -b 32
  --grad-accum-steps 8 --workers 0 --no-prefetcher --device cpu ...`` on the same digits written as a folder of
  JPEGs (32 px RGB, quality 95: the same images, the same batch layout), taken from a copy of timm's repository at
  the installed timm's tag (else its HEAD) with that commit's ``timm`` first on ``PYTHONPATH``, and run under
  ``benchmarks/against_timm.py``'s ``TIMM_WITHOUT_WORKERS`` wrapper (its loaders otherwise refuse ``--workers 0``);
- ``bigbatch, timm's work``: ``bigbatch train digits --set model.name=timm/resnet18 data.name=folder
  data.path=FOLDER data.size=32 data.preprocessing=standard``: the same model, JPEGs and batch layout as timm's
  side (the preprocessing: ``data.standard``'s defaults, no colour jitter and bilinear, where timm's ``train.py``
  keeps its own, jitter 0.4 and a random interpolation);
- ``python -c "import torch"``: the floor every side pays.

Rounds alternate the order (reversed every other round); the median of each side is printed with its ratio to
timm's. Without a repository the script says so and stops (exit code 0): nothing of timm's is fetched.

    python benchmarks/first_step.py --timm-repo DIR [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from against_timm import TIMM_WITHOUT_WORKERS, timm_source  # benchmarks/ is on sys.path

CHECKOUT = Path(__file__).resolve().parent.parent
SIZE, MICRO, ACCUM, CLASSES = 32, 32, 8, 10

FIRST_STEP = """
import importlib.abc, importlib.util, os, runpy, sys, time

def _mark(name):
    with open(os.environ["FIRST_STEP_FILE"], "a") as f:
        f.write(f"{name} {time.time()!r}\\n")

def _first_forward(module, args):
    import torch
    if module.training and torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.device.type != "meta" for a in args):
        _mark("first_forward")
        _forward_hook.remove()

def _first_step(optimizer, args, kwargs):
    _mark("first_step")
    os._exit(0)

def _hooked(torch):
    global _forward_hook
    _mark("torch")
    modules, optimizers = (importlib.import_module(m) for m in ("torch.nn.modules.module", "torch.optim.optimizer"))
    _forward_hook = modules.register_module_forward_pre_hook(_first_forward)
    optimizers.register_optimizer_step_post_hook(_first_step)

class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _hooked(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Watch())
"""
"""The prologue of every side (see the module docstring)."""

TIMM = "timm train.py (resnet18, the digits as JPEGs)"
RUN_BIGBATCH = 'sys.argv = ["bigbatch", *sys.argv[1:]]\nrunpy.run_module("bigbatch", run_name="__main__")\n'


def write_digits_folder(root: Path) -> Path:
    """scikit-learn's digits as an ImageFolder tree of JPEGs (SIZE px RGB, bilinear from 8 x 8; 1 in 5 to val)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = root / ("val" if i % 5 == 0 else "train") / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        grey = Image.fromarray((image * (255 / 16)).astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR)
        grey.convert("RGB").save(folder / f"{i:05d}.jpg", quality=95)
    return root


def first_step(code: str, args: list[str], python_path: Path, cwd: Path, threads: int) -> dict[str, float]:
    """Seconds from the start of ``python -c FIRST_STEP+code ARGS`` to its first optimizer step (``first_step``) and
    to the end of torch's import (``torch``)."""
    marks = cwd / "marks.txt"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONPATH=str(python_path),
               FIRST_STEP_FILE=str(marks))
    start = time.time()
    with (cwd / "log.txt").open("w") as log:
        done = subprocess.run([sys.executable, "-c", FIRST_STEP + code, *args], cwd=cwd, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    found = dict(line.split() for line in marks.read_text().splitlines()) if marks.exists() else {}
    if done.returncode != 0 or "first_step" not in found:
        sys.exit(f"{args[:3]} ... ended (exit {done.returncode}) before its first step; its output: {cwd / 'log.txt'}")
    return {mark: float(at) - start for mark, at in found.items()}


def import_torch(threads: int, cwd: Path) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.time()
    subprocess.run([sys.executable, "-c", "import torch"], cwd=cwd, env=env, check=True)
    return {"first_step": time.time() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timm-repo", type=Path, default=os.environ.get("TIMM_REPO"),
                        help="a git directory of timm's repository (huggingface/pytorch-image-models); env TIMM_REPO")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on every side")
    args = parser.parse_args()
    if args.timm_repo is None or not args.timm_repo.exists():
        print("skipped: no copy of timm's repository (--timm-repo DIR or TIMM_REPO): its train.py is the peer, "
              "and it is not fetched by this script")
        return
    import timm
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "timm-src").mkdir()
        src, described = timm_source(args.timm_repo, tmp / "timm-src")
        folder = write_digits_folder(tmp / "digits-jpeg")
        timm_args = [str(src / "train.py"), str(folder), "--val-split", "val", "--model", "resnet18", "--num-classes",
                     str(CLASSES), "--img-size", str(SIZE), "-b", str(MICRO), "--grad-accum-steps", str(ACCUM),
                     "--epochs", "1", "--workers", "0", "--no-prefetcher", "--device", "cpu", "--log-interval",
                     "1000", "--seed", "0"]
        same_work = ["--set", "model.name=timm/resnet18", "data.name=folder", f"data.path={folder}",
                     f"data.size={SIZE}", "data.preprocessing=standard"]
        sides = {
            "bigbatch train digits": lambda out: first_step(RUN_BIGBATCH, ["train", "digits", "--out",
                                                                           str(out / "run")], CHECKOUT, out,
                                                            args.threads),
            TIMM: lambda out: first_step(
                TIMM_WITHOUT_WORKERS, [*timm_args, "--output", str(out)], src, out, args.threads),
            "bigbatch train, timm's work (resnet18, the same JPEGs)": lambda out: first_step(
                RUN_BIGBATCH, ["train", "digits", "--out", str(out / "run"), *same_work], CHECKOUT, out,
                args.threads),
            'python -c "import torch"': lambda out: import_torch(args.threads, out),
        }
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, installed timm "
              f"{timm.__version__}; peer: {described}; {args.threads} torch threads, no workers; {args.rounds} "
              f"rounds, the order reversed every other round", flush=True)
        times: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                out = tmp / f"side{list(sides).index(name)}-round{r}"
                out.mkdir()
                times[name].append(sides[name](out))
    print_tables(times)


def print_tables(times: dict[str, list[dict[str, float]]]) -> None:
    """The medians, each round's times, and the median of each round's ratio to timm's side."""
    peer = times[TIMM]
    for mark, title in (("first_step", "to the first step"),
                        ("first_forward", "to the first forward (start-up alone)")):
        print(f"\n{title}: s from the command; x timm's: the median of each round's ratio to timm's side")
        print("| side | median s | x timm's | each round, s | torch imported, median s |\n|---|---|---|---|---|")
        for name, rounds in times.items():
            if mark not in rounds[0]:
                continue
            values = [t[mark] for t in rounds]
            ratio = statistics.median(t[mark] / q[mark] for t, q in zip(rounds, peer, strict=True))
            torch_at = [t["torch"] for t in rounds if "torch" in t]
            at = f"{statistics.median(torch_at):.2f}" if torch_at else ""
            print(f"| {name} | {statistics.median(values):.2f} | {ratio:.2f} | "
                  f"{' '.join(f'{v:.2f}' for v in values)} | {at} |", flush=True)


if __name__ == "__main__":
    main()
