"""A fuzz test (hypothesis) of the Darknet ``.weights`` reader, ``read_weights``: random bytes and mutations of a
real file (written by ``write_weights``) either load cleanly or stop with one ``UserError`` line, never another
exception; memory stays bounded whatever the file says; the network is untouched by a refused file.

The oracle is the format written out independently of the reader (``load_weights_upto`` in AlexeyAB's
src/parser.c, the default dialect): three int32 ``major, minor, revision``; a uint64 ``seen`` when
``(major * 10 + minor) >= 2`` (in C ints, which wrap at 32 bits), else a ``uint32_t``; then exactly the network's
float32 values. (pjreddie's rule, ``&& major < 1000 && minor < 1000`` and an ``int`` stored into a ``size_t``, is
checked by ``read_weights(..., dialect="pjreddie")`` on the same files.) A file of that size must load, bit for bit,
with that ``seen``; a file of any other size must be refused.

What the fuzz found (fixed in ``bigbatch/darknet/weights.py``): a 32-bit ``seen`` that is negative (an old
header followed by ``00 00 00 80``) was returned negative, and ``bigbatch export --darknet-weights`` then stopped
with a ``ValueError`` traceback from ``write_weights``. What reading the reader found besides, tested here too: a
FIFO given to ``read_weights`` blocked forever in ``open``, a folder raised ``IsADirectoryError``, a NUL in the path
``ValueError``, and a file that shrank between its size check and its read would have ended in a ``RuntimeError``
from torch's ``view`` (now one line: the file changed while it was read).
"""

from __future__ import annotations

import os
import random
import re
import struct
import threading
import tracemalloc
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigbatch.darknet import DarknetNetwork, read_darknet_cfg, read_weights, write_weights
from bigbatch.darknet.weights import weight_tensors
from bigbatch.errors import UserError
from tests.helpers import SMALL, run_main

# Two convolutions (one with batch norm, one with a bias): 3 * 4 + 3 * 2 * 3 * 3 + 2 + 2 * 3 = 74 float32 values
SMALL_CFG = SMALL  # the .weights layout tests' two-convolution network
VALUES = 3 * 4 + 3 * 2 * 3 * 3 + 2 + 2 * 3

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def c_int(value: int) -> int:
    """A C int's value after ``value`` is computed in it (32-bit two's complement)."""
    return struct.unpack("<i", struct.pack("<I", value & 0xFFFFFFFF))[0]


def expected_load(raw: bytes, dialect: str = "alexeyab") -> tuple[int, bytes] | None:
    """Darknet's reading of ``raw`` for the small network: (seen, the values' bytes), or None if its size is wrong."""
    if len(raw) < 12:
        return None
    major, minor = struct.unpack_from("<ii", raw)
    wide = c_int(c_int(major * 10) + minor) >= 2
    if dialect == "pjreddie":
        wide = wide and major < 1000 and minor < 1000
    body = 20 if wide else 16
    if len(raw) != body + 4 * VALUES:
        return None
    if wide:
        seen = struct.unpack_from("<Q", raw, 12)[0]
    elif dialect == "pjreddie":
        seen = struct.unpack_from("<i", raw, 12)[0] % 2**64  # an int stored into a size_t
    else:
        seen = struct.unpack_from("<I", raw, 12)[0]  # a uint32_t
    return seen, raw[body:]


def network_bytes(network: DarknetNetwork) -> bytes:
    return b"".join(t.detach().contiguous().numpy().astype("<f4").tobytes() for t in weight_tensors(network))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, DarknetNetwork, bytes]:
    """(a scratch folder, the small network, a real .weights file of it written by write_weights)."""
    folder = tmp_path_factory.mktemp("fuzz_weights")
    cfg = folder / "small.cfg"
    cfg.write_text(SMALL_CFG)
    torch.manual_seed(0)
    network = DarknetNetwork(read_darknet_cfg(cfg))
    with torch.no_grad():  # non-trivial running statistics too, so that every value in the file is distinct
        for t in weight_tensors(network):
            t.copy_(torch.randn(t.shape))
    write_weights(network, folder / "good.weights", seen=123_456_789)
    good = (folder / "good.weights").read_bytes()
    assert len(good) == 20 + 4 * VALUES == 316
    return folder, network, good


def check(network: DarknetNetwork, path: Path, raw: bytes) -> None:
    """Load ``raw`` (written at ``path``) under each fork's header rule: exactly what that Darknet would load, or one
    UserError and nothing changed."""
    path.write_bytes(raw)
    for dialect in ("alexeyab", "pjreddie"):
        before = network_bytes(network)
        expected = expected_load(raw, dialect)
        try:
            seen = read_weights(network, path, dialect=dialect)
        except UserError as error:
            message = str(error)
            assert message and "\n" not in message, message
            assert message.startswith(f"{path}: "), message
            assert expected is None, f"a well-sized file was refused ({dialect}): {message}"
            assert network_bytes(network) == before, "a refused file changed the network"
            continue
        assert expected is not None, f"a file of {len(raw)} bytes was loaded ({dialect})"
        # bit for bit: NaN and infinity are loaded as Darknet loads them
        assert (seen, network_bytes(network)) == expected, dialect


