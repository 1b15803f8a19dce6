"""A torch file's zip entries are checked before ``torch.load`` reads them (``floor/files.py``,
``check_zip_entries``): a compressed entry, or entries declaring more bytes than the file holds, is one line naming
the file, and torch never reads it.

The oracles: ``torch.save`` itself (its default zip files, its legacy format, a run's own checkpoint) for what must
still load, tensor for tensor; Python's ``zipfile`` for what the archives hold and to build the hostile ones; and
``torch.load`` replaced by a function that fails the test, for "refused before torch reads it".
"""

from __future__ import annotations

import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest
import torch

from bigbatch.cli import main
from bigbatch.config import load_config
from bigbatch.errors import UserError
from bigbatch.floor import files
from bigbatch.floor.files import load_tensors

pytestmark = pytest.mark.fast

BOMB_BYTES = 64 * 2**20
"""The tensor the bomb expands to (DEFLATE packs its zeros about 1,000 to 1)."""


def repacked(source: Path, target: Path, compression: int) -> None:
    """``source``'s entries, in order, written again to ``target`` with ``compression``."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename), compress_type=compression, compresslevel=9)


@pytest.fixture
def torch_never_reads(monkeypatch):
    def must_not_load(*args, **kwargs):
        raise AssertionError("torch.load was called on a file the check should have refused")

    monkeypatch.setattr(torch, "load", must_not_load)


def test_eval_of_a_compressed_checkpoint_is_one_line_and_torch_never_inflates_it(tmp_path, capsys, torch_never_reads):
    state = {"step": 0, "model": {"weight": torch.zeros(BOMB_BYTES // 4)},
             "config": load_config("digits").model_dump(mode="json")}
    torch.save(state, tmp_path / "plain.pt")
    bomb = tmp_path / "bomb.pt"
    repacked(tmp_path / "plain.pt", bomb, zipfile.ZIP_DEFLATED)
    (tmp_path / "plain.pt").unlink()
    assert bomb.stat().st_size < BOMB_BYTES // 500
    with zipfile.ZipFile(bomb) as archive:
        assert sum(info.file_size for info in archive.infolist()) > BOMB_BYTES  # what it would expand to
    capsys.readouterr()
    assert main(["eval", str(bomb)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: checkpoint: {bomb} holds a compressed entry ("), err
    assert "DEFLATE" in err and "save it again with torch.save" in err


def test_a_compressed_data_pkl_alone_is_refused(tmp_path, torch_never_reads):
    torch.save({"w": torch.arange(3.0)}, tmp_path / "plain.pt")
    with zipfile.ZipFile(tmp_path / "plain.pt") as zin, zipfile.ZipFile(tmp_path / "one.pt", "w") as zout:
        for info in zin.infolist():
            packed = zipfile.ZIP_BZIP2 if info.filename.endswith("data.pkl") else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info.filename), compress_type=packed)
    with pytest.raises(UserError, match=r"holds a compressed entry \('plain/data.pkl', BZIP2\)"):
        load_tensors(tmp_path / "one.pt", "model.weights")


def test_what_torch_save_writes_still_loads(tmp_path):
    """Its default zip files (ZIP64 end records, 64-byte aligned entries; one of 3,000 tensors), the same entries
    stored again by ``zipfile`` (a plain end record), its legacy format, and each read with ``mmap``."""
    one = {"w": torch.arange(6.0).reshape(2, 3), "step": 4, "nested": {"b": torch.ones(2, dtype=torch.bfloat16)}}
    many = {f"p{i}": torch.full((3,), float(i)) for i in range(3000)}
    cases = {"one.pt": one, "many.pt": many}
    for name, state in cases.items():
        torch.save(state, tmp_path / name)
    repacked(tmp_path / "one.pt", tmp_path / "restored.pt", zipfile.ZIP_STORED)
    cases["restored.pt"] = one
    torch.save(one, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    cases["legacy.pt"] = one
    assert not zipfile.is_zipfile(tmp_path / "legacy.pt")
    for name, state in cases.items():
        for mmap in (False, True) if name != "legacy.pt" else (False,):
            loaded = load_tensors(tmp_path / name, "checkpoint", mmap=mmap)
            assert loaded.keys() == state.keys(), name
            flat = [(loaded[k], state[k]) for k in state if k != "nested"]
            flat += [(loaded["nested"]["b"], state["nested"]["b"])] if "nested" in state else []
            for got, want in flat:
                assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want, (name, mmap)


def test_a_runs_own_checkpoint_still_loads(tmp_path, capsys):
    from tests.helpers import TINY

    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=2", "checkpoint.every=2"]) == 0
    assert main(["eval", str(out)]) == 0, capsys.readouterr().err


def central_entries(path: Path) -> list[tuple[int, str]]:
    """(offset in the file, name) of each central directory header of ``path``, in order."""
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        names = [info.filename for info in archive.infolist()]
    found, at = [], data.find(b"PK\x01\x02")
    for name in names:
        found.append((at, name))
        name_len, extra_len, comment_len = struct.unpack_from("<3H", data, at + 28)
        at += 46 + name_len + extra_len + comment_len
    return found


def patched(source: Path, target: Path, entry: str, offset: int, value: int) -> None:
    """``source`` with the 32-bit field at ``offset`` of ``entry``'s central directory header set to ``value``."""
    data = bytearray(source.read_bytes())
    at = dict((name, where) for where, name in central_entries(source))[entry]
    struct.pack_into("<L", data, at + offset, value)
    target.write_bytes(bytes(data))


