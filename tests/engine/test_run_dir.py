"""The run directory (``engine/run_dir.py``) as a folder that may be anyone's: a folder is a run only by proof that
bigbatch wrote it (its lock file, or an earlier version's bigbatch checkpoint), never because its ``config.yaml``
reads as a config, so a user's project folder is refused and nothing in it is overwritten; and a run folder's own
files are read only from inside it, as regular files, within a size bound (``--resume``, ``eval``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from bigbatch.config import load_config
from bigbatch.engine.run_dir import LOCK_NAME, is_bigbatch_run
from bigbatch.errors import UserError
from tests.helpers import FIXTURES, ROOT, TINY, run_main

FORMAT1_RUN = FIXTURES / "run-format1"
"""A run directory of an earlier version: config.yaml, metrics.jsonl and checkpoints/last.pt, no lock file."""
pytestmark = pytest.mark.fast

DIGITS = ROOT / "bigbatch" / "configs" / "digits.yaml"


def contents(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, a link's target, a folder's name."""
    found: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        found[name] = (f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file()
                       else "folder")
    return found


def one_error(result, *expected: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    err = result.stderr
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err
    return err


def copy_of_format1(tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    shutil.copytree(FORMAT1_RUN, run)  # never write into tests/fixtures
    return run


# --- 1. a folder is a run only by proof that bigbatch wrote it ----------------------------------------------------


def test_a_project_folder_whose_config_yaml_is_a_recipe_is_refused_and_left_as_it_was(tmp_path, no_training):
    """The review's case: proj/ holds the digits recipe as config.yaml, notes and a metrics.jsonl of the user's;
    ``train proj/config.yaml --out proj`` took it for a run (its config.yaml reads as a config), replaced the recipe
    with the resolved config (its comments and epochs gone) and dropped the user's line from metrics.jsonl."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.yaml").write_bytes(DIGITS.read_bytes())
    (proj / "notes.txt").write_text("my notes\n")
    (proj / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = contents(proj)
    result = run_main("train", str(proj / "config.yaml"), "--out", str(proj), "--set", "steps=2", *TINY)
    one_error(result, f"error: --out: {proj} is not a bigbatch run directory and already holds {proj / 'config.yaml'}, "
                      "which the run would overwrite")
    assert contents(proj) == before, "nothing written, nothing removed (no lock file either)"


def test_a_config_yaml_beside_a_checkpoint_of_another_tool_is_no_proof(tmp_path, no_training):
    """A folder of another tool's: a config.yaml bigbatch reads as a config, and a torch checkpoint that is not
    bigbatch's (it lacks a resume's parts)."""
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.yaml").write_bytes(DIGITS.read_bytes())
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3, "config": {}}, other / "checkpoints" / "last.pt")
    before = contents(other)
    assert not is_bigbatch_run(other)
    one_error(run_main("train", "digits", "--out", str(other), "--set", *TINY), f"--out: {other} is not a bigbatch run")
    assert contents(other) == before


def test_a_run_is_proven_by_its_lock_file_or_an_earlier_versions_checkpoint(tmp_path):
    """What makes a folder a run: the lock file every run keeps (a regular file holding a PID, marked once the run
    wrote), or, in a folder of an earlier version (no lock file), a bigbatch checkpoint; not a lock file that is a
    link, nor one of other text, nor one holding only a PID."""
    old = copy_of_format1(tmp_path, "old")
    assert not (old / LOCK_NAME).exists() and is_bigbatch_run(old)
    (old / "checkpoints" / "last.pt").unlink()
    assert not is_bigbatch_run(old), "config.yaml and metrics.jsonl alone prove nothing"
    (old / LOCK_NAME).write_text("12345\n")
    assert not is_bigbatch_run(old), "the lock file of a run killed before it wrote anything"
    (old / LOCK_NAME).write_text("12345\nrun\n")
    assert is_bigbatch_run(old)
    (old / LOCK_NAME).write_text("my lock, not a PID\n")
    assert not is_bigbatch_run(old)
    (old / LOCK_NAME).unlink()
    (old / LOCK_NAME).symlink_to(FIXTURES / "run-format1" / "config.yaml")
    assert not is_bigbatch_run(old)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "checkpoints").symlink_to(FORMAT1_RUN / "checkpoints")  # an earlier run's checkpoint, elsewhere
    assert not is_bigbatch_run(linked)


def test_the_lock_file_of_a_run_killed_before_it_wrote_proves_nothing_of_a_config_yaml_put_beside_it(tmp_path,
                                                                                                     no_training):
    """A run killed before its first write leaves only its lock file (a PID, no mark): a ``config.yaml`` of the
    user's put beside it later is refused, not overwritten (the lock file alone passed for a run's)."""
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / LOCK_NAME).write_text("4242\n")  # a run's lock file, killed before it wrote anything
    (folder / "config.yaml").write_bytes(DIGITS.read_bytes())
    before = contents(folder)
    one_error(run_main("train", "digits", "--out", str(folder), "--set", *TINY),
              f"--out: {folder} is not a bigbatch run directory and already holds {folder / 'config.yaml'}")
    assert contents(folder) == before


def test_the_run_keeps_its_lock_while_it_checks_its_own_files(tmp_path):
    """A record lock belongs to the process and closing any descriptor of its file releases it: reading the lock
    file to prove the folder a run's (``check_run_file`` before a resumed run appends to metrics.jsonl, as every
    resume does) released the run's lock, and a second ``train --resume`` of the folder could start beside it."""
    import subprocess
    import sys

    from bigbatch.engine.run_dir import check_run_file, check_run_files, claim, hold_run_dir, holder

    def seen_by_another_process() -> str:
        code = (f"from pathlib import Path; from bigbatch.engine.run_dir import holder; "
                f"print(holder(Path({str(run)!r})))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    run = tmp_path / "run"
    with hold_run_dir(run):
        claim(run)
        (run / "metrics.jsonl").write_text("{}\n")
    with hold_run_dir(run):
        check_run_file(run, "metrics.jsonl")
        check_run_files(run)
        assert is_bigbatch_run(run) and holder(run) == f"process {os.getpid()}"
        assert seen_by_another_process() == f"process {os.getpid()}"
        with pytest.raises(UserError, match="is in use by process"), hold_run_dir(run):
            pass
        assert seen_by_another_process() == f"process {os.getpid()}"
    assert seen_by_another_process() == "None" and is_bigbatch_run(run)


def test_an_earlier_versions_run_is_still_a_run_under_out(tmp_path, no_training):
    """run-format1 (no lock file) given as --out with another config: recognised as a run by its checkpoint, so the
    message is the other config's, not "not a bigbatch run directory"."""
    run = copy_of_format1(tmp_path)
    before = contents(run)
    one_error(run_main("train", "digits", "--out", str(run), "--set", *TINY),
              f"--out: {run} already holds a run of another config")
    assert contents(run) == before


def test_a_run_whose_metrics_jsonl_is_a_link_is_refused_before_any_work(tmp_path, no_training):
    """In a run of bigbatch's, a log that is a link would lead the run's appends to the file it names."""
    run = copy_of_format1(tmp_path)
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text('{"mine": 1}\n')
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(theirs)
    one_error(run_main("train", "--resume", str(run), "--set", "steps=6"),
              f"--resume: {run / 'metrics.jsonl'} is a symbolic link, not a file bigbatch wrote")
    assert theirs.read_text() == '{"mine": 1}\n'


def test_train_itself_never_replaces_a_users_config_yaml(tmp_path):
    """``engine.trainer.train`` called without the CLI's checks (a script of the user's): a folder holding a
    config.yaml that no run of bigbatch's wrote is refused where the config would be written, the file untouched."""
    from bigbatch.engine.trainer import train

    users = tmp_path / "users"
    users.mkdir()
    (users / "config.yaml").write_bytes(DIGITS.read_bytes())
    with pytest.raises(UserError, match=r"is not a bigbatch run directory and already holds .*config\.yaml"):
        train(load_config("digits", [*TINY, "steps=1"]), users)
    assert (users / "config.yaml").read_bytes() == DIGITS.read_bytes()
    assert sorted(p.name for p in users.iterdir()) == ["config.yaml"]


# --- 2. --resume reads the run's config.yaml as a regular file, bounded -------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "a file past the bound"])
def test_a_resumed_runs_config_yaml_is_read_only_as_a_bounded_regular_file(tmp_path, kind, no_training):
    """``train --resume DIR`` read DIR/config.yaml whole, whatever it was: a FIFO hung, a link to /dev/zero read until
    memory ran out. A regular file past the bound (1 MiB, a config is a few KB) is refused before it is read."""
    run = copy_of_format1(tmp_path)
    config = run / "config.yaml"
    text = config.read_text()
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)
        expected = f"--resume: {config} is not a regular file"
    elif kind == "link to /dev/zero":
        config.symlink_to("/dev/zero")
        expected = f"--resume: {config} leads outside {run}"
    else:
        config.write_text(text + "#" * (1 << 20) + "\n")  # a valid config, a long comment after it
        expected = f"config: {config} is {config.stat().st_size:,} bytes, more than a config may be (1,048,576)"
    one_error(run_main("train", "--resume", str(run), "--set", "steps=6"), expected)
    assert not (run / LOCK_NAME).exists()