# ----------------------------------------------------------------------------- mutations of a real file

INT32 = st.integers(-2**31, 2**31 - 1) | st.sampled_from([0, 1, 2, 5, 999, 1000, 1001, -1, -2**31, 2**31 - 1])


def _set(raw: bytearray, offset: int, fmt: str, value: int) -> bytearray:
    if len(raw) >= offset + struct.calcsize(fmt):
        struct.pack_into(fmt, raw, offset, value)
    return raw


MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 400)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("delete"), st.integers(0, 400), st.integers(1, 40)),
    st.tuples(st.just("insert"), st.integers(0, 400), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("major"), INT32),
    st.tuples(st.just("minor"), INT32),
    st.tuples(st.just("revision"), INT32),
    st.tuples(st.just("seen"), st.integers(0, 2**64 - 1)),
    # the 16-byte header of an old file: a version with a 32-bit seen, and that seen (any int32, negative too)
    st.tuples(st.just("old header"), st.sampled_from([(0, 0), (0, 1), (1000, 5), (5, 1000), (-1, 3), (-3, 1)]),
              INT32),
)


def mutate(raw: bytes, mutations: list[tuple]) -> bytes:
    out = bytearray(raw)
    for kind, *args in mutations:
        if kind == "flip" and out:
            out[args[0] % len(out)] ^= args[1]
        elif kind == "truncate":
            del out[args[0]:]
        elif kind == "extend":
            out += args[0]
        elif kind == "delete":
            del out[args[0]:args[0] + args[1]]
        elif kind == "insert":
            out[args[0]:args[0]] = args[1]
        elif kind in ("major", "minor", "revision"):
            _set(out, 4 * ("major", "minor", "revision").index(kind), "<i", args[0])
        elif kind == "seen":
            _set(out, 12, "<Q", args[0])
        elif kind == "old header" and len(out) >= 20:
            (major, minor), seen = args
            out[:20] = struct.pack("<iiii", major, minor, 5, seen)
    return bytes(out)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzz_mutated_weights_load_as_darknet_would_or_give_one_line(small, mutations):
    folder, network, good = small
    check(network, folder / "mutated.weights", mutate(good, mutations))


@FUZZ
@given(raw=st.binary(max_size=400)
       # random files of the right size for either header, so that some load: every header value is legal
       | st.binary(min_size=20 + 4 * VALUES, max_size=20 + 4 * VALUES)
       | st.builds(lambda major, minor, seen, body: struct.pack("<iii", major, minor, 0) + seen + body,
                   INT32, INT32, st.binary(min_size=4, max_size=8), st.binary(min_size=4 * VALUES,
                                                                              max_size=4 * VALUES)))
def test_fuzz_random_weights_load_as_darknet_would_or_give_one_line(small, raw):
    folder, network, _ = small
    check(network, folder / "random.weights", raw)


def test_the_oracle_reads_the_real_file_and_both_headers(small):
    """The property's own checks: the real file loads with its seen; an old (16-byte) header and a negative 32-bit
    seen load as Darknet reads them; a file 4 bytes short or long is refused."""
    folder, network, good = small
    check(network, folder / "good-again.weights", good)
    assert read_weights(network, folder / "good-again.weights") == 123_456_789
    old = struct.pack("<iiii", 0, 1, 0, -5) + good[20:]
    check(network, folder / "old.weights", old)
    assert read_weights(network, folder / "old.weights") == 2**32 - 5  # AlexeyAB's uint32_t
    assert read_weights(network, folder / "old.weights", dialect="pjreddie") == 2**64 - 5  # an int into a size_t
    for raw in (good[:-4], good + b"\0" * 4, good[:12]):
        with pytest.raises(UserError, match="but the network of .* takes 316 "):
            read_weights(network, folder / "bad.weights") if (folder / "bad.weights").write_bytes(raw) else None


def test_a_version_past_1000_has_a_64_bit_seen_in_alexeyabs_rule_and_a_32_bit_one_in_pjreddies(small):
    """AlexeyAB's load_weights_upto reads ``seen`` as 64 bits whenever ``major * 10 + minor >= 2``; pjreddie's only
    with ``major < 1000 && minor < 1000`` too. Version 0.1000 with each header: each fork loads its own."""
    folder, network, good = small
    wide = struct.pack("<iiiQ", 0, 1000, 0, 2**40 + 7) + good[20:]
    narrow = struct.pack("<iiii", 0, 1000, 0, -2) + good[20:]
    (folder / "wide.weights").write_bytes(wide)
    (folder / "narrow.weights").write_bytes(narrow)
    assert read_weights(network, folder / "wide.weights") == 2**40 + 7
    assert read_weights(network, folder / "narrow.weights", dialect="pjreddie") == 2**64 - 2
    with pytest.raises(UserError, match="316 "):
        read_weights(network, folder / "wide.weights", dialect="pjreddie")
    with pytest.raises(UserError, match="316 "):
        read_weights(network, folder / "narrow.weights")
    with pytest.raises(ValueError, match="dialect"):
        read_weights(network, folder / "wide.weights", dialect="darknet")


