"""Nothing lost, nothing confusing (issue 11): a bad ``--out``, a run directory held by another process, absurd
values, checkpoints with missing parts, files left by a kill, and what the non-finite stop says. Each mistake is
one ``error:`` line and exit code 2, found before any work; nothing of the user's is deleted or overwritten.

The CLI runs in this process (``bigbatch.cli.main``) wherever it stops before training, so these tests are fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bigbatch.cli import main
from bigbatch.engine import checkpoint
from bigbatch.engine.run_dir import LOCK_NAME, hold_run_dir
from tests.helpers import HANG_GUARD_S, HOLDER, TINY


def one_error(capsys: pytest.CaptureFixture, prefix: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {prefix}"), err
    return err


def dead_pid() -> int:
    """The PID of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


# --- 2. a bad --out is one line, before any work ------------------------------------------------------------------


def bad_outs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("the user's")
    return {
        "an existing regular file": (a_file, f"{a_file} is a file, not a folder"),
        "a path under a file": (a_file / "run", f"cannot make {a_file / 'run'}: {a_file} is a file"),
        "a name too long": (tmp_path / ("x" * 300), "File name too long"),
        "a place under /proc": (Path("/proc/bigbatch-no-such-run"), "cannot make /proc/bigbatch-no-such-run"),
        "a read-only folder (/proc/self)": (Path("/proc/self"), "/proc/self is not a bigbatch run directory and holds"),
    }


@pytest.mark.parametrize("case", ["an existing regular file", "a path under a file", "a name too long",
                                  "a place under /proc", "a read-only folder (/proc/self)"])
def test_a_bad_out_is_one_error_line_before_any_work(case, tmp_path, capsys, no_training):
    out, expected = bad_outs(tmp_path)[case]
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=1"]) == 2
    err = one_error(capsys, "--out: ")
    assert expected in err
    assert (tmp_path / "a-file").read_text() == "the user's"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder without write permission")
def test_a_folder_without_write_permission_is_one_error_line(tmp_path, capsys, no_training):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["train", "digits", "--out", str(locked), "--set", *TINY]) == 2
    assert "Permission denied" in one_error(capsys, f"--out: cannot write in {locked}")


def test_a_users_folder_holding_a_file_the_run_would_write_is_refused(tmp_path, capsys, no_training):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "config.yaml").write_text("the user's own config\n")
    assert main(["train", "digits", "--out", str(users), "--set", *TINY]) == 2
    assert "would overwrite" in one_error(capsys, f"--out: {users} is not a bigbatch run directory")
    assert (users / "config.yaml").read_text() == "the user's own config\n"
    assert sorted(p.name for p in users.iterdir()) == ["config.yaml"]


def test_a_users_folder_holding_any_file_is_refused_naming_one(tmp_path, capsys, no_training):
    """``--out`` must be new, empty or a bigbatch run (docs/usage.md): a folder of the user's photos is refused, naming
    one of its files, and left as it was; an empty one is taken."""
    users = tmp_path / "photos"
    users.mkdir()
    for name in ("b.jpg", "a.jpg", "notes.txt"):
        (users / name).write_bytes(b"the user's")
    assert main(["train", "digits", "--out", str(users), "--set", *TINY]) == 2
    one_error(capsys, f"--out: {users} is not a bigbatch run directory and holds {users / 'a.jpg'} and 2 more")
    assert sorted(p.name for p in users.iterdir()) == ["a.jpg", "b.jpg", "notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AssertionError, match="training started"):  # an empty folder passes the checks
        main(["train", "digits", "--out", str(empty), "--set", *TINY, "steps=1"])


def test_another_tools_run_folder_is_not_taken_for_a_bigbatch_run(tmp_path, capsys, no_training):
    """config.yaml beside checkpoints/ and metrics.jsonl is what many tools leave: only a config.yaml that reads
    as a bigbatch config makes a folder a bigbatch run."""
    other = tmp_path / "other-tool"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.yaml").write_text("lr: 3\nmy_project: true\n")
    (other / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    assert main(["train", "digits", "--out", str(other), "--set", *TINY]) == 2
    one_error(capsys, f"--out: {other} is not a bigbatch run directory")
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path, capsys, no_training):
    important = tmp_path / "important.txt"
    important.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(important)
    assert main(["train", "digits", "--out", str(run), "--set", *TINY]) == 2
    one_error(capsys, f"--out: {run / LOCK_NAME} is a symbolic link")
    assert important.read_text() == "precious"


def test_a_run_that_stops_before_writing_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "subdivisions=3"]) == 2  # 32 % 3 != 0
    one_error(capsys, "batch: ")
    assert not out.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("the user's")
    assert main(["train", "shapes-detect", "--out", str(out), "--set", f"data.path={a_file}"]) == 2
    one_error(capsys, f"data.path: {a_file} is a file, not the folder of a shapes set")  # before any work
    assert not out.exists()
    assert a_file.read_text() == "the user's"
    nested = tmp_path / "new" / "deeper" / "run"  # every folder it made goes again
    assert main(["train", "shapes-detect", "--out", str(nested), "--set", f"data.path={a_file}"]) == 2
    capsys.readouterr()
    assert not (tmp_path / "new").exists()
    users = tmp_path / "an-empty-folder-of-yours"
    users.mkdir()
    users.chmod(0o2770)
    made = users.stat()
    assert main(["train", "shapes-detect", "--out", str(users), "--set", f"data.path={a_file}"]) == 2
    capsys.readouterr()
    assert list(users.iterdir()) == [], "no lock file left behind"
    assert (users.stat().st_ino, users.stat().st_mode) == (made.st_ino, made.st_mode), "the same folder, as it was"