# --- 3. a run folder's files are read only from inside it ---------------------------------------------------------

SECRET = "password swordfish-SECRET x\nmore secret\n"


def test_a_kept_cfg_that_leads_outside_the_run_is_not_read(tmp_path, no_training):
    """A Darknet run keeps its network as DIR/model.cfg and ``--resume`` reads it; a model.cfg that is a link to a
    file outside the run was read, and the cfg parser's error quoted the file's first line."""
    secret = tmp_path / "secret.cfg"
    secret.write_text(SECRET)
    run = copy_of_format1(tmp_path, "evil")
    (run / "config.yaml").write_text("name: x\ntask: detection\nbatch: 8\nsteps: 2\nmodel:\n  name: darknet\n"
                                     "  cfg: yolov3-tiny-shapes.cfg\ndata:\n  name: shapes\n  size: 64\n")
    (run / "model.cfg").symlink_to("../secret.cfg")
    result = run_main("train", "--resume", str(run))
    one_error(result, f"error: model.cfg: {run / 'model.cfg'} leads outside {run}")
    assert "swordfish" not in result.stdout + result.stderr
    assert secret.read_text() == SECRET


@pytest.mark.parametrize("command", [["train", "--resume", "{run}"], ["eval", "{run}"],
                                     ["train", "digits", "--set", "model.weights={run}", *TINY],
                                     ["predict", "--from", "{run}", "{image}"], ["export", "{run}", "--format",
                                                                                  "torchscript", "--out", "{out}"]])
