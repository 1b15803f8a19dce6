"""Video input of ``bigbatch predict``: the frames of a video file, decoded with PyAV (FFmpeg), as RGB tensors.

PyAV is the optional extra ``video`` (``pip install 'bigbatch[video]'``); it is imported inside the functions that
use it, so this module imports without it, and :func:`require_video` turns its absence into one line naming the
extra. (PyAV over OpenCV: ``benchmarks/video_decode.py`` measures both; the same frames and pixels, a frame count
only where the container holds one, errors with their reason, a file object to read from, a smaller install.)

A video file is untrusted: it is opened as :func:`bigbatch.data.pipeline.files.open_regular` opens an image
(without blocking, then checked on the open descriptor: a FIFO, device or socket is refused) and PyAV reads that
descriptor, so the file checked is the file decoded. Each frame's size is checked before it is converted to RGB,
against ``MAX_FRAME_PIXELS``. (Opening the container lets FFmpeg probe its streams, which may decode a first frame
within FFmpeg's own bound, ``av_image_check_size``: about 2**28 pixels.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bigbatch.data.pipeline.files import NotARegularFile, open_regular
from bigbatch.errors import UserError

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv")
"""The file names read as videos (case-insensitive): containers FFmpeg, and so PyAV, reads."""

MAX_FRAME_PIXELS = 2**27
"""The largest frame decoded, in pixels (134 million: 402 MB as RGB), about PIL's bound for an image
(``2 x Image.MAX_IMAGE_PIXELS``, past which it refuses a decompression bomb)."""

MISSING_EXTRA = "video input needs the optional 'video' extra: pip install 'bigbatch[video]'"


def is_video(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a video file, by its suffix (any case)."""
    return Path(path).suffix.lower() in VIDEO_SUFFIXES


def require_video() -> Any:
    """The ``av`` module (PyAV); ``UserError`` naming the extra to install when it is missing."""
    try:
        import av
    except ImportError:
        raise UserError(MISSING_EXTRA) from None
    return av


@contextlib.contextmanager
def _opened(path: str | os.PathLike) -> Iterator[tuple[Any, Any]]:
    """``(container, video stream)`` of the regular file ``path``: ``UserError`` for a file of another kind,
    ``RuntimeError`` (with the reason) for one that cannot be opened or holds no video."""
    av = require_video()
    name = os.fsdecode(path)
    try:
        file = open_regular(path, limit=2**63 - 1, what="a video")
    except NotARegularFile:
        raise UserError(f"{name} is not a regular file: a video is read from a regular file only") from None
    except OSError as error:
        raise RuntimeError(f"{name}: cannot open it ({error.strerror or error})") from None
    with file:
        try:
            container = av.open(file, "r")
        except (av.FFmpegError, OSError) as error:
            raise RuntimeError(f"{name}: not a video PyAV reads ({_reason(error)})") from None
        with container:
            if not container.streams.video:
                raise RuntimeError(f"{name}: holds no video stream")
            yield container, container.streams.video[0]


def _reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _check_size(name: str, width: int, height: int) -> None:
    if width * height > MAX_FRAME_PIXELS:
        raise UserError(f"{name}: its frames are {width}x{height} pixels, more than the {MAX_FRAME_PIXELS:,} "
                        "pixels a video frame may have")


def video_frames(path: str | os.PathLike, vid_stride: int = 1) -> Iterator[tuple[int, torch.Tensor]]:
    """``(index, frame)`` for every ``vid_stride``-th frame of the video ``path`` (the first, index 0, included), in
    display order: ``frame`` is RGB, ``torch.uint8``, ``[3, H, W]`` (a view of an ``[H, W, 3]`` array: call
    ``.contiguous()`` where channels-first memory is needed). Every frame is decoded (the others depend on it); only
    those yielded are converted to RGB.

    ``UserError``: not a regular file, frames larger than ``MAX_FRAME_PIXELS``, PyAV missing. ``RuntimeError``: a
    file PyAV cannot open (nothing yielded), or a frame that fails to decode (the frames before it were yielded)."""
    if vid_stride < 1:
        raise ValueError(f"vid_stride must be 1 or more, not {vid_stride}")
    name = os.fsdecode(path)
    with _opened(path) as (container, stream):
        av = require_video()
        _check_size(name, stream.codec_context.width, stream.codec_context.height)
        stream.thread_type = "AUTO"  # frame and slice threads
        index = -1
        try:
            for index, frame in enumerate(container.decode(stream)):
                if index % vid_stride == 0:
                    _check_size(name, frame.width, frame.height)
                    yield index, torch.from_numpy(frame.to_ndarray(format="rgb24", threads=1)).permute(2, 0, 1)
        except (av.FFmpegError, OSError) as error:
            raise RuntimeError(f"{name}: frame {index + 1} does not decode ({_reason(error)})") from None


def frame_count(path: str | os.PathLike) -> int | None:
    """The number of frames the container of ``path`` declares (for a progress bar), without decoding; None where it
    declares none (Matroska and WebM do not) or PyAV cannot open the file (:func:`video_frames` says why).
    ``UserError`` as :func:`video_frames`: not a regular file, PyAV missing."""
    try:
        with _opened(path) as (_, stream):
            return stream.frames or None
    except RuntimeError:
        return None
