#!/usr/bin/env python3
"""Measure Darknet's own [yolo] training deltas on the cases of tests/helpers.py (YOLO_DELTA_CASES) and write
tests/fixtures/darknet/yolo_delta/<case>.npz (bigbatch's tests read only those files).

Usage (needs the built forks and yolo_delta_<fork> from build.sh; run with bigbatch's venv):
    benchmarks/darknet_oracle/build.sh [DN_ROOT]
    .venv/bin/python benchmarks/darknet_oracle/yolo_deltas.py [--only CASE ...]

For each case: the stock cfg with its [net] size (and the case's [yolo] keys) set is written to a temporary folder
with truths.txt and each [yolo] layer's input (the INPUT RULE of tests/helpers.py (YOLO_DELTA_CASES)); yolo_delta runs
every [yolo] layer's forward with train=1 and writes its l.delta. Each npz holds, per [yolo] layer index i,
``delta_<i>`` (the layer's l.delta as (N, A * (5 + C), H, W) float32) and ``cost_<i>`` (*l.cost), and ``layers``.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

from bigbatch.darknet import read_darknet_cfg  # noqa: E402
from tests.helpers import STOCK_CFGS, YOLO_DELTA_CASES, YOLO_DELTA_TRUTHS, cfg_with_keys, yolo_delta_input  # noqa: E402

OUT = os.path.join(REPO, "tests", "fixtures", "darknet", "yolo_delta")


def run_case(case) -> None:
    binary = os.path.join(HERE, f"yolo_delta_{case.fork}")
    with open(os.path.join(REPO, STOCK_CFGS, case.fork, case.cfg)) as f:
        text = cfg_with_keys(f.read(), case.size, case.keys, case.images)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, case.cfg)
        with open(cfg, "w") as f:
            f.write(text)
        shapes = subprocess.run([binary, cfg, str(case.images), tmp, "--shapes"], capture_output=True, text=True,
                                check=True).stdout.split("\n")
        shapes = [line.split(None, 1)[1] for line in shapes if line.startswith("yolo_shape ")]
        specs = {spec.index: spec for spec in read_darknet_cfg(cfg).yolo_layers}
        layers = []
        for line in filter(None, shapes):
            i, w, h, n, classes, inputs = map(int, line.split())
            x = yolo_delta_input(case, i, specs[i], h, w)
            assert x[0].size == inputs and len(specs[i].mask) == n and specs[i].classes == classes, line
            x.tofile(os.path.join(tmp, f"input_{i}.f32"))
            layers.append((i, x.shape))
        with open(os.path.join(tmp, "truths.txt"), "w") as f:
            for b, truths in enumerate(YOLO_DELTA_TRUTHS):
                for x, y, w, h, c in truths:
                    f.write(f"{b} {x!r} {y!r} {w!r} {h!r} {c}\n")
        done = subprocess.run([binary, cfg, str(case.images), tmp], capture_output=True, text=True, check=True)
        costs = {int(line.split()[1]): float(line.split()[2]) for line in done.stdout.split("\n")
                 if line.startswith("yolo_cost ")}
        arrays = {"layers": np.array([i for i, _ in layers])}
        for i, shape in layers:
            arrays[f"delta_{i}"] = np.fromfile(os.path.join(tmp, f"delta_{i}.f32"), dtype=np.float32).reshape(shape)
            arrays[f"cost_{i}"] = np.float32(costs[i])
    os.makedirs(OUT, exist_ok=True)
    np.savez_compressed(os.path.join(OUT, f"{case.name}.npz"), **arrays)
    nonzero = sum(int(np.count_nonzero(arrays[f"delta_{i}"])) for i, _ in layers)
    print(f"{case.name}: layers {[i for i, _ in layers]}, {nonzero} non-zero deltas")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="case names")
    args = parser.parse_args()
    for case in YOLO_DELTA_CASES:
        if not args.only or case.name in args.only:
            run_case(case)


if __name__ == "__main__":
    main()
