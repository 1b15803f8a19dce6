"""Checkpoints are written atomically and read back without running code."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.engine import checkpoint
from bigbatch.errors import UserError
from bigbatch.floor import files
from tests.helpers import HANG_GUARD_S, TINY


def save(obj, path) -> None:
    """``torch.save`` of ``obj`` to ``path`` through ``atomic_write``, as a checkpoint is written."""
    files.atomic_write(path, lambda f: torch.save(obj, f))


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save({"model": {"w": torch.ones(3)}, "step": 1}, path)

    real_save = torch.save

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial bytes of a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        save({"model": {"w": torch.zeros(3)}, "step": 2}, path)
    monkeypatch.setattr(torch, "save", real_save)

    state = checkpoint.load(path)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"], "the temporary file must be cleaned up"


def test_a_second_name_at_the_same_step_is_a_link_and_each_name_is_replaced_alone(tmp_path):
    best, last = tmp_path / "best.pt", tmp_path / "last.pt"
    save({"step": 1}, best)
    save({"step": 0}, last)  # an older last.pt: replaced by the link
    assert files.atomic_link(best, last, files.identity(best))
    assert os.path.samefile(best, last) and checkpoint.load(last, ("step",))["step"] == 1
    save({"step": 2}, last)  # the next checkpoint: best.pt keeps its step
    assert checkpoint.load(best, ("step",))["step"] == 1 and checkpoint.load(last, ("step",))["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_no_link_to_a_file_put_in_place_of_the_one_written(tmp_path):
    """``atomic_link`` links only the file this process wrote: one put in its place since (another size, inode or
    time) is refused, and ``last.pt`` stays as it was (the caller then writes it)."""
    best, last = tmp_path / "best.pt", tmp_path / "last.pt"
    save({"step": 1}, best)
    written = files.identity(best)
    (tmp_path / "theirs").write_bytes(b"a file that is not the one written")
    os.replace(tmp_path / "theirs", best)
    last.write_bytes(b"the previous last.pt")
    assert not files.atomic_link(best, last, written)
    assert last.read_bytes() == b"the previous last.pt"
    best.unlink()
    assert not files.atomic_link(best, last, written)  # gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_the_background_writer_keeps_the_order_and_hands_over_the_first_error():
    """Writes run one at a time in the order given; a failed one is raised by the next ``submit`` or by ``wait``,
    and the writes queued behind it are skipped (a last.pt linked to a best.pt that failed would be wrong)."""
    writer, done = checkpoint.BackgroundWriter(pending=1), []
    release = threading.Event()

    def slow(tag):
        def job():
            release.wait(HANG_GUARD_S)
            done.append(tag)
        return job

    writer.submit(slow("a"))
    release.set()
    writer.submit(slow("b"))
    writer.wait()
    assert done == ["a", "b"]

    queued = threading.Event()

    def fails():
        queued.wait(HANG_GUARD_S)  # fails only once the next job is queued behind it (else submit would raise)
        raise OSError("disk full")

    writer.submit(fails)
    writer.submit(lambda: done.append("after the failure"))  # queued behind the failing write
    queued.set()
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    assert "after the failure" not in done
    writer.submit(lambda: done.append("c"))  # the error was handed over: the writer goes on
    writer.wait()
    assert done[-1] == "c"


def disk_full_after(monkeypatch, written: int) -> list[str]:
    """``atomic_write`` of a ``.pt`` file, after ``written`` of them went through, fills its temporary file halfway
    and fails as a full disk does (``OSError`` ENOSPC, no file name: ``f.write`` on a descriptor); the names it was
    asked to write, in order."""
    real_write, names = files.atomic_write, []

    def disk_full(path, write, mode="wb", record=False):
        if str(path).endswith(".pt"):
            names.append(Path(path).name)
            if len(names) > written:
                def half(f):
                    f.write(b"PK\x03\x04 the first bytes of a checkpoint")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real_write(path, half, mode, record)
        return real_write(path, write, mode, record)

    monkeypatch.setattr(files, "atomic_write", disk_full)
    return names


def test_a_checkpoint_write_that_fails_in_the_background_fails_the_run(tmp_path, monkeypatch, capsys):
    from bigbatch.cli import main

    out = tmp_path / "run"
    disk_full_after(monkeypatch, 0)
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=2"]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: checkpoint: cannot write {out / 'checkpoints' / 'best.pt'}: No space left on device; "
                   f"no checkpoint had been written yet, so nothing is kept: the same command starts the run again\n"
                   ), err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == []


def test_a_full_disk_while_checkpointing_is_one_line_naming_the_file_the_checkpoint_kept_and_the_resume(
        tmp_path, monkeypatch, capsys):
    """The disk fills up while ``best.pt`` is written at step 4, after ``last.pt`` of step 2: ``train`` ended in a
    40-line traceback of the writer thread's ``OSError: [Errno 28] No space left on device``, naming no file. Now one
    line (exit 1, as the other failures during training): the file, why, the checkpoint kept and the command that
    resumes from it; that checkpoint loads, no temporary file is left, and the command resumes the run."""
    from bigbatch.cli import main

    out = tmp_path / "run"
    names = disk_full_after(monkeypatch, 1)
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=4", "checkpoint.every=2"]) == 1
    assert names[:2] == ["last.pt", "best.pt"]
    err = capsys.readouterr().err
    last = out / "checkpoints" / "last.pt"
    assert err == (f"error: checkpoint: cannot write {out / 'checkpoints' / 'best.pt'}: No space left on device; "
                   f"kept: {last} at step 2, intact; resume with: bigbatch train --resume {out}\n"), err
    assert checkpoint.load(last, checkpoint.RESUME_KEYS)["step"] == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last.pt"], "the temporary file is removed"
    monkeypatch.undo()  # space again
    assert main(["train", "--resume", str(out)]) == 0
    assert checkpoint.load(last, checkpoint.RESUME_KEYS)["step"] == 4


WRITER = textwrap.dedent(
    """
    import sys, torch
    from bigbatch.floor.files import atomic_write
    path = sys.argv[1]
    step = 0
    while True:
        step += 1
        state = {"model": {"w": torch.full((2_000_000,), float(step))}, "step": step}
        atomic_write(path, lambda f: torch.save(state, f))
        print(step, flush=True)
    """
)


def test_sigkill_during_writes_never_leaves_a_partial_checkpoint(tmp_path):
    """Kill a real process at random moments while it rewrites a 8 MB checkpoint in a loop."""
    path = tmp_path / "last.pt"
    rng = random.Random(0)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # at least one checkpoint is complete
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = checkpoint.load(path)
        w = state["model"]["w"]
        assert torch.all(w == state["step"]), "weights and step from different writes"


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    save({"model": {}, "rng": checkpoint.rng_state()}, tmp_path / "c.pt")
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(9)
    random.seed(9)
    np.random.seed(9)
    checkpoint.restore_rng_state(checkpoint.load(tmp_path / "c.pt")["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_loading_refuses_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": Evil()}, path)
    with pytest.raises(UserError, match="holds Python objects other than tensors") as caught:
        checkpoint.load(path)
    assert "\n" not in str(caught.value) and "weights_only" not in str(caught.value)


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "cut.pt"
    save({"model": {"w": torch.ones(1000)}}, path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match=f"checkpoint: {path}"):
        checkpoint.load(path)


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_nan_evaluation_is_never_the_best_and_a_nan_best_gives_way(mode):
    """A diverged model's first evaluation (a NaN loss or mAP) became the best, and no later number could beat it:
    every comparison with NaN is false, so ``best.pt`` stayed at that step for the whole run."""
    from bigbatch.engine.state import Best

    best = Best("metric", mode)
    assert not best.improves(float("nan"))
    assert best.improves(3.0)
    best.value = 3.0
    assert not best.improves(float("nan"))
    assert best.improves(4.0 if mode == "max" else 2.0) and not best.improves(2.0 if mode == "max" else 4.0)
    best.value = float("nan")  # as an older checkpoint may hold it
    assert best.improves(-1e9) and best.improves(1e9)


def test_ctrl_c_after_a_checkpoint_write_that_failed_names_the_one_kept(tmp_path, monkeypatch, capsys):
    """Ctrl-C right after ``last.pt`` of step 4 was saved, its write failing in the background (a full disk): the
    write's error is a warning and the interrupt message names what is on the disk, ``last.pt`` of step 2, not the
    step 4 that was only submitted."""
    from bigbatch.cli import main
    from bigbatch.engine.hooks import Hook
    from bigbatch.registry import HOOKS

    class CtrlCAfter4(Hook):
        stage = "write"  # after the checkpoint hook

        def after_step(self, run):
            if run.progress.step == 4:
                raise KeyboardInterrupt

    out = tmp_path / "run"
    disk_full_after(monkeypatch, 1)  # last.pt of step 2 written; step 4's fails
    HOOKS.register("toy_interrupt", lambda run: CtrlCAfter4())
    try:
        assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=6", "checkpoint.every=2",
                     "eval.every=100"]) == 130
    finally:
        HOOKS.unregister("toy_interrupt")
    err = capsys.readouterr().err
    last = out / "checkpoints" / "last.pt"
    assert f"warning: a checkpoint write failed: checkpoint: cannot write {last}" in err, err
    assert f"interrupted after step 4 of 6; kept: {last} at step 2 (" in err, err
    assert torch.load(last, weights_only=True)["step"] == 2
