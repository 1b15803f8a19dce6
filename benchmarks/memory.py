"""Peak memory of one training step against subdivisions and precision, each in its own process.

ResNet-18 at 128 px, global batch 256 (the digits images upscaled), one optimizer step through the
real CLI (``bigbatch train``; evaluation on 8 images at a time so that it does not set the peak).
The peak is the child process's maximum resident memory (``ru_maxrss`` from ``wait4``). Then
``bigbatch plan --memory-limit LIMIT`` chooses a layout, and a training run with that layout and
``memory.limit`` is checked against the limit.

``--keep-freed false`` runs it all with ``memory.keep_freed=false`` (glibc's malloc as it is, docs/memory.md).

    python benchmarks/memory.py [--subdivisions 1 2 4 8 16] [--limit 2GiB] [--keep-freed true|false]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = ["model.name=resnet18", "data.size=128", "batch=256", "eval.batch=8", "log.tensorboard=false",
         "schedule.warmup=[]"]


def run(args: list[str]) -> tuple[int, float, str]:
    """Run ``bigbatch`` in a child process; (peak RSS in bytes, seconds, stdout)."""
    start = time.perf_counter()
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "bigbatch", *args], stdout=out, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out.seek(0)
    text = out.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(text)
    return usage.ru_maxrss * 1024, seconds, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subdivisions", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--limit", default="2GiB")
    parser.add_argument("--keep-freed", choices=["true", "false"], default="true")
    args = parser.parse_args()
    model = [*MODEL, f"memory.keep_freed={args.keep_freed}"]
    work = Path(tempfile.mkdtemp(prefix="memory-"))

    print("peak memory of one training step, ResNet-18, 128 px, global batch 256, each in its own process; "
          f"memory.keep_freed={args.keep_freed}")
    print(f"{'subdivisions':>12s} {'micro-batch':>11s} {'fp32 MiB':>9s} {'bf16 MiB':>9s} {'fp32 s':>7s} {'bf16 s':>7s}")
    for s in args.subdivisions:
        row = []
        for dtype in ("fp32", "bf16"):
            out = work / f"{dtype}-{s}"
            peak, seconds, _ = run(["train", "digits", "--out", str(out), "--set", *model, f"subdivisions={s}",
                                    "steps=1", f"precision={dtype}"])
            row.append((peak, seconds))
        print(f"{s:12d} {256 // s:11d} {row[0][0] / 2**20:9.0f} {row[1][0] / 2**20:9.0f} "
              f"{row[0][1]:7.1f} {row[1][1]:7.1f}", flush=True)

    print(f"\nbigbatch plan --memory-limit {args.limit}")
    _, _, text = run(["plan", "digits", "--set", *model, "--memory-limit", args.limit])
    print(text)
    chosen = int(re.search(r"--set subdivisions=(\d+)", text).group(1))
    peak, seconds, _ = run(["train", "digits", "--out", str(work / "planned"), "--set", *model,
                            f"subdivisions={chosen}", "steps=2", f"memory.limit={args.limit}"])
    print(f"training 2 steps with subdivisions={chosen} and memory.limit={args.limit}: peak {peak / 2**20:.0f} MiB "
          f"({seconds:.0f} s)")


if __name__ == "__main__":
    main()
