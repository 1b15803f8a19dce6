"""bigbatch's input pipeline against torchvision's, side by side, per number of DataLoader workers.

All sides read the same folder of real JPEGs (crops of the two photographs that ship with scikit-learn,
re-encoded at quality 90, ImageNet-like sizes: 300-427 x 375-500 px) in an ImageFolder layout, 32 images a
batch, to a float tensor at 299 x 299:

  bigbatch exact   ``data.name: folder`` with the Inception training preprocessing at 299 (TF's distorted
                   bounding-box crop, TF1 bilinear resize, flip, fast colour distortion), ``data.decode: exact``,
                   read as training reads it (``data/pipeline/bench.py``), in batches of 32 as the other sides
                   (``subdivisions: 1``);
  bigbatch fast    the same with ``data.decode: fast`` (reduced DCT decode where the crop allows it, the resize
                   on uint8 pixels by torch);
  tv equal work    torchvision v2 on ``torchvision.io.decode_jpeg`` tensors doing the same work:
                   ``RandomResizedCrop(299, scale=(0.1, 1), ratio=(3/4, 4/3), interpolation=BILINEAR,
                   antialias=False)`` (the Inception crop's effective area range and its aspects),
                   ``RandomHorizontalFlip()``,
                   ``ToDtype(float32, scale=True)``, ``ColorJitter(brightness=0.125, saturation=0.5)`` (two
                   colour operations, as the fast colour distortion's brightness and chroma offsets),
                   ``Normalize([0.5] * 3, [0.5] * 3)`` (to [-1, 1]);
  tv usual         ``ImageFolder`` (PIL) + v2 ``RandomResizedCrop(299)``, ``RandomHorizontalFlip``,
                   ``ColorJitter(0.4, 0.4, 0.4)``, to a float tensor normalised by ImageNet's mean and std:
                   the pipeline a torchvision user writes by default (more colour work than bigbatch's);
  tv user          ``ImageFolder`` (PIL decoding) with torchvision v2 as its documentation recommends (the
                   transforms on a uint8 tensor: ``ToImage()`` first, ``ToDtype(float32, scale=True)`` last):
                   ``RandomResizedCrop(299, antialias=True)``, ``RandomHorizontalFlip()``,
                   ``ColorJitter(brightness=0.125, saturation=0.5)``: the peer a user runs at torch's default
                   threads (``--threads default``), where its resize runs on torch's intra-op threads;
  tv user pil      the same transforms on the PIL image (PIL's resize and enhancers, one thread), then
                   ``ToImage()``, ``ToDtype(float32, scale=True)``;
  dali             with ``--dali`` and where ``nvidia-dali`` imports: a DALI pipeline on the CPU
                   (``fn.readers.file``, ``fn.decoders.image_random_crop`` with the same area and aspect ranges:
                   a region-of-interest decode, ``fn.resize`` bilinear, ``fn.flip``, ``fn.color_twist`` brightness
                   and saturation, ``fn.crop_mirror_normalize``). DALI draws its own crops, so it is a peer, not a
                   path bigbatch could take: bigbatch's crop comes from each sample's seed.

``--threads 1`` (the default) pins one torch thread in every measurement, on every side; ``--threads default``
leaves torch's own default (one a core), as a user's process has it.

With ``--shards`` the folder is also packed (``bigbatch pack``) and ``data.name: shards`` measured (exact).
Rounds alternate the order of the sides, each measurement in a process of its own (``measure_apart``); the
median images/s is reported, and the ratios to the first side (``tv equal work`` unless ``--sides`` says
otherwise): of the medians, and each round's (the sides of a round run back to back, so a round's ratio is the
least disturbed by the machine's drifts) with their median.

    python benchmarks/input_pipeline.py [--images 1000] [--per-run 320] [--rounds 3] [--workers 0 1 2]
                                        [--threads 1|default] [--sides NAME ...] [--shards] [--dali]
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


def bigbatch_rate(data: Path, name: str, workers: int, images: int, decode: str = "exact") -> float:
    from bigbatch.config import load_config
    from bigbatch.data.pipeline.bench import measure
    from bigbatch.tasks import build_task

    cfg = load_config("digits", [f"data.name={name}", f"data.path={data}", "data.size=299", "batch=32",
                                 "subdivisions=1", "data.preprocessing=inception", f"data.decode={decode}"])
    result = measure(cfg, build_task(cfg), workers, images)
    return result.images_per_s


class ConstantFinish:
    """A ``CropFirst`` that keeps another's crop box and reduced decode but finishes every sample as one fixed
    float image written into its batch slot: what is left of the pipeline without resize and colour."""

    def __init__(self, inner, size: int) -> None:  # noqa: ANN001
        self.inner, self.fast = inner, inner.fast
        self.sample = torch.rand(3, size, size)

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        return self.inner.box(height, width)

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        return self.inner.needed(box_height, box_width)

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.sample.clone() if out is None else out.copy_(self.sample)


def floor_rate(data: Path, workers: int, images: int, decode: bool) -> float:
    """bigbatch fast's loader with the work taken out: ``decode`` keeps the region decode (the same boxes and
    reductions) and the write of each sample into its batch; without it only the write is left (no file is read).
    Either is an upper bound on any pipeline that does that much through torch's DataLoader: the batch is
    allocated, written and, with workers, handed to the training process in shared memory."""
    from bigbatch.config import load_config
    from bigbatch.data.pipeline.bench import measure
    from bigbatch.tasks import build_task

    cfg = load_config("digits", ["data.name=folder", f"data.path={data}", "data.size=299", "batch=32",
                                 "subdivisions=1", "data.preprocessing=inception", "data.decode=fast"])
    task = build_task(cfg)
    images_set = task.train_set
    images_set.preprocess = ConstantFinish(images_set.preprocess, 299)
    if not decode:
        finish = images_set.preprocess.finish
        images_set._sample = lambda index, out=None: (finish(None, out), images_set.label(index), [])
    return measure(cfg, task, workers, images).images_per_s


def read_jpeg_tensor(path: str) -> torch.Tensor:
    """torchvision's own decode: libjpeg-turbo straight into a uint8 CHW tensor."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def loader_rate(dataset: torch.utils.data.Dataset, workers: int, images: int) -> float:
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=workers, drop_last=True)
    stream = iter(loader)
    next(stream)  # start-up, not timed (as bigbatch's measurement)
    start, read = time.perf_counter(), 0
    while read < images:
        read += len(next(stream)[0])
    return read / (time.perf_counter() - start)


