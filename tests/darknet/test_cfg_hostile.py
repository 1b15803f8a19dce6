"""A ``.cfg`` a user hands bigbatch is read only as a regular file within ``text.MAX_CFG_BYTES``: a FIFO is not waited
on, a link to ``/dev/zero`` not read, a huge file refused before any of it is read; each is one ``error:`` line naming
the key that named the file (``--cfg``, ``model.cfg``, ``config``) and the file."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bigbatch.darknet.cfg import read_darknet_cfg
from bigbatch.darknet.models import find_cfg
from bigbatch.darknet.text import MAX_CFG_BYTES, read_cfg_text
from bigbatch.errors import UserError
from tests.helpers import ROOT, run_main

SHAPES_CFG = ROOT / "bigbatch" / "configs" / "yolov3-tiny-shapes.cfg"
GUARD_S = 20
"""A FIFO's plain open() waits for a writer forever: the alarm makes such a hang a failure instead."""


def _timed_out(signum, frame):
    raise TimeoutError(f"a .cfg read did not return within {GUARD_S} s (a FIFO waited on?)")


@pytest.fixture(autouse=True)
def hang_guard():
    previous = signal.signal(signal.SIGALRM, _timed_out)
    signal.alarm(GUARD_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def hostile(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.cfg"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:  # a [net] and then nothing but a hole past the bound: sparse, no disk spent
        path.write_text("[net]\nwidth=416\nheight=416\n")
        os.truncate(path, MAX_CFG_BYTES + 1)
    return path


def expected(kind: str, path: Path) -> str:
    if kind == "huge":
        return f"{path} is {MAX_CFG_BYTES + 1:,} bytes, more than the {MAX_CFG_BYTES:,} a .cfg may be; not read"
    return f"{path} is not a regular file; not read"


KINDS = ["fifo", "zero", "folder", "huge"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_cfg_reader_refuses_what_is_not_a_bounded_regular_file(tmp_path, kind):
    path = hostile(tmp_path, kind)
    with pytest.raises(UserError) as caught:
        read_cfg_text(path, "--cfg: ")
    assert str(caught.value) == f"--cfg: {expected(kind, path)}"
    with pytest.raises(UserError) as caught:
        read_darknet_cfg(path, key="--cfg")
    assert str(caught.value) == f"--cfg: {expected(kind, path)}"


@pytest.mark.parametrize("kind", KINDS)
def test_anchors_cfg_is_refused_in_one_line_naming_the_option(tmp_path, kind):
    path = hostile(tmp_path, kind)
    result = run_main("data", "anchors", str(tmp_path / "none.data"), "--num", "6", "--cfg", str(path),
                      "--out", str(tmp_path / "out.cfg"))
    assert result.returncode != 0
    assert result.stderr.strip() == f"error: --cfg: {expected(kind, path)}", result.stderr
    assert not (tmp_path / "out.cfg").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_model_cfg_is_refused_in_one_line_naming_the_key(tmp_path, kind):
    path = hostile(tmp_path, kind)
    with pytest.raises(UserError) as caught:
        find_cfg(str(path))
    assert str(caught.value) == f"model.cfg: {expected(kind, path)}"
    with pytest.raises(UserError) as caught:
        find_cfg(str(path), key="--from")
    assert str(caught.value) == f"--from: {expected(kind, path)}"
    result = run_main("show", str(SHAPES_CFG), "--set", f"model.cfg={path}")
    assert result.returncode != 0
    assert f"error: model.cfg: {expected(kind, path)}" in result.stderr, result.stderr


def test_a_huge_cfg_given_as_the_config_is_refused_before_it_is_read(tmp_path):
    path = hostile(tmp_path, "huge")
    result = run_main("show", str(path))
    assert result.returncode != 0
    assert result.stderr.strip() == f"error: config: {expected('huge', path)}", result.stderr


def test_a_cfg_at_the_bound_is_read(tmp_path):
    path = tmp_path / "padded.cfg"
    text = SHAPES_CFG.read_text()
    path.write_text(text + "#" * (MAX_CFG_BYTES - len(text.encode()) - 1) + "\n")
    assert path.stat().st_size == MAX_CFG_BYTES
    assert len(read_darknet_cfg(path, key="--cfg").layers) == len(read_darknet_cfg(SHAPES_CFG).layers)
    assert find_cfg(str(path)) == path