def test_a_runs_checkpoint_leading_outside_it_is_not_read(tmp_path, command, no_training):
    """``checkpoints/last.pt`` a link to a checkpoint outside the run: ``--resume``, ``eval``, ``model.weights``,
    ``predict --from`` and ``export`` of the run read it (``config.yaml`` and ``model.cfg`` were refused so)."""
    run = copy_of_format1(tmp_path)
    outside = tmp_path / "elsewhere.pt"
    (run / "checkpoints" / "last.pt").rename(outside)
    (run / "checkpoints" / "last.pt").symlink_to(outside)
    image = tmp_path / "x.png"
    image.write_bytes(b"not read")
    before = contents(run)
    args = [part.format(run=run, image=image, out=tmp_path / "model.torchscript") for part in command]
    err = one_error(run_main(*args, cwd=tmp_path), f"{run / 'checkpoints' / 'last.pt'} leads outside {run}")
    assert err.startswith("error: ") and contents(run) == before and not (tmp_path / "predictions").exists()


def test_a_resumed_runs_config_yaml_leading_outside_is_not_read(tmp_path, no_training):
    secret = tmp_path / "secret.yaml"
    secret.write_text("password: swordfish\n")
    run = copy_of_format1(tmp_path)
    (run / "config.yaml").unlink()
    (run / "config.yaml").symlink_to(secret)
    result = run_main("train", "--resume", str(run))
    one_error(result, f"error: --resume: {run / 'config.yaml'} leads outside {run}")
    assert "swordfish" not in result.stdout + result.stderr and "password" not in result.stderr


