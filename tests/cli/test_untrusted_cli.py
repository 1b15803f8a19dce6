"""Every command refuses what it cannot do before any work, in one ``error:`` line with exit code 2 (issue 23):

- kind 3: a network too large for the machine, whichever command builds it (``show``, ``export``, ``eval``), and
  numbers on the command line that would make memory or time grow without bound (``profile --steps``,
  ``data bench --images``, and what is not a number at all);
- kind 4: an output in a place that cannot be written (``/proc/self``, which refuses new files whatever the
  permission bits say, even to root), for every command that writes one;
- kind 6: ``--resume`` of a run directory another process holds, before its first checkpoint;
- kind 7: ``show``, ``schedule`` and ``scale`` plan a recipe without its data (``data.train_images``); ``train``
  needs the data.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bigbatch.cli import main
from bigbatch.config import RECIPES_DIR, builtin_recipes
from tests.helpers import HANG_GUARD_S, HOLDER, TINY, one_error

UNWRITABLE = Path("/proc/self")
"""A folder in which no file can be made, even by root (procfs)."""


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits") / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *TINY, "steps=2", "checkpoint.every=2"]) == 0
    return out


def huge_cfg(tmp_path: Path, line: str, replacement: str) -> Path:
    """``yolov3-tiny-shapes.cfg`` with its first ``line`` replaced."""
    text = (RECIPES_DIR / "yolov3-tiny-shapes.cfg").read_text()
    assert f"\n{line}\n" in text
    path = tmp_path / "huge.cfg"
    path.write_text(text.replace(f"\n{line}\n", f"\n{replacement}\n", 1))
    return path


# --------------------------------------------------------------------------------------------- kind 3: sizes
@pytest.mark.parametrize("line, replacement", [("size=3", "size=99999"), ("filters=16", "filters=1000000000")])
def test_a_network_too_large_is_refused_by_every_command_that_builds_it(tmp_path, capsys, line, replacement):
    cfg = huge_cfg(tmp_path, line, replacement)
    assert main(["show", "yolov3-tiny-shapes", "--set", f"model.cfg={cfg}"]) == 2
    one_error(capsys, "darknet has ", "parameters", "of memory")
    assert main(["export", str(cfg), "--checkpoint", str(tmp_path / "out.pt")]) == 2
    one_error(capsys, "SOURCE: the network of", "parameters", "of memory")
    assert not (tmp_path / "out.pt").exists()


def test_eval_checks_the_capacity_before_building_the_model(digits_run, capsys):
    assert main(["eval", str(digits_run), "--set", "model.width=10000000000"]) == 2
    one_error(capsys, "model.width: ")


@pytest.mark.parametrize("argv, expected", [
    (["profile", "digits", "--steps", "100000000"], "--steps: expected 1 to 100 steps to profile, got 100000000"),
    (["profile", "digits", "--steps", "0"], "--steps: expected 1 to 100"),
    (["profile", "digits", "--steps", "50", "--set", "steps=10"], "--steps: 50 steps, but the run of digits is 10 "
                                                                  "steps long"),
    (["data", "bench", "digits", "--images", "1e30"], "--images: '1e30' does not fit a 64-bit integer"),
    (["data", "bench", "digits", "--images", "1e12"], "more than 10 times the training set"),
    (["profile", "digits", "--steps", "abc"], "--steps: expected a whole number, got 'abc'"),
    (["data", "bench", "digits", "--images", "2.5"], "--images: expected a whole number, got '2.5'"),
    (["schedule", "digits", "--lines", "many"], "--lines: expected a whole number, got 'many'"),
    (["data", "shapes", "--out", "x", "--images", "-"], "--images: expected a whole number"),
])
def test_a_number_on_the_command_line_is_bounded_up_front(argv, expected, tmp_path, capsys, no_training,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert exit_code(argv) == 2
    one_error(capsys, expected)
    assert list(tmp_path.iterdir()) == [], "nothing written"


def exit_code(argv: list[str]) -> int:
    """``main``'s exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as stopped:
        return stopped.code


def test_an_argument_mistake_is_one_error_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["profile", "digits", "--steps", "abc"])
    assert stopped.value.code == 2
    one_error(capsys, "--steps: expected a whole number, got 'abc'")
    with pytest.raises(SystemExit) as stopped:
        main(["no-such-command"])
    assert stopped.value.code == 2
    one_error(capsys, "invalid choice: 'no-such-command'")


