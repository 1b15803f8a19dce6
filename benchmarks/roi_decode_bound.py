"""What a region-of-interest JPEG decode would save bigbatch's input pipeline: a bound, measured in C.

No Python library on PyPI decodes only a crop's region of a JPEG with the crop given by the caller (PIL,
torchvision and simplejpeg decode whole images; PyTurboJPEG needs the system's TurboJPEG 3 library; pyvips and
DALI's CPU decoder were measured slower than torchvision's whole decode). libjpeg-turbo itself can
(``jpeg_crop_scanline`` + ``jpeg_skip_scanlines``, as TensorFlow's ``decode_and_crop_jpeg``). This script builds
``roi_decode_bound.c`` against the system's libjpeg-turbo (gcc and ``jpeglib.h``; it skips with a message
without them) and times, over the Inception training crops of the benchmark folder (each sample's box drawn as
``data.name: folder`` draws it, from its seed), the whole decode against the region's decode, and checks that
the region's pixels equal the whole decode's. torchvision's ``decode_jpeg`` of the same files is timed beside
them: it is what bigbatch decodes with.

    python benchmarks/roi_decode_bound.py [--images 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

HERE = Path(__file__).resolve().parent


def build(out: Path) -> Path | None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        print("skipped: no C compiler (gcc or cc)")
        return None
    binary = out / "roi_decode_bound"
    result = subprocess.run([compiler, "-O2", "-o", str(binary), str(HERE / "roi_decode_bound.c"), "-ljpeg"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        print(f"skipped: roi_decode_bound.c does not build against libjpeg here ({result.stderr.strip()[:200]})")
        return None
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=299)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from input_pipeline import write_folder
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    from bigbatch.data.transforms.inception import InceptionTrain

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))
        if binary is None:
            return
        paths = sorted(str(p) for p in write_folder(Path(tmp) / "folder", args.images).glob("train/*/*.jpg"))
        crop, lines = InceptionTrain(args.size), []
        for seed, path in enumerate(paths):
            with Image.open(path) as image:
                width, height = image.size
            torch.manual_seed(seed)
            top, left, h, w = crop.sample_box(height, width)
            lines.append(f"{path} {top} {left} {h} {w}")
        result = subprocess.run([str(binary), str(args.rounds)], input="\n".join(lines) + "\n", capture_output=True,
                                text=True, check=True)
        full_ms, roi_ms, identical = result.stdout.split()
        encoded = [read_file(path) for path in paths]
        best = float("inf")
        for _ in range(args.rounds):
            start = time.perf_counter()
            for data in encoded:
                decode_jpeg(data, mode=ImageReadMode.RGB)
            best = min(best, (time.perf_counter() - start) / len(encoded) * 1e3)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {len(paths)} JPEGs, Inception crops at "
          f"{args.size}, best of {args.rounds} rounds, ms per image")
    print(f"libjpeg-turbo whole decode {float(full_ms):.3f}  region decode {float(roi_ms):.3f}  "
          f"(region / whole {float(roi_ms) / float(full_ms):.2f}; region pixels equal the whole decode's: "
          f"{'yes' if identical == '1' else 'NO'})  torchvision decode_jpeg {best:.3f}")


if __name__ == "__main__":
    main()