# --- 3. one process at a time on a run directory ------------------------------------------------------------------

def test_a_held_run_directory_stops_a_second_train_and_resume_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=2", "checkpoint.every=1"]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for key, argv in (("--out", ["train", "digits", "--out", str(out), "--set", *TINY, "steps=2",
                                     "checkpoint.every=1"]),
                          ("--resume", ["train", "--resume", str(out), "--set", "steps=3"])):
            assert main(argv) == 2
            assert one_error(capsys, f"{key}: ") == f"error: {key}: {out} is in use by process {holder.pid}\n"
        assert {p: p.read_bytes() for p in before} == before, "the held run was not touched"
    finally:
        holder.kill()  # SIGKILL: the OS releases the lock of a killed process
        holder.wait(HANG_GUARD_S)
    assert main(["train", "--resume", str(out), "--set", "steps=3"]) == 0
    assert checkpoint.load(out / "checkpoints" / "last.pt")["step"] == 3


def test_the_lock_is_not_inherited_by_forked_children(tmp_path):
    """DataLoader workers are forked: a POSIX record lock is not inherited, so a worker that outlives a killed
    trainer for a moment cannot keep the run directory held."""
    with hold_run_dir(tmp_path / "run"):
        pid = os.fork()
        if pid == 0:  # the child: try to take the lock its parent holds
            import fcntl

            fd = os.open(tmp_path / "run" / LOCK_NAME, os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os._exit(1)  # it could: the lock would be shared with the parent
            except OSError:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child must not hold its parent's lock"


# --- 4. absurd values ---------------------------------------------------------------------------------------------

ABSURD = [
    ("batch=100000000000000000000", "batch: ", "1e+20 does not fit a 64-bit integer"),
    ("batch=1000000000000000000", "batch: ", "for the data order alone"),
    ("steps=100000000000000000000000000000", "steps: ", "1e+29 does not fit a 64-bit integer"),
    ("steps=100000000000000000", "steps: ", "more than a 64-bit count holds"),
    ("data.size=1000000", "data.size: ", "PiB in memory"),
    ("model.width=10000000000", "model.width: ", "more than 2^63 bytes"),
    ("model.width=1000000", "model.width: ", "TiB of float32 weights"),
    ("optim.lr=.inf", "optim.lr: ", "finite number"),
    ("optim.lr=1.0e+400", "optim.lr: ", "finite number"),
    ("optim.lr=.nan", "optim.lr: ", "finite number"),
    ("epochs=1.0e+300", "epochs: ", "more images than a 64-bit count holds"),
    ("eval.every=.inf", "eval.every: ", "finite length"),
    ("seed=100000000000000000000000", "seed: ", "does not fit a 64-bit integer"),
]


@pytest.mark.parametrize(("value", "key", "says"), ABSURD, ids=[v for v, _, _ in ABSURD])
@pytest.mark.parametrize("command", ["train", "show"])
def test_absurd_values_are_one_error_line_naming_the_key(command, value, key, says, tmp_path, capsys, no_training):
    out = ["--out", str(tmp_path / "run")] if command == "train" else []
    assert main([command, "digits", *out, "--set", value]) == 2
    assert says in one_error(capsys, key)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["batch=1048576", "data.size=512", "model.width=2048", "steps=1000000000",
                                   "seed=1733000000000"])
