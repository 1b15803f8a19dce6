"""``data.decode: fast`` against ``exact`` on the Inception training preprocessing, side by side.

The same samples (the same crop boxes, flips and colours: one seed per sample) go through ``data/formats/folder.py``'s
``decode_crop`` twice: ``exact`` decodes the crop at full resolution (the region decode where it is built: the
whole decode's pixels) and resizes with TF1's bilinear arithmetic; ``fast`` decodes at the DCT scale the crop
allows and resizes the uint8 pixels with torch. Reported per image
size: the share of samples decoded reduced, images/s of each (median of rounds, sides alternating), and how far
the outputs differ (on the [-1, 1] scale of the preprocessing's output): the mean over all values, and the
largest.

The images are the two photographs that ship with scikit-learn (427 x 640), as they are and enlarged
(bicubic) to 1280 x 1920 and 2560 x 3840, a camera's size; JPEG quality 90.

    python benchmarks/decode_fast.py [--images 40] [--rounds 5] [--size 299]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

import bigbatch.data.formats.encoded_images as encoded
from bigbatch.data.transforms.crops import InceptionTrainCrop


def write_images(root: Path, scale: int, count: int) -> list[str]:
    from sklearn.datasets import load_sample_image

    paths = []
    for i in range(count):
        photo = Image.fromarray(load_sample_image(("china.jpg", "flower.jpg")[i % 2]))
        if scale > 1:
            photo = photo.resize((photo.width * scale, photo.height * scale), Image.Resampling.BICUBIC)
        path = root / f"{scale}-{i}.jpg"
        photo.save(path, quality=90)
        paths.append(str(path))
    return paths


def run(paths: list[str], preprocess: InceptionTrainCrop) -> tuple[list[torch.Tensor], int]:
    """Every image through the preprocessing, each with its own seed; (outputs, how many were reduced)."""
    original = encoded.jpeg_reduction
    reduced = 0

    def counting(h: int, w: int, needed: tuple[int, int]) -> int:
        nonlocal reduced
        r = original(h, w, needed)
        reduced += r > 1
        return r

    encoded.jpeg_reduction = counting
    try:
        outputs = []
        for i, path in enumerate(paths):
            torch.manual_seed(i)
            outputs.append(encoded.decode_crop(path, preprocess))
        return outputs, reduced
    finally:
        encoded.jpeg_reduction = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=299)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sides = {"exact": InceptionTrainCrop(args.size, fast=False), "fast": InceptionTrainCrop(args.size, fast=True)}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, 1 torch thread, torch {torch.__version__}, "
          f"Pillow {Image.__version__}; Inception train preprocessing at {args.size}, {args.images} images a size")
    print(f"{'image':>11s} {'reduced':>8s} {'exact img/s':>11s} {'fast img/s':>11s} {'speed-up':>9s} "
          f"{'mean |diff|':>12s} {'max |diff|':>11s}")
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (1, 3, 6):
            paths = write_images(Path(tmp), scale, args.images)
            exact, _ = run(paths, sides["exact"])
            fast, reduced = run(paths, sides["fast"])
            diff = torch.cat([(a - b).abs().flatten() for a, b in zip(exact, fast, strict=True)])
            times: dict[str, list[float]] = {"exact": [], "fast": []}
            for r in range(args.rounds):
                for side in (("fast", "exact") if r % 2 else ("exact", "fast")):
                    start = time.perf_counter()
                    run(paths, sides[side])
                    times[side].append(len(paths) / (time.perf_counter() - start))
            exact_rate, fast_rate = statistics.median(times["exact"]), statistics.median(times["fast"])
            with Image.open(paths[0]) as image:
                shape = f"{image.width}x{image.height}"
            print(f"{shape:>11s} {reduced / len(paths):8.0%} {exact_rate:11.1f} {fast_rate:11.1f} "
                  f"{fast_rate / exact_rate:9.2f} {diff.mean().item():12.4f} {diff.max().item():11.3f}")


if __name__ == "__main__":
    main()
