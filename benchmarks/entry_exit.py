"""Whole-command wall time with the entry point's start-up and exit (``bigbatch/entry.py``) against Python's own.

Two sides, each a fresh process, timed from just before it starts to its end. ``--compare exit`` (the default):

- ``entry``: ``python -m bigbatch ARGS``, as a user runs it: after the command, the threads, the ``atexit`` callbacks
  and the standard streams, then ``os._exit`` (no teardown of modules and objects);
- ``sys.exit``: ``python -c "import sys; from bigbatch.cli import main; sys.exit(main())" ARGS``, the same command
  through the entry point it had before: the interpreter's whole finalization (the start-up's collector held, as the
  entry point holds it, so that only the exit differs).

``--compare collector``:

- ``entry``: ``python -m bigbatch ARGS``, the garbage collector held back through the start-up
  (``bigbatch/floor/collector.py``);
- ``python's``: the same entry point with that hold left out (Python's thresholds: full collections during the imports).

Each command below runs ``--rounds`` times on each side, the sides alternated (reversed every other round); the
script prints each side's median and their ratio. A training run writes into a new folder under a temporary folder
of the script's own, removed at the end. 2 torch threads (``OMP_NUM_THREADS``).

    python benchmarks/entry_exit.py [--rounds 5] [--compare exit|collector]
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

ENTRY = [sys.executable, "-m", "bigbatch"]
HELD_THEN_SYS_EXIT = ("import sys; from bigbatch.floor import collector; collector.hold(); "
                      "from bigbatch.cli import main; sys.exit(main())")
ENTRY_WITHOUT_HOLD = ("from bigbatch.floor import collector; collector.hold = lambda: None; "
                      "from bigbatch.entry import run; run()")
COMPARISONS = {  # the baseline's name and command, against the entry point's
    "exit": ("sys.exit", [sys.executable, "-c", HELD_THEN_SYS_EXIT]),
    "collector": ("python's", [sys.executable, "-c", ENTRY_WITHOUT_HOLD]),
}


def commands(folder: Path) -> dict[str, callable]:
    """Each command's arguments, made fresh for each run (a training run needs a folder of its own)."""
    runs = iter(range(10**6))
    return {
        "schedule digits": lambda: ["schedule", "digits"],
        "show yolov4-tiny-3l-shapes": lambda: ["show", "yolov4-tiny-3l-shapes"],
        "train digits, 2 epochs": lambda: ["train", "digits", "--out", str(folder / f"run{next(runs)}"),
                                           "--set", "epochs=2"],
    }


def timed(command: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, choices=range(1, 101), metavar="1..100")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="exit")
    args = parser.parse_args()
    baseline, baseline_command = COMPARISONS[args.compare]
    sides = {baseline: baseline_command, "entry": ENTRY}
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
              if line.startswith("model name")]
    print(f"{models[0] if models else platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bigbatch-entry-exit-") as folder:
        for name, make in commands(Path(folder)).items():
            times: dict[str, list[float]] = {side: [] for side in sides}
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    times[side].append(timed([*sides[side], *make()]))
            medians = {side: statistics.median(values) for side, values in times.items()}
            rounds = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(times[baseline], times["entry"], strict=True))
            print(f"{name}: {baseline} {medians[baseline]:.2f} s, entry {medians['entry']:.2f} s, "
                  f"{medians[baseline] - medians['entry']:.2f} s less, {medians[baseline] / medians['entry']:.2f}x"
                  f" (rounds, {baseline}/entry: {rounds})")

if __name__ == "__main__":
    main()