def test_large_values_that_could_still_fit_are_not_refused(value, capsys):
    assert main(["show", "digits", "--set", value, "subdivisions=1"]) == 0


def test_the_capacity_check_counts_the_smallest_input_of_the_largest_detection_size():
    from bigbatch.config import load_config
    from bigbatch.telemetry.capacity import largest_input

    cfg = load_config("shapes-detect", ["data.size=128", "data.max_size=160", "data.multiscale.sizes=[96, 192]"])
    assert largest_input(cfg) == (192, 192)  # the largest multi-scale size, on a square image
    cfg = load_config("shapes-detect", ["data.size=800", "data.max_size=1333"])
    assert largest_input(cfg) == (800, 800)  # a lower bound: an elongated image would be up to 800 x 1333
    cfg = load_config("shapes-detect", ["data.resize=letterbox", "data.size=416", "data.max_size=null",
                                        "data.multiscale.sizes=auto"])
    assert largest_input(cfg) == (608, 608)  # Darknet's rule around 416: 320..608


# --- 5. checkpoints with missing parts, of a future format, or holding code ----------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=2"]) == 0
    return out


def test_best_and_last_at_the_same_step_are_written_once(finished_run):
    """The run's only evaluation is at its last step, where last.pt is due too: one file, two names."""
    checkpoints = finished_run / "checkpoints"
    assert os.path.samefile(checkpoints / "best.pt", checkpoints / "last.pt")
    assert checkpoint.load(checkpoints / "last.pt")["step"] == 2


def run_with_checkpoint(finished_run: Path, run: Path, state: dict) -> Path:
    """A run folder with ``finished_run``'s config and ``state`` as its last checkpoint."""
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_bytes((finished_run / "config.yaml").read_bytes())
    torch.save(state, run / "checkpoints" / "last.pt")
    return run


def test_a_checkpoint_with_only_a_model_is_one_line_in_eval_and_resume(finished_run, tmp_path, capsys):
    state = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    only_model = tmp_path / "model-only.pt"
    torch.save({"model": state["model"]}, only_model)
    capsys.readouterr()
    assert main(["eval", str(only_model)]) == 2
    assert "'config'" in one_error(capsys, f"checkpoint: {only_model} lacks 'step', 'config'")

    run = run_with_checkpoint(finished_run, tmp_path / "run", {"model": state["model"]})
    assert main(["train", "--resume", str(run), "--set", "steps=3"]) == 2
    one_error(capsys, f"checkpoint: {run / 'checkpoints' / 'last.pt'} lacks 'format', 'step', 'optimizer'")


@pytest.mark.parametrize(("part", "value", "says"), [
    ("data", {}, "'data' lacks 'step'"), ("rng", {}, "'rng' lacks 'torch'"), ("best", {}, "'best' lacks 'metric'"),
    ("config", "x", "'config' is a str, not a dict"), ("model", "x", "'model' is a str, not a dict"),
    ("step", 2.5, "'step' is a float, not an int"),
])
def test_a_checkpoint_with_a_malformed_part_is_one_line_in_resume(part, value, says, finished_run, tmp_path, capsys):
    state = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    run = run_with_checkpoint(finished_run, tmp_path / "run", {**state, part: value})
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "steps=3"]) == 2
    assert says in one_error(capsys, f"checkpoint: {run / 'checkpoints' / 'last.pt'}: ")


def test_a_checkpoint_of_a_future_format_is_one_line(finished_run, tmp_path, capsys):
    state = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    future = tmp_path / "future.pt"
    torch.save({**state, "format": checkpoint.FORMAT + 1}, future)
    capsys.readouterr()
    assert main(["eval", str(future)]) == 2
    assert "newer than this bigbatch reads" in one_error(capsys, f"checkpoint: {future} is of format 2")