def test_stored_entries_that_claim_more_than_the_file_are_refused(tmp_path, torch_never_reads):
    source = tmp_path / "a.pt"
    torch.save({"a": torch.zeros(1000), "b": torch.ones(1000)}, source)
    repacked(source, tmp_path / "plain.pt", zipfile.ZIP_STORED)  # 32-bit sizes, no ZIP64 extra fields
    plain = tmp_path / "plain.pt"
    with zipfile.ZipFile(plain) as archive:
        first, second = (info for info in archive.infolist() if "/data/" in info.filename)
    # Both sizes of an entry raised to 400 MB: a stored entry that would be read past the end of the file.
    grown = tmp_path / "grown.pt"
    patched(plain, grown, first.filename, 20, 400_000_000)
    patched(grown, grown, first.filename, 24, 400_000_000)
    not_torchs = r"is not a readable torch file \(a zip file torch.save did not write: "
    with pytest.raises(UserError, match=rf"grown.pt {not_torchs}its entry 'a/data/0' declares 400,000,000 bytes"):
        load_tensors(grown, "checkpoint")
    # The second tensor's entry pointed at the first's bytes: two entries sharing one stretch of the file.
    shared = tmp_path / "shared.pt"
    patched(plain, shared, second.filename, 42, first.header_offset)
    with pytest.raises(UserError, match=r"its entry 'a/data/1' begins at byte [\d,]+, inside the entry listed before"):
        load_tensors(shared, "checkpoint")
    # No end record at all (cut short): one line, torch never asked.
    cut = tmp_path / "cut.pt"
    cut.write_bytes(plain.read_bytes()[:-30])
    with pytest.raises(UserError, match=rf"cut.pt {not_torchs}it has no end of central directory record\)$"):
        load_tensors(cut, "checkpoint")


def test_the_central_directory_is_read_in_bounded_memory(tmp_path):
    """30,000 entries (made by zipfile): the check's own allocations stay under 1 MiB, where
    zipfile's reader holds every entry (over 10 MiB)."""
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x/data.pkl", b"")
        for i in range(30_000):
            archive.writestr(f"x/data/{i}", b"")
    tracemalloc.start()
    try:
        files.check_zip_entries(path, "checkpoint")
        _, ours = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with zipfile.ZipFile(path) as archive:
            assert len(archive.infolist()) == 30_001
        _, theirs = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ours < 2**20 < 10 * 2**20 < theirs, (ours, theirs)


def test_zip64_extra_fields_give_the_sizes_zipfile_reads(tmp_path):
    """The sizes and offset of an entry past 4 GiB come from its ZIP64 extra field, in the order zipfile reads them
    (``zipfile._decodeExtra``): each present only where its 32-bit field is 0xFFFFFFFF."""
    big, offset = 5 * 2**32 + 7, 6 * 2**32 + 9
    extra = struct.pack("<2H3Q", 1, 24, big, big, offset)
    assert files._zip64_sizes(extra, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF) == (big, big, offset)
    only_offset = struct.pack("<2HQ", 1, 8, offset)
    assert files._zip64_sizes(b"\x0a\x00\x00\x00" + only_offset, 12, 12, 0xFFFFFFFF) == (12, 12, offset)
    assert files._zip64_sizes(b"", 5, 5, 100) == (5, 5, 100)


