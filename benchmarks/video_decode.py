"""PyAV against OpenCV (headless) for ``bigbatch predict``'s video input, measured: decoding every frame of a video to
an RGB uint8 ``torch.Tensor`` [3, H, W], frames per second, the libraries alternated over rounds; also what each
costs to have (its installed size, its import time) and how the two agree (frame count, the container's count, the
timestamps, the pixels).

The test videos are written at run time with PyAV (libx264, yuv420p, 30 fps, a moving colour pattern with noise, so
the encoder has real work) into a temporary folder, as .mp4 and as .mkv (whose container stores no frame count).

Arms (``--arms``):

  pyav           the way bigbatch reads a video (``bigbatch/inference/video.py``): ``av.open`` on a file object (a
                 descriptor opened and checked first), ``thread_type = "AUTO"`` (frame and slice threads),
                 ``frame.to_ndarray(format="rgb24", threads=1)`` (the RGB conversion on the calling thread);
  pyav-sws-auto  the same with PyAV's default conversion (``threads=0``: swscale's own threads, one hand-off per
                 frame: slow on a busy machine);
  pyav-slice     the same as pyav with PyAV's default codec threading (slice threads: one slice in x264's H.264);
  pyav-path      the same as pyav, ``av.open`` on the path (not in the default arms);
  opencv         ``cv2.VideoCapture(path, cv2.CAP_FFMPEG)``, ``read()`` (BGR), ``cv2.cvtColor`` to RGB.

Each frame becomes ``torch.from_numpy(rgb).permute(2, 0, 1)`` (a view, no copy) in every arm.

    python benchmarks/video_decode.py [--sizes 640x480 1280x720] [--frames 300] [--rounds 5] [--arms ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
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

ARMS = ("pyav", "pyav-sws-auto", "pyav-slice", "pyav-path", "opencv")
DEFAULT_ARMS = ("pyav", "pyav-sws-auto", "pyav-slice", "opencv")


def write_video(path: Path, width: int, height: int, frames: int, fps: int = 30) -> None:
    """A ``frames``-frame H.264 video of a colour pattern that moves, with some noise."""
    import av

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"preset": "veryfast", "crf": "23"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            rgb = np.stack([(x + 4 * i) % 256, (y + 2 * i) % 256, ((x + y) // 2 + 3 * i) % 256], axis=-1)
            rgb = np.clip(rgb + rng.integers(-8, 9, rgb.shape), 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def pyav_frames(path: Path, mode: str):
    """(timestamp in seconds, [3, H, W] uint8 tensor) for each frame, with PyAV."""
    import av

    source = str(path) if mode == "pyav-path" else open(path, "rb")  # closed below
    try:
        with av.open(source) as container:
            stream = container.streams.video[0]
            if mode != "pyav-slice":
                stream.thread_type = "AUTO"
            threads = 0 if mode == "pyav-sws-auto" else 1
            for frame in container.decode(stream):
                rgb = frame.to_ndarray(format="rgb24", threads=threads)
                yield float(frame.time), torch.from_numpy(rgb).permute(2, 0, 1)
    finally:
        if not isinstance(source, str):
            source.close()


def opencv_frames(path: Path):
    """(timestamp in seconds, [3, H, W] uint8 tensor) for each frame, with OpenCV."""
    import cv2

    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    try:
        while True:
            ok, bgr = capture.read()
            if not ok:
                return
            seconds = capture.get(cv2.CAP_PROP_POS_MSEC) / 1000
            yield seconds, torch.from_numpy(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)
    finally:
        capture.release()


def frames_of(arm: str, path: Path):
    return opencv_frames(path) if arm == "opencv" else pyav_frames(path, arm)


def container_counts(path: Path) -> dict[str, float]:
    """The frame count each library reads from the container, without decoding (PyAV: 0 when unknown)."""
    import av
    import cv2

    with av.open(str(path)) as container:
        pyav = container.streams.video[0].frames
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    opencv = capture.get(cv2.CAP_PROP_FRAME_COUNT)
    capture.release()
    return {"pyav": pyav, "opencv": opencv}


def decode_rate(arm: str, path: Path) -> tuple[int, float, float]:
    """Frames decoded, frames per second (wall clock) and CPU milliseconds per frame (every thread of the process:
    less moved than the wall clock by other work on a shared machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    count = sum(1 for _ in frames_of(arm, path))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count, count / wall, 1000 * cpu / count


def agreement(path: Path) -> str:
    """Frame counts, timestamps and pixels of PyAV against OpenCV on one file."""
    pyav, opencv = list(pyav_frames(path, "pyav")), list(opencv_frames(path))
    line = f"decoded frames pyav {len(pyav)}, opencv {len(opencv)}; container count {container_counts(path)}"
    if len(pyav) != len(opencv):
        return line
    diffs = [(a.int() - b.int()).abs() for (_, a), (_, b) in zip(pyav, opencv, strict=True)]
    times = max(abs(ta - tb) for (ta, _), (tb, _) in zip(pyav, opencv, strict=True))
    expected = max(abs(t - i / 30) for i, (t, _) in enumerate(pyav))
    return (f"{line}\n    pixels |pyav - opencv|: max {max(int(d.max()) for d in diffs)}, "
            f"mean {statistics.fmean(float(d.float().mean()) for d in diffs):.3f}, "
            f"share differing {statistics.fmean(float((d > 0).float().mean()) for d in diffs):.3f}\n"
            f"    timestamps: largest pyav - opencv {times * 1000:.2f} ms; largest pyav - index/fps "
            f"{expected * 1000:.2f} ms")


def installed_size(distribution: str) -> float:
    """The installed files of ``distribution`` (its RECORD: the package, its bundled libraries, its metadata), MB."""
    files = importlib.metadata.distribution(distribution).files or []
    return sum(f.locate().stat().st_size for f in files if Path(f.locate()).is_file()) / 1e6


def import_seconds(module: str, runs: int = 7) -> float:
    """The median time to import ``module`` in a fresh interpreter (numpy imported first, as bigbatch has it)."""
    code = f"import time, numpy; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
             for _ in range(runs)]
    return statistics.median(times)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["640x480", "1280x720"])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS)
    args = parser.parse_args()

    import av
    import cv2

    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs "
          f"({len(os.sched_getaffinity(0))} usable), {cpu_model()}; Python {platform.python_version()}, "
          f"torch {torch.__version__}, numpy {np.__version__}")
    print(f"av {av.__version__} (FFmpeg libavcodec {av.library_versions['libavcodec']}), opencv-python-headless "
          f"{cv2.__version__}; torch threads {torch.get_num_threads()}, cv2 threads {cv2.getNumThreads()}")
    print(f"load average at the start: {Path('/proc/loadavg').read_text().split()[:3]} (other work on the machine)")
    for distribution, module in (("av", "av"), ("opencv-python-headless", "cv2")):
        print(f"{distribution}: installed {installed_size(distribution):.1f} MB, import {import_seconds(module):.3f} s")

    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            width, height = map(int, size.split("x"))
            mp4, mkv = Path(folder, f"{size}.mp4"), Path(folder, f"{size}.mkv")
            write_video(mp4, width, height, args.frames)
            write_video(mkv, width, height, args.frames)
            print(f"\n{size}, {args.frames} frames, H.264 .mp4 of {mp4.stat().st_size / 1e6:.1f} MB")
            print(f"  .mp4: {agreement(mp4)}")
            print(f"  .mkv: {agreement(mkv)}")
            rates: dict[str, list[float]] = {arm: [] for arm in args.arms}
            cpu: dict[str, list[float]] = {arm: [] for arm in args.arms}
            for _ in range(args.rounds):
                for arm in args.arms:  # alternated: a slow spell of the machine falls on every arm
                    count, rate, ms = decode_rate(arm, mp4)
                    assert count == args.frames, (arm, count)
                    rates[arm].append(rate)
                    cpu[arm].append(ms)
            for arm, values in rates.items():
                print(f"  {arm:13s} median {statistics.median(values):7.1f} frames/s (min {min(values):6.1f}, "
                      f"max {max(values):6.1f}); CPU {statistics.median(cpu[arm]):5.2f} ms/frame")
            if "pyav" in rates and "opencv" in rates:
                ratio = statistics.median(rates["pyav"]) / statistics.median(rates["opencv"])
                cpu_ratio = statistics.median(cpu["pyav"]) / statistics.median(cpu["opencv"])
                print(f"  pyav / opencv: frames/s {ratio:.2f}, CPU per frame {cpu_ratio:.2f}")
    print(f"\nload average at the end: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