def test_eval_never_overwrites_a_file_of_the_users_beside_the_checkpoint(finished_run, tmp_path, capsys):
    weights = tmp_path / "model.pt"
    weights.write_bytes((finished_run / "checkpoints" / "last.pt").read_bytes())
    users = tmp_path / "model.eval.json"  # where eval would write its record
    users.write_text('"my notes on the checkpoint"')
    capsys.readouterr()
    assert main(["eval", str(weights)]) == 2
    one_error(capsys, f"eval: {users} exists and is not a record bigbatch eval wrote")
    assert users.read_text() == '"my notes on the checkpoint"'
    users.unlink()
    assert main(["eval", str(weights)]) == 0 and main(["eval", str(weights)]) == 0  # its own record: replaced
    assert json.loads(users.read_text())["checkpoint"] == str(weights)


class Payload:
    """A pickle that would write a file when unpickled."""

    def __init__(self, witness: Path):
        self.witness = witness

    def __reduce__(self):
        return (Path.write_text, (self.witness, "code ran"))


def test_weights_holding_code_are_one_line_of_ours_and_never_run(tmp_path, capsys, no_training):
    from bigbatch.engine.start_weights import load_weights_file
    from bigbatch.models.detectors import build_detector

    witness = tmp_path / "witness"
    evil = tmp_path / "weights.pt"
    torch.save({"backbone.weight": torch.zeros(1), "payload": Payload(witness)}, evil)
    model = build_detector("small_detector", 2, min_size=64, max_size=64)
    with pytest.raises(Exception) as caught:
        load_weights_file(model, evil)
    message = str(caught.value)
    assert message.startswith(f"model.weights: {evil} holds Python objects") and "\n" not in message
    assert "weights_only" not in message
    assert main(["eval", str(evil)]) == 2
    assert "does not unpickle them" in one_error(capsys, f"checkpoint: {evil} holds Python objects")
    assert not witness.exists(), "the pickle's code ran"


# --- 6. files left by a kill during a checkpoint write ---------------------------------------------------------


def test_the_next_start_removes_temporary_checkpoints_a_killed_writer_left(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=1"]) == 0
    left = out / "checkpoints" / f".last.pt.tmp-{dead_pid()}"  # atomic_write's naming, as a SIGKILL leaves it
    left.write_bytes(b"PK\x03\x04 half a checkpoint")
    best_left = out / "checkpoints" / f".best.pt.tmp-{dead_pid()}"
    best_left.write_bytes(b"PK\x03\x04")
    users = [out / "checkpoints" / "notes.tmp-1", out / "checkpoints" / ".last.pt.tmp-x", out / ".last.pt.tmp-1"]
    for path in users:
        path.write_text("not bigbatch's")
    assert main(["train", "--resume", str(out), "--set", "steps=2"]) == 0
    assert not left.exists() and not best_left.exists()
    assert all(path.read_text() == "not bigbatch's" for path in users)


# --- 7. a COCO file without its 'annotations' ---------------------------------------------------------------------


def test_a_coco_file_without_annotations_names_the_file_and_the_key(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    no_boxes = tmp_path / "image_info.json"  # what COCO's test-dev image-info files look like
    no_boxes.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": 8, "height": 8}],
                                    "categories": [{"id": 1, "name": "thing"}]}))
    split = f"{{images: {images}, annotations: {no_boxes}}}"
    out = tmp_path / "run"
    assert main(["train", "shapes-detect", "--out", str(out), "--set", "data.name=coco", f"data.train={split}",
                 f"data.val={split}"]) == 2
    assert one_error(capsys, f"data: {no_boxes}: the 'annotations' key is missing")
    assert not out.exists()


# --- 8. what the non-finite stop says about checkpoints ---------------------------------------------------------


def test_the_nonfinite_stop_says_that_no_checkpoint_exists_yet(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=5", "checkpoint.every=3",
                 "debug.nonfinite_at_step=1", "debug.nonfinite_repeats=100", "precision.max_skipped=2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 2 optimizer steps in a row had non-finite gradients at step 2")
    assert err[0].endswith("No checkpoint had been written yet (the first was due at step 3).")
    assert "holds finite weights" not in err[0]
    assert not (out / "checkpoints" / "last.pt").exists()
