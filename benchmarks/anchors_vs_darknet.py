"""``bigbatch data anchors`` against AlexeyAB Darknet's ``darknet detector calc_anchors``, on label sets built here.

    python benchmarks/anchors_vs_darknet.py [--darknet-root /tmp/dn/AlexeyAB] [--runs 5] [--workdir DIR]

Darknet is found at ``--darknet-root`` (its ``darknet`` executable), or built there, CPU only, from the fetched
snapshot ``--mirror`` (``darknet_predict.find_darknet``); without either the script prints one line and exits 0
(skipped). Nothing of Darknet enters the repository: the binary is run, and its printed lines read.

The label sets, written at run time under ``--workdir``:

- ``shapes``: ``bigbatch data shapes --format yolo --images 600 --seed 1`` (its ``shapes.data``: 480 training images);
- ``mixed``: 800 small PNG images with YOLO label files beside them, drawn here (seeded): a mixture of size
  distributions unlike the shapes' near-square boxes: tall boxes (people), wide ones (cars), many small squarish ones
  and a few large ones, each box inside its image (so that bigbatch, which clips a box to its image, reads the same
  boxes).

For each set and anchor count, Darknet runs ``detector calc_anchors DATA -num_of_clusters K -width W -height H
-dont_show`` ``--runs`` times, each in its own second (Darknet seeds ``rand()`` with ``time(0)``), from the set's
folder, whose relative paths a ``.data`` file holds (the ``anchors.txt`` and ``counters_per_class.txt`` it writes
there are moved to a folder of the run's own); bigbatch runs ``python -m bigbatch data anchors DATA
--num K --size WxH --seed 0`` (its default ``--tries 5``: the best of the k-means runs of seeds 0 to 4). The check:
bigbatch's average IoU within 1 percentage point of the median of Darknet's runs (exit status 1 otherwise). The
table also shows the single run of seed 0 (``--tries 1``), which is one Darknet run. And each Darknet run is looked
for among bigbatch's single runs with ``--seed T`` for each second T the run may have started in: ``reproduced``
counts the runs whose printed lines (k-means iterations, avg IoU, anchors) bigbatch's run at one such T prints
identically.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bigbatch.darknet.anchors import fit_anchors, read_box_sizes

CASES = (("shapes", 6, "416x416"), ("shapes", 9, "416x416"), ("mixed", 9, "608x608"), ("mixed", 6, "320x256"))
TOLERANCE = 1.0
"""Percentage points of average IoU between bigbatch and the median of Darknet's runs."""


def shapes_set(root: Path, python: str, env: dict[str, str]) -> Path:
    out = root / "shapes"
    subprocess.run([python, "-m", "bigbatch", "data", "shapes", "--out", str(out), "--format", "yolo", "--images",
                    "600", "--seed", "1"], check=True, env=env, stdout=subprocess.DEVNULL)
    return out / "shapes.data"


