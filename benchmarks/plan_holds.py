"""Does a layout that ``bigbatch plan --memory-limit`` chose hold for the whole run? Three recipes, three limits each.

For each recipe and limit: ``bigbatch plan RECIPE --memory-limit LIMIT`` (its own command, as a user runs it) chooses
the subdivisions; its planned estimate is the whole-run peak it gives for the chosen micro-batch. Then a complete
short run with that layout and ``memory.limit=LIMIT``: ``bigbatch train`` for 3 optimizer steps, evaluating and
writing a checkpoint after each, so that the later steps run beside an evaluation's and a checkpoint's memory.

The whole run's peak is the main process's exact maximum resident memory (``ru_maxrss`` from ``wait4``: the kernel's
high-water mark, which a sampler such as ``memory.csv``'s, every 5 s, misses) plus, with data workers, the most
private memory (USS: ``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup``) that the run's child processes
held together at any one sample (every 50 ms), sampled as the planner samples its measurements' workers
(``telemetry/children.py``: a child between ``vfork`` and ``exec``, which shares its parent's memory, is not
counted). What a child shares with the main process (the libraries, the pages of the parent it has not written, the
batches the main process has mapped) is in the main process's RSS already; adding the two peaks, which need not fall
together, can only overstate the whole.

The recipes (the data is written into the work folder first):

  digits    the built-in recipe as it ships: small CNN at 32 px, batch 256, evaluation 360 at a time, no workers;
  resnet18  torchvision's ResNet-18 at 128 px on a folder of real JPEGs (crops of scikit-learn's two photographs,
            400 training and 100 validation images, 4 classes), batch 64, 1 data worker;
  yolo      ``yolov4-tiny-3l-shapes`` as it ships (128 px, batch 32, 2 data workers, evaluation 64 at a time) on a
            400-image shapes set (``bigbatch data shapes``).

    python benchmarks/plan_holds.py [--recipes digits resnet18 yolo] [--limits SIZE ...] [--workdir DIR] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
MiB = 2**20

RECIPES: dict[str, dict] = {
    "digits": {"config": "digits", "sets": ["epochs=null"], "limits": ["1300MiB", "1400MiB", "1600MiB"]},
    "resnet18": {"config": "digits",
                 "sets": ["epochs=null", "model.name=resnet18", "data.name=folder", "data.path={work}/halves",
                          "data.size=128", "batch=64", "data.workers=1", "log.tensorboard=false"],
                 "limits": ["1792MiB", "2GiB", "2560MiB"]},
    "yolo": {"config": "yolov4-tiny-3l-shapes", "sets": ["epochs=null", "data.path={work}/shapes"],
             "limits": ["1900MiB", "2100MiB", "2400MiB"]},
}


def write_data(work: Path) -> None:
    """The JPEG folder and the shapes set, once."""
    sys.path.insert(0, str(CHECKOUT / "benchmarks"))
    from batch_schedule import write_halves

    if not (work / "halves").exists():
        write_halves(work / "halves", train=400, val=100)
    if not (work / "shapes").exists():
        bigbatch(["data", "shapes", "--out", str(work / "shapes"), "--images", "400"])


def bigbatch(args: list[str], env: dict[str, str] | None = None, refused: bool = False) -> str:
    """``bigbatch ARGS``'s output; ``refused``: an ``error:`` line (exit code 2) is returned instead of raised."""
    done = subprocess.run([sys.executable, "-m", "bigbatch", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(CHECKOUT), **(env or {})})
    if refused and done.returncode == 2:
        return done.stderr
    if done.returncode != 0:
        raise SystemExit(f"bigbatch {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def run_measured(command: list[str], env: dict[str, str]) -> tuple[int, int, float, str]:
    """Run ``command``; (main process's peak RSS, children's largest private memory together, seconds, output)."""
    sys.path.insert(0, str(CHECKOUT))
    from bigbatch.telemetry.children import ChildrenSampler  # the planner's own sampler, every 50 ms

    start = time.perf_counter()
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    sampler = ChildrenSampler(proc.pid).start()
    _, status, usage = os.wait4(proc.pid, 0)
    children_peak = sampler.stop()
    seconds = time.perf_counter() - start
    out.seek(0)
    text = out.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{text[-3000:]}")
    return usage.ru_maxrss * 1024, children_peak, seconds, text


def parse_plan(text: str) -> tuple[int, int, float, float]:
    """(subdivisions, micro-batch, planned whole-run peak, measured whole-run peak (process + workers), in MiB) from
    ``bigbatch plan``'s output."""
    chosen = re.search(r"subdivisions (\d+) x micro-batch (\d+)", text)
    if chosen is None:
        raise SystemExit(f"no layout in the plan's output:\n{text}")
    subdivisions, micro = int(chosen.group(1)), int(chosen.group(2))
    header = next(line for line in text.splitlines() if line.strip().startswith("micro-batch"))
    columns = [c for c in header.split() if c != "MiB"]
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == str(micro) and len(cells) >= len(columns):
            value = {column: float(cells[columns.index(column)]) for column in ("peak", "workers", "planned")}
            return subdivisions, micro, value["planned"], value["peak"] + value["workers"]
    raise SystemExit(f"no row for micro-batch {micro} in the plan's output:\n{text}")


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--limits", nargs="+", default=None, help="instead of each recipe's three")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="plan-holds-"))
    work.mkdir(parents=True, exist_ok=True)
    write_data(work)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {machine()}; load {os.getloadavg()[0]:.2f}; work {work}")
    print(f"{'recipe':9s} {'limit':>8s} {'S':>3s} {'micro':>5s} {'planned':>8s} {'main':>6s} {'workers':>7s} "
          f"{'whole':>6s} {'ratio':>5s} {'under':>5s} {'re-cut':>6s} {'s':>5s}   (MiB; ratio: whole / the plan's "
          "measurement of the chosen micro-batch, process + workers)", flush=True)
    for name in args.recipes:
        recipe = RECIPES[name]
        sets = [*(s.format(work=work) for s in recipe["sets"]), f"steps={args.steps}"]
        for limit in args.limits or recipe["limits"]:
            plan = bigbatch(["plan", recipe["config"], "--set", *sets, "--memory-limit", limit], refused=True)
            if plan.startswith("error:"):
                print(f"{name:9s} {limit:>8s} plan refused: {plan.strip()}", flush=True)
                continue
            subdivisions, micro, planned, measured = parse_plan(plan)
            out = work / f"{name}-{limit}"
            (work / f"{name}-{limit}-plan.txt").write_text(plan)  # the plan's table, kept beside the run
            command = [sys.executable, "-m", "bigbatch", "train", recipe["config"], "--out", str(out), "--set", *sets,
                       f"subdivisions={subdivisions}", "eval.every=1", "checkpoint.every=1",
                       f"memory.limit={limit}"]
            main_peak, children, seconds, text = run_measured(command, {**os.environ, "PYTHONPATH": str(CHECKOUT)})
            recuts = text.count("out of memory")
            whole = (main_peak + children) / MiB
            limit_mib = parse_size(limit) / MiB
            print(f"{name:9s} {limit:>8s} {subdivisions:3d} {micro:5d} {planned:8.0f} {main_peak / MiB:6.0f} "
                  f"{children / MiB:7.0f} {whole:6.0f} {whole / measured:5.2f} "
                  f"{'yes' if whole <= limit_mib else 'NO':>5s} {recuts:6d} {seconds:5.0f}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


def parse_size(text: str) -> int:
    sys.path.insert(0, str(CHECKOUT))
    from bigbatch.config import parse_size as parse

    return parse(text)


if __name__ == "__main__":
    main()