def torchvision_equal_rate(data: Path, workers: int, images: int) -> float:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.RandomResizedCrop(299, scale=(0.1, 1.0), ratio=(3 / 4, 4 / 3),
                             interpolation=v2.InterpolationMode.BILINEAR, antialias=False),
        v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
        v2.ColorJitter(brightness=0.125, saturation=0.5), v2.Normalize([0.5] * 3, [0.5] * 3)])
    dataset = ImageFolder(str(data / "train"), transform=transform, loader=read_jpeg_tensor)
    return loader_rate(dataset, workers, images)


def torchvision_usual_rate(data: Path, workers: int, images: int) -> float:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose([v2.RandomResizedCrop(299, antialias=True), v2.RandomHorizontalFlip(),
                            v2.ColorJitter(0.4, 0.4, 0.4), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    return loader_rate(ImageFolder(str(data / "train"), transform=transform), workers, images)


def user_transforms(pil_ops: bool):  # noqa: ANN201
    """The ``tv user`` peer's transforms: on a uint8 tensor (torchvision's recommendation), or on the PIL image."""
    from torchvision.transforms import v2

    work = [v2.RandomResizedCrop(299, antialias=True), v2.RandomHorizontalFlip(),
            v2.ColorJitter(brightness=0.125, saturation=0.5)]
    if pil_ops:
        return v2.Compose([*work, v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    return v2.Compose([v2.ToImage(), *work, v2.ToDtype(torch.float32, scale=True)])


def torchvision_user_rate(data: Path, workers: int, images: int, pil_ops: bool) -> float:
    from torchvision.datasets import ImageFolder

    return loader_rate(ImageFolder(str(data / "train"), transform=user_transforms(pil_ops)), workers, images)


def dali_rate(data: Path, workers: int, images: int) -> float:
    """DALI on the CPU; ``workers`` becomes its thread count (at least 1: DALI has no in-process mode)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=32, num_threads=max(1, workers), device_id=None, seed=0)
    def pipeline():  # noqa: ANN202
        jpegs, labels = fn.readers.file(file_root=str(data / "train"), random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.1, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=299, resize_y=299, interp_type=types.INTERP_LINEAR, antialias=False)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        images = fn.color_twist(images, brightness=fn.random.uniform(range=[0.875, 1.125]),
                                saturation=fn.random.uniform(range=[0.5, 1.5]))
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[127.5] * 3, std=[127.5] * 3)
        return images, labels

    pipe = pipeline()
    pipe.build()
    pipe.run()  # start-up, not timed
    start, read = time.perf_counter(), 0
    while read < images:
        out = pipe.run()
        read += len(out[0])
    return read / (time.perf_counter() - start)


def side_rate(side: str, data: Path, workers: int, images: int) -> float:
    """One measurement of one side (run in a process of its own: see ``measure_apart``)."""
    if side == "tv equal work":
        return torchvision_equal_rate(data / "folder", workers, images)
    if side == "tv usual":
        return torchvision_usual_rate(data / "folder", workers, images)
    if side.startswith("tv user"):
        return torchvision_user_rate(data / "folder", workers, images, pil_ops=side == "tv user pil")
    if side == "dali":
        return dali_rate(data / "folder", workers, images)
    if side.startswith("floor"):
        return floor_rate(data / "folder", workers, images, decode="decode" in side)
    if side == "bigbatch shards":
        return bigbatch_rate(data / "shards", "shards", workers, images)
    return bigbatch_rate(data / "folder", "folder", workers, images, side.removeprefix("bigbatch "))


def measure_apart(side: str, data: Path, workers: int, images: int, threads: str) -> float:
    """Each measurement in a fresh process: in one long process the sides share a heap whose state (glibc's
    adaptive mmap threshold, what was freed where) one side leaves for the next, which moved 0-worker ratios by
    30 % from one ordering to the next."""
    result = subprocess.run([sys.executable, __file__, "--measure", side, "--data", str(data), "--workers",
                             str(workers), "--per-run", str(images), "--threads", threads],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{side} at {workers} workers failed:\n{result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


DEFAULT_SIDES = ("tv equal work", "bigbatch exact", "bigbatch fast", "tv usual")
SIDES = (*DEFAULT_SIDES, "tv user", "tv user pil")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000, help="JPEGs in the generated folder")
    parser.add_argument("--per-run", type=int, default=320, help="images timed per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", choices=["1", "default"], default="1",
                        help="torch threads in every measurement: one, or torch's default (one a core)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=None,
                        help=f"the sides measured (default: {', '.join(DEFAULT_SIDES)}); the first is the baseline of "
                             "the ratios")
    parser.add_argument("--shards", action="store_true", help="also measure data.name: shards")
    parser.add_argument("--dali", action="store_true", help="also measure NVIDIA DALI on the CPU, where it imports")
    parser.add_argument("--floors", action="store_true",
                        help="also measure bigbatch fast with the work taken out: the region decode and the batch's "
                             "write and hand-over ('floor decode+handoff'), and the write and hand-over alone "
                             "('floor handoff')")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one side's measurement, in a process of its own
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads == "1":
        torch.set_num_threads(1)
    if not args.measure and args.per_run + 32 > args.images:
        parser.error(f"--per-run {args.per_run} needs at least {args.per_run + 32} --images: torchvision's loaders "
                     f"read one epoch, its first batch untimed")
    if args.measure:
        print(side_rate(args.measure, args.data, args.workers[0], args.per_run))
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, Pillow "
          f"{Image.__version__}; {args.images} JPEGs, {args.per_run} images a measurement, {args.rounds} rounds, "
          f"each measurement in a process of its own, {torch.get_num_threads()} torch threads ({args.threads})")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_folder(data / "folder", args.images)
        sides = list(args.sides or DEFAULT_SIDES)
        if args.shards:
            from bigbatch.data.formats.pack import pack

            pack(data / "folder", data / "shards", 64 * 2**20)
            sides.append("bigbatch shards")
        if args.floors:
            sides += ["floor decode+handoff", "floor handoff"]
        if args.dali:
            try:
                import nvidia.dali

                print(f"DALI {nvidia.dali.__version__}")
                sides.append("dali")
            except ImportError as error:
                print(f"DALI skipped: {error}")
        base_name, others = sides[0], sides[1:]
        print(f"{'workers':>7s}  " + "  ".join(f"{name + ' img/s':>20s}" for name in sides)
              + "  " + "  ".join(f"{name + ' / ' + base_name:>24s}" for name in others))
        for workers in args.workers:
            rates: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(args.rounds):
                for name in (sides if r % 2 == 0 else list(reversed(sides))):
                    rates[name].append(measure_apart(name, data, workers, args.per_run, args.threads))
            median = {name: statistics.median(values) for name, values in rates.items()}
            base = median[base_name]
            print(f"{workers:7d}  " + "  ".join(f"{median[n]:20.1f}" for n in sides)
                  + "  " + "  ".join(f"{median[n] / base:24.2f}" for n in others), flush=True)
            for name in others:  # each round's ratio (the sides of a round ran back to back)
                paired = [mine / theirs for mine, theirs in zip(rates[name], rates[base_name], strict=True)]
                print(f"{'':7s}  {name} / {base_name}, each round: " + ", ".join(f"{r:.2f}" for r in paired)
                      + f" (median {statistics.median(paired):.2f})", flush=True)


if __name__ == "__main__":
    main()
