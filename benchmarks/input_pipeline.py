"""bigbatch's input pipeline against torchvision's usual one, side by side, per number of DataLoader workers.

Both read the same folder of real JPEGs (crops of the two photographs that ship with scikit-learn, re-encoded
at quality 90, ImageNet-like sizes: 300-427 x 375-500 px) in an ImageFolder layout, 32 images a batch:

  bigbatch     ``data.name: folder`` with the Inception training preprocessing at 299 (TF's distorted
               bounding-box crop, TF1 bilinear resize, flip, fast colour distortion), read as training
               reads it (``data/bench.py``);
  torchvision  ``ImageFolder`` + v2 ``RandomResizedCrop(299)``, ``RandomHorizontalFlip``,
               ``ColorJitter(0.4, 0.4, 0.4)``, to a normalised float tensor, in a ``DataLoader``.

With ``--shards`` the folder is also packed (``bigbatch pack``) and ``data.name: shards`` measured. Rounds
alternate the order of the sides; the median images/s is reported, and the ratio to torchvision's.

    python benchmarks/input_pipeline.py [--images 1000] [--per-run 320] [--rounds 3] [--workers 0 1 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def write_folder(root: Path, images: int, classes: int = 10, seed: int = 0) -> Path:
    from sklearn.datasets import load_sample_image

    rng = np.random.default_rng(seed)
    photos = [load_sample_image(name) for name in ("china.jpg", "flower.jpg")]
    for split, count in (("train", images), ("val", classes)):
        for i in range(count):
            photo = photos[i % 2]
            h, w = int(rng.integers(300, 428)), int(rng.integers(375, 501))
            top, left = int(rng.integers(0, 428 - h)), int(rng.integers(0, 641 - w))
            folder = root / split / f"class{i % classes:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo[top:top + h, left:left + w]).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def bigbatch_rate(data: Path, name: str, workers: int, images: int) -> float:
    from bigbatch.config import load_config
    from bigbatch.data.bench import measure
    from bigbatch.tasks import build_task

    cfg = load_config("digits", [f"data.name={name}", f"data.path={data}", "data.size=299", "batch=32",
                                 "data.preprocessing=inception"])
    result = measure(cfg, build_task(cfg), workers, images)
    return result.images_per_s


def torchvision_rate(data: Path, workers: int, images: int) -> float:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose([v2.RandomResizedCrop(299, antialias=True), v2.RandomHorizontalFlip(),
                            v2.ColorJitter(0.4, 0.4, 0.4), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    loader = torch.utils.data.DataLoader(ImageFolder(str(data / "train"), transform=transform), batch_size=32,
                                         shuffle=True, num_workers=workers, drop_last=True)
    stream = iter(loader)
    next(stream)  # start-up, not timed (as bigbatch's measurement)
    start, read = time.perf_counter(), 0
    while read < images:
        read += len(next(stream)[0])
    return read / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000, help="JPEGs in the generated folder")
    parser.add_argument("--per-run", type=int, default=320, help="images timed per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--shards", action="store_true", help="also measure data.name: shards")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, Pillow "
          f"{Image.__version__}; {args.images} JPEGs, {args.per_run} images a measurement, {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        data = write_folder(Path(tmp) / "folder", args.images)
        sides = {"torchvision": lambda w: torchvision_rate(data, w, args.per_run),
                 "bigbatch folder": lambda w: bigbatch_rate(data, "folder", w, args.per_run)}
        if args.shards:
            from bigbatch.data.pack import pack

            shards = Path(tmp) / "shards"
            pack(data, shards, 64 * 2**20)
            sides["bigbatch shards"] = lambda w: bigbatch_rate(shards, "shards", w, args.per_run)
        print(f"{'workers':>7s}  " + "  ".join(f"{name + ' img/s':>22s}" for name in sides)
              + "  " + "  ".join(f"{name + ' / torchvision':>30s}" for name in list(sides)[1:]))
        for workers in args.workers:
            rates: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(args.rounds):
                names = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in names:
                    rates[name].append(sides[name](workers))
            median = {name: statistics.median(values) for name, values in rates.items()}
            base = median["torchvision"]
            print(f"{workers:7d}  " + "  ".join(f"{median[n]:22.1f}" for n in sides)
                  + "  " + "  ".join(f"{median[n] / base:30.2f}" for n in list(sides)[1:]))


if __name__ == "__main__":
    main()
