"""The shared-memory all-reduce of one machine's processes, against Gloo's, with real spawned processes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from bigbatch.floor import host_all_reduce
from bigbatch.floor.host_all_reduce import HostAllReduce
from tests.helpers import HANG_GUARD_S, ROOT, join_gloo, run_spawned

WORLD = 3
CALLS = 100

pytestmark = pytest.mark.skipif(not (
    os.path.isdir("/dev/shm") and os.uname().machine.lower() in {"x86_64", "amd64"}),
    reason="the shared-memory all-reduce exists on x86-64 with /dev/shm only")


def _inputs(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    return [torch.randn(1 + (i * 97) % 4100, generator=gen) * 10 ** (i % 5) for i in range(CALLS)]


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    join_gloo(rank, WORLD, port)
    try:
        channel = host_all_reduce.channel_for()
        result = {"made": channel is not None, "same_object": host_all_reduce.channel_for() is channel,
                  "segment_left": channel is not None and os.path.exists(channel.segment)}
        # back to back, so that a rank may run a call ahead of the others (what the two slots are for)
        result["sums"] = [channel.sum_(x.clone()) for x in _inputs(rank)]
        result["gloo_sums"] = []
        for x in _inputs(rank):
            dist.all_reduce(x)
            result["gloo_sums"].append(x)
        result["fits"] = [channel.fits(t) for t in (torch.zeros(channel.capacity), torch.zeros(channel.capacity + 1),
                                                    torch.zeros(4, dtype=torch.float64), torch.zeros(4, 2).t())]

        # a rank that cannot see the segment (as on another machine): every rank falls back to torch.distributed
        hidden = dist.new_group(backend="gloo")
        exists = os.path.exists
        if rank == 1:
            host_all_reduce.os.path.exists = lambda path: False if "bigbatch-all-reduce" in path else exists(path)
        try:
            result["other_machine"] = host_all_reduce.channel_for(hidden)
        finally:
            host_all_reduce.os.path.exists = exists

        # rank 0 cannot map the segment it made: every rank falls back, and the file is gone
        unmappable = dist.new_group(backend="gloo")
        real_map, made = host_all_reduce._map, []
        if rank == 0:
            host_all_reduce._map = lambda path, *args: made.append(path)
        try:
            result["rank0_cannot_map"] = host_all_reduce.channel_for(unmappable)
        finally:
            host_all_reduce._map = real_map
        result["rank0_segment_left"] = [os.path.exists(path) for path in made]

        # the decision, before any segment is made: a rank of another machine (another identity), or one whose switch
        # says off, sends every rank's sums through torch.distributed; a switch value it does not know is the same
        # error on every rank
        real_create, created = host_all_reduce._create_segment, []
        host_all_reduce._create_segment = lambda nbytes: created.append(nbytes)
        real_id = host_all_reduce.shared_memory_id
        try:
            if rank == 1:
                host_all_reduce.shared_memory_id = lambda: "another-boot:1"
            result["another_machine"] = host_all_reduce.channel_for(dist.new_group(backend="gloo"))
            host_all_reduce.shared_memory_id = real_id
            for value, key in (("off", "switched_off"), ("0", "switched_off_0"), ("on", "bad_switch")):
                group = dist.new_group(backend="gloo")
                if rank == 2:
                    os.environ[host_all_reduce.SWITCH] = value
                try:
                    result[key] = host_all_reduce.channel_for(group)
                except ValueError as e:
                    result[key] = str(e)
                finally:
                    os.environ.pop(host_all_reduce.SWITCH, None)
        finally:
            host_all_reduce._create_segment, host_all_reduce.shared_memory_id = real_create, real_id
        result["segments_made_for_decided_groups"] = len(created)
        torch.save(result, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _segment_of_a_killed_run() -> str:
    """A segment made by the real code in a process then killed before it removed the name (as torchrun's SIGTERM
    does to a worker): what a killed run leaves in /dev/shm."""
    code = ("import os, signal\n"
            "from bigbatch.floor import host_all_reduce as h\n"
            "print(h._create_segment(h.HostAllReduce.segment_bytes(2)).path, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=HANG_GUARD_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    path = killed.stdout.strip()
    assert os.path.getsize(path) == HostAllReduce.segment_bytes(2)
    return path


@pytest.fixture(scope="module")
def left_by_a_killed_run() -> Iterator[str]:
    path = _segment_of_a_killed_run()
    yield path
    with contextlib.suppress(FileNotFoundError):  # the test failed: this test made it, so it removes it
        os.unlink(path)


@pytest.fixture(scope="module")
def results(left_by_a_killed_run, tmp_path_factory) -> list[dict]:
    return run_spawned(_worker, WORLD, tmp_path_factory.mktemp("host_all_reduce"))


def test_sums_equal_gloo_and_are_the_same_bits_on_every_rank(results):
    for r in range(WORLD):
        assert results[r]["made"] and results[r]["same_object"]
    expected = [sum(parts) for parts in zip(*(_inputs(r) for r in range(WORLD)), strict=True)]
    for i in range(CALLS):
        torch.testing.assert_close(results[0]["sums"][i], expected[i], rtol=1e-6, atol=1e-6 * 10 ** (i % 5))
        torch.testing.assert_close(results[0]["sums"][i], results[0]["gloo_sums"][i], rtol=1e-6,
                                   atol=1e-6 * 10 ** (i % 5))
        for r in range(1, WORLD):
            assert torch.equal(results[r]["sums"][i], results[0]["sums"][i])


def test_segment_name_is_removed_once_every_rank_has_mapped_it(results):
    """Gone on every rank when ``channel_for`` returns, so that a run killed from then on leaves nothing."""
    assert not any(results[r]["segment_left"] for r in range(WORLD))


def test_the_next_run_removes_a_segment_left_by_a_killed_run(left_by_a_killed_run, results):
    assert not os.path.exists(left_by_a_killed_run)


def test_only_segments_of_runs_that_are_over_are_removed():
    """A killed run's segment goes; a live run's (its creator exists, or it is locked: a creator in another PID
    namespace) and anything not provably this module's stay."""
    stale = _segment_of_a_killed_run()
    dead = int(host_all_reduce._NAME.fullmatch(os.path.basename(stale))[1])
    marked = bytes(8) + host_all_reduce._MAGIC + bytes(48)
    made = [stale]

    def make(name: str, content: bytes) -> str:
        made.append(os.path.join("/dev/shm", name))
        with open(made[-1], "xb") as f:
            f.write(content)
        return made[-1]

    try:
        kept = [
            make(f"bigbatch-all-reduce-{os.getppid()}-{secrets.token_hex(8)}", marked),  # its creator is alive
            make(f"bigbatch-all-reduce-{dead}-{secrets.token_hex(8)}", bytes(64)),  # no magic
            make(f"not-bigbatch-{dead}-{secrets.token_hex(8)}", marked),  # another name
            make(f"bigbatch-all-reduce-{dead}-{secrets.token_hex(4)}", marked),  # not a name this module makes
        ]
        made.append(f"/dev/shm/bigbatch-all-reduce-{dead}-{secrets.token_hex(8)}")
        with open(made[-1], "xb") as locked:
            fcntl.flock(locked, fcntl.LOCK_SH)  # before it is marked, as a creator does: no run takes it for stale
            locked.write(marked)
            locked.flush()
            host_all_reduce._remove_stale_segments()
            assert not os.path.exists(stale)
            assert [os.path.exists(path) for path in [*kept, locked.name]] == [True] * 5
    finally:
        for path in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def test_only_contiguous_float32_tensors_that_fit(results):
    assert results[0]["fits"] == [True, False, False, False]