def mixed_set(root: Path, images: int = 800, seed: int = 3) -> Path:
    """YOLO labels of four kinds of boxes (relative sizes), each inside its image; tiny grey PNGs as the images."""
    rng = np.random.default_rng(seed)
    folder = root / "mixed" / "train"  # each label file beside its image: AlexeyAB's replace_image_to_label turns
    folder.mkdir(parents=True)          # only COCO's images/train2017 (and such) and VOC's JPEGImages into labels
    kinds = (  # (share, median w, median h, spread of log size): relative to the image
        (0.35, 0.06, 0.18, 0.35),  # tall
        (0.25, 0.20, 0.08, 0.35),  # wide
        (0.30, 0.03, 0.03, 0.45),  # small
        (0.10, 0.55, 0.50, 0.20),  # large
    )
    shares = np.array([k[0] for k in kinds])
    listed = []
    for i in range(images):
        w_px, h_px = int(rng.integers(48, 97)), int(rng.integers(40, 81))
        path = folder / f"{i:05d}.png"
        Image.new("L", (w_px, h_px), 128).save(path)
        lines = []
        for _ in range(int(rng.integers(1, 7))):
            _, mw, mh, spread = kinds[rng.choice(len(kinds), p=shares)]
            scale = np.exp(rng.normal(0, spread))
            w = float(np.clip(mw * scale * np.exp(rng.normal(0, 0.15)), 0.01, 0.98))
            h = float(np.clip(mh * scale * np.exp(rng.normal(0, 0.15)), 0.01, 0.98))
            xc = float(rng.uniform(w / 2 + 0.005, 1 - w / 2 - 0.005))
            yc = float(rng.uniform(h / 2 + 0.005, 1 - h / 2 - 0.005))
            lines.append(f"{int(rng.integers(0, 3))} {xc:.6f} {yc:.6f} {w:.6f} {h:.6f}")
        (folder / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")
        listed.append(str(path))
    (root / "mixed" / "train.txt").write_text("\n".join(listed) + "\n")
    (root / "mixed" / "mixed.names").write_text("person\ncar\nthing\n")
    data = root / "mixed" / "mixed.data"
    data.write_text(f"classes=3\ntrain={root / 'mixed' / 'train.txt'}\nvalid={root / 'mixed' / 'train.txt'}\n"
                    f"names={root / 'mixed' / 'mixed.names'}\n")
    return data


def darknet_run(darknet: Path, data: Path, k: int, width: int, height: int, folder: Path) -> dict:
    """One ``calc_anchors`` run, started at the beginning of a second, in the set's folder (a ``.data`` file's
    relative paths are from the current folder): its lines, and the seconds its ``time(0)`` may have read."""
    folder.mkdir(parents=True)
    time.sleep(1 - time.time() % 1 + 0.02)
    before = int(time.time())
    done = subprocess.run([str(darknet), "detector", "calc_anchors", str(data.absolute()), "-num_of_clusters", str(k),
                           "-width", str(width), "-height", str(height), "-dont_show"], cwd=data.parent,
                          capture_output=True, text=True, errors="replace")
    after = int(time.time())
    text = done.stdout.replace("\r", "\n")
    iou = re.search(r"avg IoU = ([\d.]+) %", text)
    anchors = re.search(r"^anchors = (.*)$", text, re.M)
    moves = re.search(r"iterations = (\d+)", text)
    if done.returncode != 0 or iou is None or anchors is None or moves is None:
        raise SystemExit(f"Darknet failed ({done.returncode}): {text[-2000:]}{done.stderr[-2000:]}")
    for name in ("anchors.txt", "counters_per_class.txt"):  # written in its cwd, the set's folder: kept per run
        if (data.parent / name).exists():
            (data.parent / name).rename(folder / name)
    return {"iou": float(iou[1]), "anchors": anchors[1].strip(), "moves": int(moves[1]),
            "seconds": range(before, after + 1)}


def bigbatch_cli(python: str, env: dict[str, str], data: Path, k: int, size: str) -> tuple[float, str, float]:
    start = time.perf_counter()
    done = subprocess.run([python, "-m", "bigbatch", "data", "anchors", str(data), "--num", str(k), "--size", size,
                           "--seed", "0"], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bigbatch failed: {done.stderr}")
    iou = float(re.search(r"avg IoU = ([\d.]+) %", done.stdout)[1])
    anchors = re.search(r"^anchors = (.*)$", done.stdout, re.M)[1].strip()
    return iou, anchors, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--darknet-root", type=Path, default=Path("/tmp/dn/AlexeyAB"))
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror/AlexeyAB+darknet/repo"))
    parser.add_argument("--runs", type=int, default=5, help="Darknet runs per case")
    parser.add_argument("--workdir", type=Path, help="where the sets are written (default: a new temporary folder)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs `-m bigbatch`")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from darknet_predict import find_darknet

    darknet = find_darknet(args.darknet_root, args.mirror)
    if darknet is None:
        print(f"skipped: no Darknet at {args.darknet_root} and no snapshot at {args.mirror} to build it from")
        return 0
    root = args.workdir or Path(tempfile.mkdtemp(prefix="anchors-vs-darknet-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                                     os.environ.get("PYTHONPATH")]))}
    sets = {"shapes": shapes_set(root, args.python, env), "mixed": mixed_set(root)}
    print(f"Darknet: {darknet}; sets under {root}")
    rows, failed = [], False
    for name, k, size in CASES:
        data = sets[name]
        width, height = (int(v) for v in size.split("x"))
        runs = [darknet_run(darknet, data, k, width, height, root / "darknet" / f"{name}-{k}-{size}-{n}")
                for n in range(args.runs)]
        median = statistics.median(r["iou"] for r in runs)
        iou, anchors, seconds = bigbatch_cli(args.python, env, data, k, size)
        relative, _, _ = read_box_sizes(data)
        single = fit_anchors(relative, k, width, height, 0).avg_iou
        reproduced = 0
        for run in runs:
            for seed in run["seconds"]:
                fit = fit_anchors(relative, k, width, height, seed)
                if (fit.moves, fit.lines()[1].removeprefix("anchors = ").strip(), f"{fit.avg_iou:.2f}") == (
                        run["moves"], run["anchors"], f"{run['iou']:.2f}"):
                    reproduced += 1
                    break
        ok = abs(iou - median) <= TOLERANCE
        failed |= not ok
        rows.append((name, len(relative), k, size, " ".join(f"{r['iou']:.2f}" for r in runs), median, iou,
                     single, iou - median, f"{reproduced}/{len(runs)}", "ok" if ok else "FAIL", anchors, seconds))
    print("| set | boxes | K | size | Darknet avg IoU, each run | Darknet median | bigbatch (5 tries) "
          "| bigbatch --tries 1 | bigbatch - median | Darknet runs reproduced | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        name, boxes, k, size, each, median, iou, single, diff, reproduced, ok, _, _ = row
        print(f"| {name} | {boxes} | {k} | {size} | {each} | {median:.2f} | {iou:.2f} | {single:.2f} | {diff:+.2f} "
              f"| {reproduced} | {ok} |")
    for name, _, k, size, *_, anchors, seconds in rows:
        print(f"bigbatch {name} K={k} {size}: anchors = {anchors}  ({seconds:.1f} s, the CLI process)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