def test_a_kept_file_linked_inside_the_run_is_read(tmp_path):
    """The rule is where a file's real path lies, not whether it is a link: a kept cfg that is a link to a file inside
    the run folder is read (its real path), as ``darknet/reading.py`` reads a link that stays inside its folders."""
    from bigbatch.engine.run_dir import kept_overrides

    run = tmp_path / "run"
    (run / "kept").mkdir(parents=True)
    (run / "kept" / "net.cfg").write_text("[net]\n")
    (run / "model.cfg").symlink_to("kept/net.cfg")
    darknet = {"model": {"name": "darknet"}}
    assert kept_overrides(run, darknet) == [f'model.cfg="{(run / "kept" / "net.cfg").resolve()}"']
    (tmp_path / "outside.cfg").write_text("[net]\n")
    (run / "model.cfg").unlink()
    (run / "model.cfg").symlink_to("../outside.cfg")
    with pytest.raises(UserError, match="^model.cfg: .* leads outside"):
        kept_overrides(run, darknet)


# --- 4. temporary files a killed write left ----------------------------------------------------------------------


def test_a_resume_in_the_pid_of_the_killed_run_removes_its_temporaries_and_writes_its_checkpoints(tmp_path, capsys):
    """In a container every run is PID 1: a resumed run has the PID of the one killed mid-write. The tidy kept a
    ``.last.pt.tmp-PID`` of its own PID, and the resumed run died at its first checkpoint ("... is in the way of the
    write and is not bigbatch's"). Here the resume runs in this very process, so its PID is the leftovers' PID."""
    from bigbatch.cli import main

    run = tmp_path / "run"
    assert main(["train", "digits", "--out", str(run), "--set", *TINY, "steps=1"]) == 0
    pid = os.getpid()
    left = [run / "checkpoints" / f".last.pt.tmp-{pid}",  # an earlier version's naming
            run / "checkpoints" / f".best.pt.tmp-{pid}-0123456789abcdef",
            run / f".config.yaml.tmp-{pid}-fedcba9876543210"]
    for path in left:
        path.write_bytes(b"PK\x03\x04 half a file")
    theirs = tmp_path / "theirs.pt"
    theirs.write_text("the user's")
    kept = {run / "checkpoints" / "notes.tmp-1": "not bigbatch's", run / "checkpoints" / ".last.pt.tmp-x": "x",
            run / ".last.pt.tmp-1": "not where a checkpoint is written",
            run / f".eval-last.json.tmp-{pid}-0123456789abcdef": "eval writes without the run's lock"}
    for path, text in kept.items():
        path.write_text(text)
    link = run / "checkpoints" / f".last.pt.tmp-{pid}-00000000000000aa"
    link.symlink_to(theirs)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "steps=2"]) == 0, capsys.readouterr().err
    assert not any(os.path.lexists(path) for path in left)
    assert all(path.read_text() == text for path, text in kept.items())
    assert link.is_symlink() and theirs.read_text() == "the user's"
    from bigbatch.engine import checkpoint

    assert checkpoint.load(run / "checkpoints" / "last.pt", checkpoint.RESUME_KEYS)["step"] == 2


def test_the_tidy_spares_a_write_this_process_has_in_flight(tmp_path):
    """Under the run's lock no other bigbatch process writes in the folder; this one may (a write on the checkpoint
    thread): its temporary file is not removed from under it."""
    from bigbatch.engine.run_dir import hold_run_dir, remove_stale_temporaries
    from bigbatch.floor import files

    run = tmp_path / "run"
    stale = run / "checkpoints" / ".last.pt.tmp-1-0123456789abcdef"
    seen = []

    def write(f):
        f.write(b"a checkpoint")
        f.flush()
        stale.write_bytes(b"left by a killed run")
        seen.extend(remove_stale_temporaries(run))  # while this write is in flight

    with hold_run_dir(run):
        files.atomic_write(run / "checkpoints" / "last.pt", write)
    assert seen == [stale]
    assert (run / "checkpoints" / "last.pt").read_bytes() == b"a checkpoint"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.pt"]


# --- 5. a run writes only inside its folder -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["checkpoints", "tensorboard"])
@pytest.mark.parametrize("where", ["outside", "inside"])
@pytest.mark.parametrize("command", [["train", "digits", "--out", "{run}", "--set", *TINY],
                                     ["train", "--resume", "{run}"]])