def test_a_rank_that_cannot_see_the_segment_makes_every_rank_fall_back(results):
    assert [results[r]["other_machine"] for r in range(WORLD)] == [None] * WORLD


def test_the_channel_is_for_ranks_of_one_machine_whose_switch_is_not_off(results):
    """Decided from every rank's machine identity and switch, the same on every rank, before any segment is made."""
    for key in ("another_machine", "switched_off", "switched_off_0"):
        assert [results[r][key] for r in range(WORLD)] == [None] * WORLD, key
    error = f"{host_all_reduce.SWITCH}='on': expected auto or off (1 or 0)"
    assert [results[r]["bad_switch"] for r in range(WORLD)] == [error] * WORLD
    assert results[0]["segments_made_for_decided_groups"] == 0


def test_the_machine_identity_is_the_boot_and_the_dev_shm_mount():
    boot = open(host_all_reduce._BOOT_ID).read().strip()
    assert host_all_reduce.shared_memory_id() == f"{boot}:{os.stat('/dev/shm').st_dev}"


def test_rank_0_unable_to_map_its_segment_makes_every_rank_fall_back(results):
    assert [results[r]["rank0_cannot_map"] for r in range(WORLD)] == [None] * WORLD
    assert results[0]["rank0_segment_left"] == [False]


def test_a_rank_that_never_comes_times_out_naming_it(tmp_path):
    path = tmp_path / "segment"
    nbytes = HostAllReduce.segment_bytes(2, capacity=8)
    path.write_bytes(bytes(nbytes))
    storage = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
    channel = HostAllReduce(storage, rank=0, world=2, segment=str(path), capacity=8,
                            timeout=timedelta(seconds=0.2))
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] of 2 did not reach call 1 within 0.2 s"):
        channel.sum_(torch.ones(3))
    with pytest.raises(ValueError, match="at most 8 values"):
        channel.sum_(torch.ones(9))


def test_a_full_dev_shm_means_no_segment_and_nothing_left(monkeypatch):
    def ours() -> set[str]:
        return {name for name in os.listdir("/dev/shm") if name.startswith(f"bigbatch-all-reduce-{os.getpid()}-")}

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    before = ours()
    monkeypatch.setattr(host_all_reduce.os, "posix_fallocate", full)
    assert host_all_reduce._create_segment(HostAllReduce.segment_bytes(2)) is None
    assert ours() == before