def test_each_write_has_a_temporary_name_of_its_own_and_never_meets_a_leftover(tmp_path, monkeypatch):
    """A process killed mid-write leaves ``.NAME.tmp-PID-TOKEN``; the next process may have the same PID (in a
    container, PID 1): its write draws another name and goes through, the leftover untouched (the temporary name was
    PID alone, and the write stopped: "... is in the way of the write and is not bigbatch's")."""
    import os
    import re

    path = tmp_path / "last.pt"
    leftovers = [tmp_path / f".last.pt.tmp-{os.getpid()}", tmp_path / f".last.pt.tmp-{os.getpid()}-0123456789abcdef"]
    for left in leftovers:
        left.write_bytes(b"left by a killed write")
    names = []
    real_open = os.open

    def seen(name, *args, **kwargs):
        names.append(Path(name).name)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", seen)
    files.atomic_write(path, lambda f: f.write(b"one"))
    files.atomic_write(path, lambda f: f.write(b"two"))
    monkeypatch.undo()
    made = [name for name in names if name.startswith(".last.pt.tmp-")]
    assert len(made) == 2 and made[0] != made[1]
    assert all(re.fullmatch(rf"\.last\.pt\.tmp-{os.getpid()}-[0-9a-f]{{16}}", name) for name in made)
    assert all(files.temporary_target(name) == "last.pt" for name in made)
    assert path.read_bytes() == b"two"
    assert all(left.read_bytes() == b"left by a killed write" for left in leftovers)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", *(left.name for left in leftovers)])


def test_a_temporary_name_taken_is_left_alone_and_another_drawn(tmp_path, monkeypatch):
    import os
    import secrets

    path = tmp_path / "best.pt"
    tokens = iter(["0123456789abcdef", "00000000000000ff"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(tokens))
    taken = tmp_path / f".best.pt.tmp-{os.getpid()}-0123456789abcdef"
    taken.write_text("someone's")
    files.atomic_write(path, lambda f: f.write(b"written"))
    assert path.read_bytes() == b"written" and taken.read_text() == "someone's"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["best.pt", taken.name])


def test_a_full_disk_during_a_write_is_one_line_naming_the_file_and_the_old_file_is_kept(tmp_path, capsys,
                                                                                        monkeypatch):
    """A write on a descriptor fails naming no file (``OSError: [Errno 28] No space left on device``): atomic_write
    names the file it was writing, and the CLI ends in one line (exit 1), not a traceback; the temporary is gone and
    the file it was to replace is as it was. (A checkpoint's own message, with the resume command, is state.py's.)"""
    import errno
    import os

    csv = tmp_path / "lr.csv"
    assert main(["schedule", "digits", "--csv", str(csv), "--lines", "2"]) == 0
    before = csv.read_bytes()
    capsys.readouterr()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    assert main(["schedule", "digits", "--csv", str(csv), "--lines", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {csv}: No space left on device"]
    assert csv.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["lr.csv"]


def test_a_full_disk_while_a_run_appends_its_metrics_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """``metrics.jsonl`` is appended to, not written atomically: a full disk there names the file too (``naming``),
    and the run ends in one line, exit 1, not a traceback naming none."""
    import builtins
    import errno
    import os

    from bigbatch.engine.hooks import jsonl
    from tests.helpers import TINY, run_main

    class FillsUp:
        """The metrics file, whose third line meets a full disk (a write on a descriptor: no file named)."""

        def __init__(self, *args, **kwargs):
            self.file, self.lines = builtins.open(*args, **kwargs), 0
            self.name = self.file.name

        def write(self, text: str) -> int:
            self.lines += 1
            if self.lines > 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.file.write(text)

        def __getattr__(self, name: str):
            return getattr(self.file, name)

    monkeypatch.setattr(jsonl, "open", FillsUp, raising=False)
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", *TINY, "steps=3")
    assert result.returncode == 1
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert result.stderr.strip().splitlines()[-1] == f"error: {metrics}: No space left on device"