def test_a_run_folder_whose_checkpoints_or_tensorboard_is_a_link_is_refused_before_any_work(
        tmp_path, capsys, no_training, name, where, command):
    """A run folder (its lock file marked) whose ``checkpoints/`` was a link to a folder of the user's: ``train``
    replaced the user's ``best.pt`` there with a checkpoint and the start's tidy removed a ``.best.pt.tmp-N`` there,
    while reads through the same link are refused ("leads outside"). Writes now agree: one line, nothing touched."""
    from bigbatch.cli import main
    from bigbatch.engine.run_dir import check_run_files, remove_stale_temporaries

    run = copy_of_format1(tmp_path)
    (run / LOCK_NAME).write_text("4242\nrun\n")  # a run's lock file, its holder gone
    victim = tmp_path / "victim" if where == "outside" else run / "kept"
    victim.mkdir()
    (victim / "best.pt").write_text("THE USER'S OWN MODEL")
    (victim / ".best.pt.tmp-12345").write_text("the user's notes")
    if name == "checkpoints":  # the run's own checkpoint kept beside, so that --resume gets as far as the check
        (run / "checkpoints" / "last.pt").rename(run / "last.pt")
        (run / "checkpoints").rmdir()
    (run / name).symlink_to(victim)
    before = contents(tmp_path)
    args = [part.format(run=run) for part in command]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(run / name) in err, err
    assert contents(tmp_path) == before
    with pytest.raises(UserError, match=f"--out: {run / name} is a symbolic link, not a folder of the run's own"):
        check_run_files(run)  # what train itself checks before it writes (a script calling it without the CLI)
    assert remove_stale_temporaries(run) == [] and contents(tmp_path) == before  # the tidy follows no link


def test_a_run_folder_whose_tensorboard_is_a_file_is_refused(tmp_path, capsys, no_training):
    from bigbatch.cli import main

    run = copy_of_format1(tmp_path)
    (run / "tensorboard").write_text("not a folder")
    before = contents(tmp_path)
    assert main(["train", "digits", "--out", str(run), "--set", *TINY]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out: {run / 'tensorboard'} is not a folder, not a folder of the run's own; a run writes " \
                  f"only inside its folder: nothing written there (move it away or choose another folder)\n"
    assert contents(tmp_path) == before


def test_a_kept_model_cfg_edited_by_hand_is_not_overwritten(tmp_path, monkeypatch):
    """A run's ``model.cfg`` (``keep_model_files``) is replaced when it is the text to write or bigbatch wrote it and
    nothing changed it since; one edited by hand is the user's, refused in one line and left as it is. Its first line,
    ``# kept by bigbatch: ...``, was once the proof, and an edited copy kept it."""
    from types import SimpleNamespace

    from bigbatch.engine.run_dir import keep_model_files

    monkeypatch.setenv("BIGBATCH_CACHE_DIR", str(tmp_path / "cache"))
    texts = iter(["# kept by bigbatch: net.cfg\n[net]\nbatch=1\n", "# kept by bigbatch: net.cfg\n[net]\nbatch=2\n",
                  "# kept by bigbatch: net.cfg\n[net]\nbatch=3\n"])

    class Config:
        model = SimpleNamespace(part=lambda: SimpleNamespace(info={"keeps": {"model.cfg": lambda model: next(texts)}}))

        @staticmethod
        def model_dump(mode: str) -> dict:
            return {"model": {"cfg": str(tmp_path / "net.cfg")}}

    run = tmp_path / "run"
    run.mkdir()
    keep_model_files(run, Config(), None)
    keep_model_files(run, Config(), None)  # its own, unchanged since: replaced
    assert (run / "model.cfg").read_text().endswith("batch=2\n")
    edited = (run / "model.cfg").read_text() + "# my own note\n"
    (run / "model.cfg").write_text(edited)
    with pytest.raises(UserError, match=r"^--out: .*model.cfg is not a file bigbatch kept as it is now"):
        keep_model_files(run, Config(), None)
    assert (run / "model.cfg").read_text() == edited
