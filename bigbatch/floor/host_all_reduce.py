"""Sum small float32 CPU tensors over the processes of one machine through shared memory instead of Gloo.

Why: cross-device BatchNorm makes two collectives per layer and step, each a few hundred floats, and every
process waits for each of them. Over Gloo's TCP transport such a call costs 0.5-1 ms on a CPU machine (thread
hand-offs and socket wake-ups in both processes); through a shared-memory segment it costs a few tens of
microseconds. ``torch.distributed`` has no shared-memory CPU backend, so this module is that one collective.
It is used only where it is known to be correct: every rank of the group is on one machine and maps the same
segment, the tensor is a contiguous float32 CPU tensor that fits, and the CPU is x86-64. Otherwise
:func:`channel_for` answers None and the caller uses ``torch.distributed``.

Which ranks share a machine is decided explicitly, before any segment is made (:func:`channel_for`): every rank
sends the others its machine's identity, :func:`shared_memory_id`, and the channel is made only where all are
the same. ``BIGBATCH_HOST_ALL_REDUCE=off`` (:data:`SWITCH`) on any rank sends every sum of the group through
``torch.distributed`` instead, as it would go across machines.

Protocol, one segment per process group, made once by all its ranks together (:func:`channel_for`):

    flags[r]        int64 on its own cache line: the number of the last call whose input rank r has published
    slots[p, r, :]  float32, p = call number mod 2: rank r's input to that call

    call s on rank r:   slots[s % 2, r, :n] = x                       copy in
                        flags[r] = s                                   publish
                        wait until min over ranks of flags >= s        every input of call s is there
                        x = sum over ranks of slots[s % 2, :, :n]      the same order on every rank: same bits

Two slots are enough: rank r writes ``slots[s % 2]`` only after it has seen every flag >= s - 1, and a rank
publishes s - 1 only after it has finished reading call s - 2, the last call that used those slots. The
publish-then-read order needs stores to become visible in program order and loads not to pass earlier
loads, which x86-64 guarantees (total store order; the copies are a few kB, far below the size where
``memcpy`` switches to non-temporal stores). Other CPUs would need explicit fences, which Python cannot
issue, so there the channel is not used.

Segments in /dev/shm: rank 0 names a segment ``bigbatch-all-reduce-<its pid>-<random>`` and removes the name as
soon as every rank has mapped it, before :func:`channel_for` returns on any rank. A run killed in between (torchrun
stops the other workers with SIGTERM when one fails, and Python dies of SIGTERM without running ``finally``) leaves
the file behind, holding its memory until reboot; so before making a segment rank 0 removes those of earlier runs
whose creator is gone (:func:`_remove_stale_segments`), and nothing else.

A waiting rank polls the flags and yields its core (``os.sched_yield``) between polls, so it neither sleeps
(a core woken from idle is slow to come back) nor keeps a runnable thread from its core. A rank that waits
longer than ``timeout`` (torch's default process-group timeout) raises, as a Gloo collective would. Every rank
must make the same calls with the same sizes in the same order, as with any collective.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import secrets
import stat
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from bigbatch.floor.processes import process_exists

try:
    import fcntl
except ImportError:  # Windows, which has no /dev/shm either: the channel is never made there
    fcntl = None

__all__ = ["SWITCH", "HostAllReduce", "channel_for", "check_switch", "shared_memory_id", "use_torch_distributed"]

_SHM_DIR = "/dev/shm"
_CACHE_LINE = 64  # bytes: each rank's flag on its own line, so publishing does not disturb the others' polling
_HEADER = 64  # bytes: int64 0, a random token that proves every rank mapped the same segment; int64 1, _MAGIC
_MAGIC = b"bbAllRd\x01"  # at byte 8 of the header: "a segment of this module"
_PREFIX = "bigbatch-all-reduce-"
_NAME = re.compile(re.escape(_PREFIX) + r"(\d{1,10})-[0-9a-f]{16}")  # <prefix><creator pid>-<random>
_CAPACITY = 1 << 15  # float32 values per rank and slot (128 KiB): BatchNorm layers up to 16,383 channels
_TSO_MACHINES = {"x86_64", "amd64"}
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

SWITCH = "BIGBATCH_HOST_ALL_REDUCE"
"""The environment variable that chooses: ``auto`` (or unset, or ``1``): shared memory where every rank of the group is
on one machine; ``off`` (or ``0``): always ``torch.distributed`` (Gloo on the CPU), the path of processes on several
machines (to measure it, or to test it with several torchrun agents on one machine). Read by every rank; one rank's
``off`` is enough."""
_SWITCH_VALUES = {"": "auto", "auto": "auto", "1": "auto", "off": "off", "0": "off"}

# Weak keys: a channel must not keep its process group's object alive after the group is destroyed.
_CHANNELS: weakref.WeakKeyDictionary[object, HostAllReduce | None] = weakref.WeakKeyDictionary()


class HostAllReduce:
    """One process's end of a shared-memory sum over the ``world`` processes of a group (see module doc)."""

    def __init__(self, storage: torch.Tensor, rank: int, world: int, segment: str = "", capacity: int = _CAPACITY,
                 timeout: timedelta = dist.default_pg_timeout) -> None:
        """``storage``: the mapped segment as uint8, ``segment_bytes(world, capacity)`` long; ``segment``: its
        file name, for messages (the name is gone once :func:`channel_for` has returned)."""
        flags_end = _HEADER + world * _CACHE_LINE
        self.token = storage[:_HEADER].view(torch.int64)[:1]
        # one int64 per cache line: element r of this strided view is rank r's flag
        self._flags = storage[_HEADER:flags_end].view(torch.int64)[::_CACHE_LINE // 8]
        self._my_flag = self._flags[rank:rank + 1]
        self._slots = storage[flags_end:flags_end + 2 * world * capacity * 4].view(torch.float32).view(
            2, world, capacity)
        self.rank, self.world, self.capacity, self.segment = rank, world, capacity, segment
        self.timeout_s = timeout.total_seconds()
        self._calls = 0

    @staticmethod
    def segment_bytes(world: int, capacity: int = _CAPACITY) -> int:
        return _HEADER + world * _CACHE_LINE + 2 * world * capacity * 4

    def fits(self, tensor: torch.Tensor) -> bool:
        return (tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous()
                and tensor.numel() <= self.capacity)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Replace ``tensor`` by its sum over the group's processes (every rank gets the same bits)."""
        if not self.fits(tensor):
            raise ValueError(f"shared-memory all-reduce takes contiguous float32 CPU tensors of at most "
                             f"{self.capacity} values, got {tensor.dtype} {tuple(tensor.shape)} on {tensor.device}")
        self._calls += 1
        call, n = self._calls, tensor.numel()
        slots = self._slots[call % 2, :, :n]
        slots[self.rank].copy_(tensor.view(-1))
        self._my_flag.fill_(call)
        deadline = time.monotonic() + self.timeout_s
        polls = 0
        while int(self._flags.min()) < call:
            os.sched_yield()
            polls += 1
            if polls % 4096 == 0 and time.monotonic() > deadline:
                late = [r for r in range(self.world) if int(self._flags[r]) < call]
                raise RuntimeError(f"shared-memory all-reduce ({self.segment}): rank(s) {late} of {self.world} did "
                                   f"not reach call {call} within {self.timeout_s:g} s")
        torch.sum(slots, dim=0, out=tensor.view(-1))
        return tensor


def channel_for(group=None) -> HostAllReduce | None:
    """The shared-memory channel of ``group`` (default: the world), made on first use; None where it can't be.

    The first call is a collective: every rank of the group must make it at the same point (cross-device
    BatchNorm does, in its first training forward). The decision, the same on every rank: every rank sends the
    others the switch's value (:data:`SWITCH`) and its machine's :func:`shared_memory_id`; the channel is made only
    where no rank says ``off`` and every rank has the same identity (none without one: another CPU, no /dev/shm).
    Then rank 0 creates the segment in /dev/shm and sends its name; every rank maps it and checks the token rank 0
    wrote, which proves they share it; rank 0 removes the name once all have mapped it, and no rank returns before
    it has, so from then on the run leaves nothing behind in /dev/shm however it ends. If any rank cannot map it
    (a full /dev/shm), every rank gets None.
    """
    group = dist.group.WORLD if group is None else group
    if group not in _CHANNELS:
        _CHANNELS[group] = _open(group) if _on_one_machine(group) else None
    return _CHANNELS[group]


def use_torch_distributed(group) -> None:
    """Send ``group``'s sums through ``torch.distributed`` even where shared memory would do (for comparisons).

    Call it on every rank before the group's first sum."""
    _CHANNELS[group] = None


def check_switch() -> str:
    """The switch's value (:data:`SWITCH`): ``auto`` or ``off``; a ``ValueError`` naming it for any other."""
    value = os.environ.get(SWITCH, "").strip().lower()
    if value not in _SWITCH_VALUES:
        raise ValueError(f"{SWITCH}={os.environ[SWITCH]!r}: expected auto or off (1 or 0)")
    return _SWITCH_VALUES[value]


def shared_memory_id() -> str | None:
    """What two processes share exactly when they see the same /dev/shm: ``<boot id>:<device of /dev/shm>``; None
    where this module's channel cannot run (not x86-64, no /dev/shm or no file locks, no boot id).

    Why this identity, not another:

    - The kernel's boot id (``/proc/sys/kernel/random/boot_id``) is random at each boot and the same for every
      process on that kernel, containers included: equal ids mean one machine (one host, or one VM), different ids
      different machines, even machines cloned from one image.
    - The device number of the /dev/shm mount tells apart two tmpfs mounted there on one kernel (containers with a
      /dev/shm each, which cannot see each other's segments); two processes that see the same mount see the same
      files.
    - A host name is not enough: containers on one machine may share it without sharing /dev/shm, and machines
      may share one ("localhost" in containers). ``LOCAL_WORLD_SIZE == WORLD_SIZE`` is true for one torchrun agent
      only, and says nothing about memory: two agents on one machine (two launches, or two containers with the host's
      /dev/shm) share it and are better served by it.
    """
    if platform.machine().lower() not in _TSO_MACHINES or fcntl is None:
        return None
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
        shm = os.stat(_SHM_DIR)
    except OSError:
        return None
    if not boot or not stat.S_ISDIR(shm.st_mode):
        return None
    return f"{boot}:{shm.st_dev}"


def _on_one_machine(group) -> bool:
    """Whether the group's sums may go through shared memory: the decision of :func:`channel_for`, the same on every
    rank (all ranks exchange what decides it; a bad switch value on any rank is the same ``ValueError`` on every
    rank, so that none is left waiting)."""
    try:
        mine = (check_switch(), shared_memory_id())
    except ValueError as e:
        mine = (str(e), None)
    views: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(views, mine, group=group)
    wrong = sorted({switch for switch, _ in views if switch not in ("auto", "off")})
    if wrong:
        raise ValueError(wrong[0])
    ids = {machine for _, machine in views}
    return all(switch == "auto" for switch, _ in views) and len(ids) == 1 and None not in ids


def _open(group) -> HostAllReduce | None:
    """The channel over a group of one machine (:func:`_on_one_machine`), or None if its segment cannot be made or
    mapped by every rank."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    usable = os.path.isdir(_SHM_DIR)
    nbytes = HostAllReduce.segment_bytes(world)
    created = None
    if rank == 0 and usable:
        _remove_stale_segments()
        created = _create_segment(nbytes)
    try:
        channel = token = None
        if created is not None:
            token = secrets.randbits(62) + 1
            channel = _map(created.path, rank, world, nbytes)
            if channel is not None:
                channel.token.fill_(token)
        announced = [created.path if channel is not None else None, token]
        dist.broadcast_object_list(announced, src=dist.get_global_rank(group, 0), group=group)
        path, token = announced
        if rank != 0 and usable and path is not None and os.path.exists(path):
            channel = _map(path, rank, world, nbytes)
            if channel is not None and int(channel.token) != token:
                channel = None
        failures = torch.tensor([0 if channel is not None else 1])
        dist.all_reduce(failures, group=group)  # also: every rank has mapped the segment before its name goes
    finally:
        if created is not None:
            created.remove()
    # A second collective, so that no rank returns before rank 0 has removed the name: a run killed from here on
    # leaves nothing in /dev/shm. (Not on the way out of an error above: the other ranks may never come.)
    dist.all_reduce(torch.zeros(1), group=group)
    return channel if int(failures) == 0 else None


def _map(path: str, rank: int, world: int, nbytes: int) -> HostAllReduce | None:
    try:
        storage = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
    except RuntimeError:
        return None
    return HostAllReduce(storage, rank, world, path)


class _Segment:
    """A segment this process made: its name, and an open descriptor that holds the file's lock until
    :meth:`remove` (the kernel drops the lock when the process dies, however it dies)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd

    def remove(self) -> None:
        """Remove the name, then let go of the lock (in this order: a named segment of a live run is locked)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self.fd)


def _create_segment(nbytes: int) -> _Segment | None:
    """A new file of ``nbytes`` in /dev/shm, its pages reserved now (a full /dev/shm is an answer of None here,
    not a SIGBUS in the middle of training); None if it cannot be made.

    It is locked and marked (``_MAGIC`` in its header) before it is given any size, so that a file of this name
    that holds memory can always be told from any other file by :func:`_remove_stale_segments`. (Killed in the
    microseconds between creating and marking it, a process leaves an empty file: a name, no memory.)"""
    path = os.path.join(_SHM_DIR, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    segment = _Segment(path, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, _MAGIC, 8)
        os.posix_fallocate(fd, 0, nbytes)
    except OSError:
        segment.remove()
        return None
    return segment


def _remove_stale_segments() -> None:
    """Remove the segments that runs killed while making their channel left in /dev/shm (see the module doc).

    The project never deletes a file it did not make, so a file goes only when all of these prove it is a
    segment of this module whose run is over: its name is ``bigbatch-all-reduce-<pid>-<16 hex digits>``, it is a
    regular file of this user with ``_MAGIC`` in its header, no process ``<pid>`` exists, and no process holds
    its lock (its creator takes it before the file has any size and keeps it until the name is gone; the lock
    also answers for a creator in another PID namespace that shares /dev/shm). A reused pid only keeps a file
    until a later run.
    """
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None or process_exists(int(match[1])):
            continue
        path = os.path.join(_SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if (stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and os.pread(fd, 8, 8) == _MAGIC
                    and _lock_is_free(fd)):
                os.unlink(path)
        except OSError:  # gone meanwhile (another run's rank 0 removed it first), or unreadable: leave it
            pass
        finally:
            os.close(fd)


def _lock_is_free(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
