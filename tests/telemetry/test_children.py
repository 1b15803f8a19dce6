"""The data workers' share of a run's memory: the private memory of a process's children, sampled."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bigbatch.telemetry.children import SYS_KCMP, ChildrenSampler, descendants, private_bytes, shares_memory

pytestmark = pytest.mark.fast

ROLLUP = """55d0c0a8e000-7ffd2b1fe000 ---p 00000000 00:00 0                          [rollup]
Rss:              102400 kB
Pss:               60000 kB
Shared_Clean:      40000 kB
Shared_Dirty:       2400 kB
Private_Clean:      10000 kB
Private_Dirty:      50000 kB
Referenced:       102400 kB
Anonymous:         50000 kB
"""


def fake_process(proc: Path, pid: int, children: list[int], rollup: str = ROLLUP) -> None:
    (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "task" / str(pid) / "children").write_text(" ".join(map(str, children)) + " ")
    (proc / str(pid) / "smaps_rollup").write_text(rollup)


def test_private_memory_is_the_private_clean_and_dirty_pages_not_the_shared_ones(tmp_path):
    fake_process(tmp_path, 7, [])
    assert private_bytes(7, tmp_path) == (10000 + 50000) * 1024
    assert private_bytes(8, tmp_path) == 0, "a process gone meanwhile counts nothing"


def test_every_descendant_counts_and_the_sampler_keeps_the_largest_sum(tmp_path):
    fake_process(tmp_path, 1, [2, 3])
    fake_process(tmp_path, 2, [4])
    fake_process(tmp_path, 3, [])
    fake_process(tmp_path, 4, [], rollup="Private_Clean: 0 kB\nPrivate_Dirty: 1000 kB\n")
    assert sorted(descendants(1, tmp_path)) == [2, 3, 4]
    sampler = ChildrenSampler(1, proc=tmp_path)
    assert sampler.sample() == (2 * 60000 + 1000) * 1024
    (tmp_path / "2" / "smaps_rollup").unlink()  # a worker that ended
    assert sampler.sample() == (60000 + 1000) * 1024
    assert sampler.peak == (2 * 60000 + 1000) * 1024


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/smaps_rollup").exists(), reason="Linux's /proc")
def test_a_real_child_that_writes_64_mib_is_seen():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; x = b'1' * (64 << 20); print(flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # written
        sampler = ChildrenSampler(os.getpid())
        assert child.pid in descendants(os.getpid())
        assert sampler.sample() >= 64 << 20
    finally:
        child.communicate(b"")


def test_a_child_that_ends_while_the_tree_is_read_is_left_out_and_the_sampling_goes_on(tmp_path):
    fake_process(tmp_path, 1, [2, 3])  # 2 is listed, and gone before its own folder is read
    fake_process(tmp_path, 3, [])
    assert sorted(descendants(1, tmp_path)) == [2, 3]
    assert ChildrenSampler(1, proc=tmp_path).sample() == 60000 * 1024


@pytest.mark.skipif(platform.machine() not in SYS_KCMP or not Path(f"/proc/{os.getpid()}/smaps_rollup").exists(),
                    reason="Linux's /proc and kcmp")
def test_a_child_between_vfork_and_exec_shares_its_parents_memory_and_is_not_counted(tmp_path):
    """posix_spawn's child (CLONE_VM | CLONE_VFORK) opens a FIFO before its exec and waits there for a writer: until
    then its smaps_rollup is its parent's, 64 MiB written included."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    parent = subprocess.Popen([sys.executable, "-c", "import os, sys\nx = b'1' * (64 << 20)\n"
                               "os.posix_spawn('/bin/true', ['/bin/true'], os.environ, "
                               "file_actions=[(os.POSIX_SPAWN_OPEN, 3, sys.argv[1], os.O_RDONLY, 0)])", str(fifo)])
    try:
        while not descendants(parent.pid) and parent.poll() is None:
            time.sleep(0.01)
        (child,) = descendants(parent.pid)
        assert private_bytes(child) >= 64 << 20, "the child's own reading: its parent's memory"
        assert shares_memory(child, parent.pid)
        assert ChildrenSampler(parent.pid).sample() < 1 << 20
    finally:
        while parent.poll() is None:  # a writer lets the child go on to its exec (one that opens before the
            try:  # child waits there is refused: again)
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                break
            except OSError:
                time.sleep(0.01)
        parent.wait()
    assert parent.returncode == 0