# ----------------------------------------------------------------------------- bounded memory, files that are not files


def test_a_huge_file_is_refused_by_its_size_without_reading_it(small):
    """A (sparse) file of 64 GiB behind a valid header: refused from its size, with under 1 MiB allocated."""
    folder, network, good = small
    huge = folder / "huge.weights"
    with open(huge, "wb") as f:
        f.write(good[:20])
        f.truncate(64 * 2**30)
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=r"68,719,476,736 bytes, but the network of .* takes 316 "):
            read_weights(network, huge)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        huge.unlink()
    assert peak < 2**20, peak


def test_what_is_not_a_regular_file_is_one_line_and_never_blocks(small):
    """A FIFO (which an open() would wait on forever), a folder, a device, a missing file and a NUL in the name."""
    folder, network, _ = small
    fifo = folder / "fifo.weights"
    os.mkfifo(fifo)
    outcome: list[BaseException | int] = []
    reader = threading.Thread(target=lambda: outcome.append(_outcome(network, fifo)), daemon=True)
    reader.start()
    reader.join(300)  # a hang guard: the read must not wait for a writer
    if reader.is_alive():  # release it, so that the test fails instead of hanging
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(60)
        pytest.fail("read_weights blocked on a FIFO")
    assert isinstance(outcome[0], UserError) and "not a regular file" in str(outcome[0])
    for path, expected in ((folder, "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                           (folder / "missing.weights", "cannot read: No such file or directory"),
                           (Path("a\0b.weights"), "not a valid file name")):
        with pytest.raises(UserError, match=expected) as error:
            read_weights(network, path)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("change", [-4, 4])
def test_a_file_that_changes_size_while_it_is_read_is_one_line(small, monkeypatch, change):
    """The size is checked first, then the file read: one that shrank or grew in between (its stat says 316 bytes,
    it holds 316 + change) is one line, not torch's RuntimeError."""
    folder, network, good = small
    path = folder / "changing.weights"
    path.write_bytes(good[:change] if change < 0 else good + bytes(change))
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        fields = list(real_fstat(fd))
        fields[6] = len(good)  # st_size
        return os.stat_result(fields)

    before = network_bytes(network)
    monkeypatch.setattr(os, "fstat", fstat)
    with pytest.raises(UserError, match="changed while it was read") as error:
        read_weights(network, path)
    monkeypatch.undo()
    assert "\n" not in str(error.value) and network_bytes(network) == before


def _outcome(network: DarknetNetwork, path: Path) -> BaseException | int:
    try:
        return read_weights(network, path)
    except BaseException as e:  # noqa: BLE001 - handed to the test's thread
        return e


# ----------------------------------------------------------------------------- through the CLI


@pytest.mark.parametrize("kind", ["truncated", "random", "header only", "empty"])
def test_export_of_a_bad_weights_file_is_one_error_line_and_writes_nothing(small, tmp_path, kind):
    folder, _, good = small
    bad = tmp_path / "bad.weights"
    bad.write_bytes({"truncated": good[:-7], "random": random.Random(0).randbytes(1000), "header only": good[:20],
                     "empty": b""}[kind])
    out = tmp_path / "out.pt"
    result = run_main("export", str(folder / "small.cfg"), "--weights", str(bad), "--checkpoint", str(out))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert re.fullmatch(rf"error: {re.escape(str(bad))}: [\d,]+ bytes, but the network of .* takes 31[26] .*\n",
                        result.stderr), result.stderr
    assert "Traceback" not in result.stderr and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.weights"]


def test_export_converts_an_old_file_with_a_negative_seen_as_darknet_reads_it(small, tmp_path):
    """Found by the fuzz: a 32-bit ``seen`` of -5 was returned as -5 and export's write_weights raised ValueError.
    Export reads as AlexeyAB's Darknet: the 32 bits are a uint32_t, 2**32 - 5."""
    folder, _, good = small
    old = tmp_path / "old.weights"
    old.write_bytes(struct.pack("<iiii", 0, 1, 0, -5) + good[20:])
    out = tmp_path / "out.weights"
    result = run_main("export", str(folder / "small.cfg"), "--weights", str(old), "--darknet-weights", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == struct.pack("<iiiQ", 0, 2, 5, 2**32 - 5) + good[20:]
