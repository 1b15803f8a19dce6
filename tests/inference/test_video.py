"""bigbatch/inference/video.py: a video's frames in order as RGB tensors, its frame count, and what it refuses (a
file that is not a regular file, frames past the size bound, a file PyAV cannot read, PyAV missing). The videos are
written at test time with PyAV."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading

import pytest
import torch

from bigbatch.errors import UserError
from bigbatch.inference import video
from tests.helpers import VIDEO_HEIGHT as HEIGHT
from tests.helpers import VIDEO_WIDTH as WIDTH
from tests.helpers import colour, write_video

pytestmark = pytest.mark.fast

FRAMES = 12
TOLERANCE = 12
"""How far a decoded channel's mean may be from the colour encoded (4:2:0 chroma, MPEG-4 quantisation)."""


@pytest.fixture
def clip(tmp_path):
    path = tmp_path / "clip.mp4"
    write_video(path, [colour(i) for i in range(FRAMES)])
    return path


def means(frame: torch.Tensor) -> list[float]:
    return frame.float().mean(dim=(1, 2)).tolist()


def assert_colour(frame: torch.Tensor, rgb: tuple[int, int, int]) -> None:
    assert means(frame) == pytest.approx(rgb, abs=TOLERANCE)


def test_a_video_is_known_by_its_suffix_in_any_case():
    assert video.is_video("a/b.mp4") and video.is_video("B.MKV") and video.is_video("c.WebM")
    assert not video.is_video("a.jpg") and not video.is_video("mp4") and not video.is_video("a.mp4.txt")


def test_every_frame_in_order_as_rgb_uint8(clip):
    frames = list(video.video_frames(str(clip)))
    assert [index for index, _ in frames] == list(range(FRAMES))
    for index, frame in frames:
        assert frame.dtype == torch.uint8 and frame.shape == (3, HEIGHT, WIDTH)
        assert_colour(frame, colour(index))
    assert video.frame_count(clip) == FRAMES


def test_a_stride_yields_every_nth_frame_with_its_own_index(clip):
    frames = list(video.video_frames(clip, vid_stride=5))
    assert [index for index, _ in frames] == [0, 5, 10]
    for index, frame in frames:
        assert_colour(frame, colour(index))
    with pytest.raises(ValueError, match="vid_stride"):
        next(video.video_frames(clip, vid_stride=0))


def test_red_decodes_red(tmp_path):
    path = tmp_path / "red.avi"
    write_video(path, [(255, 0, 0)] * 2)
    _, frame = next(video.video_frames(path))
    red, green, blue = means(frame)
    assert red > 255 - TOLERANCE and green < TOLERANCE and blue < TOLERANCE


def test_a_container_without_a_frame_count_gives_none(tmp_path):
    path = tmp_path / "clip.mkv"  # Matroska stores no frame count
    write_video(path, [colour(i) for i in range(3)])
    assert video.frame_count(path) is None
    assert len(list(video.video_frames(path))) == 3


def test_frames_past_the_size_bound_are_refused_naming_the_file(clip, monkeypatch):
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", WIDTH * HEIGHT - 1)
    with pytest.raises(UserError, match=f"{re.escape(str(clip))}: .* {WIDTH}x{HEIGHT} pixels"):
        next(video.video_frames(clip))
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", WIDTH * HEIGHT)
    assert next(video.video_frames(clip))[0] == 0


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    pytest.importorskip("av")
    fifo = tmp_path / "stream.mp4"
    os.mkfifo(fifo)
    errors = []

    def read() -> None:
        for call in (lambda: next(video.video_frames(fifo)), lambda: video.frame_count(fifo)):
            try:
                call()
            except UserError as error:
                errors.append(str(error))

    reader = threading.Thread(target=read, daemon=True)  # opening a FIFO for reading may block: not in this thread
    reader.start()
    reader.join(timeout=60)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer that closes: the reader sees the end
        pytest.fail("opening the FIFO waited for a writer")
    assert errors == [f"{fifo} is not a regular file: a video is read from a regular file only"] * 2


def test_a_file_that_is_not_a_video_is_a_runtime_error_naming_it(tmp_path):
    pytest.importorskip("av")
    text = tmp_path / "notes.mp4"
    text.write_text("not a video\n" * 100)
    with pytest.raises(RuntimeError, match=f"{re.escape(str(text))}: not a video PyAV reads"):
        next(video.video_frames(text))
    assert video.frame_count(text) is None
    with pytest.raises(RuntimeError, match="cannot open it"):
        next(video.video_frames(tmp_path / "missing.mp4"))


def test_without_pyav_one_line_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # ``import av`` raises ImportError
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\0" * 64)
    expected = "video input needs the optional 'video' extra: pip install 'bigbatch[video]'"
    for call in (video.require_video, lambda: next(video.video_frames(clip)), lambda: video.frame_count(clip)):
        with pytest.raises(UserError) as caught:
            call()
        assert str(caught.value) == expected


def test_the_module_imports_without_pyav(monkeypatch):
    """A fresh copy of the module runs with ``import av`` failing, and imports PyAV only when asked."""
    monkeypatch.setitem(sys.modules, "av", None)
    spec = importlib.util.spec_from_file_location("video_without_av", video.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.is_video("a.mp4")
    with pytest.raises(UserError, match=r"bigbatch\[video\]"):
        fresh.require_video()