# --------------------------------------------------------------------------------------- kind 4: outputs
def unwritable_cases(run: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    cfg = RECIPES_DIR / "yolov3-tiny-shapes.cfg"
    bad = UNWRITABLE
    return {
        "export --darknet-weights": (["export", str(cfg), "--darknet-weights", f"{bad}/x.weights"],
                                     "--darknet-weights: cannot write in /proc/self"),
        "export --checkpoint": (["export", str(cfg), "--checkpoint", f"{bad}/x.pt"], "--checkpoint: cannot write in"),
        "report --out": (["report", str(run), "--out", f"{bad}/report.html"], "report: --out: cannot write in"),
        "schedule --csv": (["schedule", "digits", "--csv", f"{bad}/lr.csv"], "--csv: cannot write in"),
        "schedule --png": (["schedule", "digits", "--png", f"{bad}/lr.png"], "--png: cannot write in"),
        "scale --out": (["scale", "digits", "--batch", "64", "--out", f"{bad}/r.yaml"], "--out: cannot write in"),
        "eval --save-detections": (["eval", str(run), "--save-detections", f"{bad}/d.json"],
                                   "--save-detections: cannot write in"),
        "pack --out": (["pack", str(tmp_path / "photos"), "--out", f"{bad}/shards"], "--out: cannot make"),
        "profile --out": (["profile", "digits", "--steps", "1", "--out", f"{bad}/trace"], "--out: "),
        "data shapes --out": (["data", "shapes", "--out", f"{bad}/shapes", "--images", "4"], "--out: "),
        "train --out": (["train", "digits", "--out", f"{bad}/run", "--set", *TINY], "--out: "),
    }


@pytest.mark.parametrize("case", list(unwritable_cases(Path("r"), Path("t"))))
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(case, digits_run, tmp_path, capsys,
                                                                     no_training):
    if case == "pack --out":
        from tests.helpers import write_photo_folder

        write_photo_folder(tmp_path / "photos", train=1, val=1)
    argv, expected = unwritable_cases(digits_run, tmp_path)[case]
    assert main(argv) == 2  # eval --save-detections of a classifier: the path is checked before the model is read
    one_error(capsys, expected)


def test_save_detections_never_overwrites_a_users_file(digits_run, tmp_path, capsys):
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "notes"}')
    assert main(["eval", str(digits_run), "--save-detections", str(mine)]) == 2
    one_error(capsys, f"--save-detections: {mine} exists")
    assert mine.read_text() == '{"my": "notes"}'


# ----------------------------------------------------------------------------------- kind 6: a held run, resumed
def test_resume_of_a_run_held_before_its_first_checkpoint_names_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["train", "--resume", str(out)]) == 2
        assert one_error(capsys) == f"error: --resume: {out} is in use by process {holder.pid}\n"
    finally:
        holder.kill()
        holder.wait(HANG_GUARD_S)
    assert main(["train", "--resume", str(out)]) == 2  # released, and still no checkpoint
    one_error(capsys, f"--resume: {out} holds no checkpoints/last.pt")


# --------------------------------------------------------------------------------- kind 7: planning without data
@pytest.mark.parametrize("recipe", builtin_recipes())
def test_show_schedule_and_scale_plan_every_recipe_without_its_data(recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data folder of any recipe is here
    assert main(["show", recipe]) == 0, capsys.readouterr().err
    assert main(["schedule", recipe, "--lines", "3"]) == 0, capsys.readouterr().err
    assert main(["scale", recipe, "--batch", "512"]) == 0, capsys.readouterr().err


def test_a_length_counted_in_epochs_without_the_data_names_its_key_and_data_train_images(tmp_path, capsys,
                                                                                         monkeypatch):
    """An image folder that is not given: show plans what is counted in steps, and a length counted in epochs is one
    error naming that key and data.train_images (the key that counts the epochs without the data)."""
    monkeypatch.chdir(tmp_path)
    folder = ["--set", "data.name=folder", "data.path=null"]
    assert main(["show", "digits", *folder]) == 2  # digits counts 25 epochs
    one_error(capsys, "epochs: counted in epochs", "data.train_images")
    assert main(["show", "digits", *folder, "steps=100"]) == 2  # its warmup is 5 epochs long
    one_error(capsys, "schedule.warmup[0].length: counted in epochs", "data.train_images")
    missing = ["--set", "data.name=folder", f"data.path={tmp_path / 'nowhere'}"]
    for command in (["show", "digits"], ["schedule", "digits", "--lines", "2"]):  # why the set was not counted
        assert main([*command, *missing]) == 2
        one_error(capsys, f"epochs: counted in epochs, but the training set cannot be counted: data.path: "
                  f"{tmp_path / 'nowhere'} does not exist;", "data.train_images")
    assert main(["show", "digits", *folder, "steps=100", "schedule.warmup=[]"]) == 0, capsys.readouterr().err
    assert "epochs          unknown" in capsys.readouterr().out
    assert main(["schedule", "digits", *folder, "steps=100", "schedule.warmup=[]", "--lines", "2"]) == 0
    table = capsys.readouterr().out
    assert "epochs unknown" in table and "\n         0          -  0.1" in table, table
    assert main(["show", "digits", *folder, "steps=100", "schedule.warmup=[]", "data.train_images=1000"]) == 0
    assert "epochs          25.60 (of 1000 training images)" in capsys.readouterr().out
    assert main(["scale", "digits", *folder, "--batch", "512"]) == 0, capsys.readouterr().err


def test_a_data_path_that_does_not_exist_says_so(tmp_path, capsys, no_training):
    missing = tmp_path / "nonexistent"
    for name in ("folder", "shards", "yolo"):
        config = "digits" if name != "yolo" else "shapes-detect"
        assert main(["train", config, "--out", str(tmp_path / "run"), "--set", f"data.name={name}",
                     f"data.path={missing}"]) == 2
        one_error(capsys, f"data.path: {missing} does not exist")


def test_training_the_imagenet_recipe_needs_its_data(tmp_path, capsys, no_training):
    assert main(["train", "inception-v3-tpu", "--out", str(tmp_path / "run")]) == 2
    one_error(capsys, "data.path: missing")
    assert main(["data", "bench", "inception-v3-tpu", "--images", "10"]) == 2
    one_error(capsys, "data.path: missing")
