"""Sizes and counts from the command line and the config, bounded before any work (docs/review-cli findings 1, 2,
8, 9 and 10): each is refused in one ``error:`` line naming the option or key, exit code 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigbatch.advisor.model import divisors, nearest_device_counts
from bigbatch.cli import MAX_SCHEDULE_ROWS, main
from bigbatch.config import load_config
from tests.helpers import one_error

# ----------------------------------------------------------------------------- schedule


def test_schedule_of_many_steps_prints_sampled_steps_only(monkeypatch, capsys) -> None:
    """10^10 steps: the LR is computed at the printed steps only (the old code built a list of every step's)."""
    import bigbatch.largebatch.schedule as schedule

    build, calls = schedule.build_schedule, []

    def counting(cfg, plan):
        lr = build(cfg, plan)

        def counted(step: int) -> float:
            calls.append(step)
            assert len(calls) < 10_000, "the LR of every step is computed"
            return lr(step)

        return counted

    monkeypatch.setattr(schedule, "build_schedule", counting)
    assert main(["schedule", "--set", "steps=10000000000", "batch=8", "subdivisions=1", "--lines", "10"]) == 0
    out = capsys.readouterr().out
    assert "10000000000 steps" in out and f"{10**10 - 1:10d}" in out
    assert len(calls) <= 12


def test_schedule_csv_and_png_of_too_many_steps_are_refused(tmp_path: Path, capsys) -> None:
    for option in ("--csv", "--png"):
        path = tmp_path / f"s.{option[2:]}"
        assert main(["schedule", "--set", "steps=10000000000", "batch=8", "subdivisions=1", option, str(path)]) == 2
        one_error(capsys, f"{option}: writes at most {MAX_SCHEDULE_ROWS} steps", "10000000000 steps (steps)")
        assert not path.exists()


def test_schedule_csv_and_png_on_one_path_are_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["schedule", "--lines", "1", "--csv", "s.csv", "--png", "./s.csv"]) == 2
    one_error(capsys, "--png: ", "is also --csv")
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("lines", ["0", "1000000000"])
def test_schedule_lines_out_of_range_are_refused(lines: str, capsys) -> None:
    assert main(["schedule", "--lines", lines]) == 2
    one_error(capsys, "--lines: expected 1 to")


# ----------------------------------------------------------------------------- plan --devices


@pytest.mark.parametrize(("args", "expected"), [
    (["--devices", "100000000000"], "--devices: at most 1000000 devices"),
    (["--devices", ",".join(["2"] * 101)], "--devices: at most 100 values"),
    (["--devices", "1,2", "--measure-steps", "100000000000"], "--measure-steps: 2 to 1000 steps"),
    (["--devices", "2", "--batches", str(2**41)], "--batches: at most"),
])
def test_plan_devices_bounds(args: list[str], expected: str, capsys) -> None:
    assert main(["plan", *args]) == 2  # before any work: a loop over the number given would not end in the suite
    one_error(capsys, expected)


def test_nearest_device_counts_are_found_among_the_divisors() -> None:
    for batch in range(1, 400):
        assert divisors(batch) == [n for n in range(1, batch + 1) if batch % n == 0]
        for devices in (1, 3, 7, 50, 500):
            if batch % devices:
                below = max((n for n in range(1, devices) if batch % n == 0), default=None)
                above = min((n for n in range(devices + 1, batch + 1) if batch % n == 0), default=None)
                assert nearest_device_counts(batch, devices) == (below, above)
    # up to the square root: a loop to the number itself (10^12 steps for the prime) would not end in the suite
    assert nearest_device_counts(256, 100_000_000_000) == (256, None)
    assert nearest_device_counts(2**40, 1_000_001) == (2**19, 2**20)
    assert nearest_device_counts(1_000_000_000_039, 3) == (1, 1_000_000_000_039)


def test_plan_devices_past_the_batch_names_the_nearest(capsys) -> None:
    assert main(["plan", "--devices", "999999", "--batches", "256"]) == 2
    one_error(capsys, "--devices: batch 256 cannot be cut for 999999 devices", "the nearest that work: 256")
    assert main(["plan", "--devices", "3", "--batches", "1000000000039"]) == 2  # a prime: the old loop ran to it
    one_error(capsys, "--devices: batch 1000000000039 cannot be cut for 3 devices", "work: 1 or 1000000000039")


# ----------------------------------------------------------------------------- data shapes, data.* counts


def test_data_shapes_images_is_bounded(tmp_path: Path, capsys) -> None:
    out = tmp_path / "shp"
    assert main(["data", "shapes", "--out", str(out), "--images", "1e12"]) == 2
    one_error(capsys, "--images: at most 10000000 images")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("config", "setting", "key"), [
    ("shapes-detect", "data.shapes_images=1000000000000", "data.shapes_images"),
    ("digits", "data.workers=1000000", "data.workers"),
])
def test_config_counts_are_bounded(config: str, setting: str, key: str, capsys) -> None:
    assert main(["show", config, "--set", setting]) == 2
    one_error(capsys, f"error: {key}: ", "less than or equal to")


def test_config_counts_within_the_bounds_are_kept() -> None:
    assert load_config("digits", ["data.workers=256"]).data.workers == 256
    assert load_config("shapes-detect", ["data.shapes_images=10000000"]).data.shapes_images == 10_000_000


# ----------------------------------------------------------------------------- scale


def test_scale_refuses_a_recipe_show_would_refuse(tmp_path: Path, capsys) -> None:
    out = tmp_path / "huge.yaml"
    assert main(["scale", "--batch", "1000000000000", "--out", str(out)]) == 2
    one_error(capsys, "error: --batch: at batch 1000000000000, 1000000000000 images per step")
    assert not out.exists()


# ----------------------------------------------------------------------------- steps and epochs


@pytest.mark.parametrize("settings", [["steps=10", "epochs=2"], ["epochs=2", "steps=10"]])
def test_steps_and_epochs_both_in_set_are_refused(settings: list[str], capsys) -> None:
    assert main(["show", "--set", *settings]) == 2
    one_error(capsys, "error: steps: give either steps or epochs, not both")


def test_set_replaces_the_recipes_steps_or_epochs(tmp_path: Path) -> None:
    assert load_config("digits", ["steps=10"]).steps == 10  # the recipe counts in epochs
    recipe = tmp_path / "r.yaml"
    recipe.write_text("batch: 64\nsteps: 100\n")
    cfg = load_config(str(recipe), ["epochs=2"])
    assert (cfg.steps, cfg.epochs) == (None, 2)
    cfg = load_config(str(recipe), ["steps=5", "steps=7"])  # one key twice: the last, as any key
    assert cfg.steps == 7


@pytest.mark.parametrize("command", [["data", "shapes", "--out", "{tmp}/x"], ["pack", "{tmp}", "--out", "{tmp}/y"],
                                     ["data", "anchors", "{tmp}"]])
def test_a_negative_seed_is_one_line(tmp_path: Path, command: list[str], capsys) -> None:
    """``data shapes --seed -1`` ended in numpy's traceback after the set was begun; every ``--seed`` is a whole number
    >= 0, checked as the command line is read."""
    with pytest.raises(SystemExit) as exited:
        main([part.format(tmp=tmp_path) for part in command] + ["--seed", "-1"])
    assert exited.value.code == 2
    one_error(capsys, "argument --seed: expected a whole number >= 0, got '-1'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["train", "digits"], ["profile", "digits"]])
def test_an_out_that_is_a_link_to_nothing_is_one_line(tmp_path: Path, command: list[str], capsys) -> None:
    """``train --out`` on a dangling link was a FileNotFoundError traceback; ``profile --out`` said "File exists"."""
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "absent")
    assert main([*command, "--out", str(link)]) == 2
    one_error(capsys, f"--out: {link} is a link to nothing; give a new or empty folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling"] and not (tmp_path / "absent").exists()


@pytest.mark.parametrize(("command", "option"), [(["plan", "digits", "--devices", "1,2"], "--price"),
                                                 (["plan", "digits"], "--target-loss"),
                                                 (["predict", "x.jpg"], "--conf"), (["predict", "x.jpg"], "--iou")])
@pytest.mark.parametrize("value", ["inf", "nan", "1e400"])
def test_a_number_option_is_finite(command: list[str], option: str, value: str, capsys) -> None:
    """``plan --devices --price inf`` was taken (``--json`` then printed ``"price": Infinity``, not JSON)."""
    with pytest.raises(SystemExit) as exited:
        main([*command, option, value])
    assert exited.value.code == 2
    one_error(capsys, f"argument {option}: expected a finite number, got '{value}'")


@pytest.mark.parametrize("command", [["export", "{fixture}", "--format", "torchscript", "--out", "{out}.torchscript"],
                                     ["export", "{fixture}", "--format", "onnx", "--out", "{out}.onnx"],
                                     ["profile", "digits", "--out", "{out}"]])
def test_an_output_name_torch_cannot_take_is_refused_before_any_work(tmp_path: Path, command: list[str],
                                                                     capsys) -> None:
    """torch.jit.save, onnxruntime and torch's trace writer take a path as text: a name with a byte that is not UTF-8
    failed in a traceback after the export or the profiled steps (profile leaving its folder behind)."""
    import os

    from tests.helpers import ROOT

    out = os.fsdecode(bytes(tmp_path) + b"/c\xff")
    fixture = str(ROOT / "tests" / "fixtures" / "run-format1")
    assert main([part.format(fixture=fixture, out=out) for part in command]) == 2
    one_error(capsys, "--out: ", "c\\xff", "is not UTF-8")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["f.pt", "f.onnx"])
def test_a_fifo_given_as_a_checkpoint_or_model_is_not_said_to_be_missing(tmp_path: Path, name: str, capsys) -> None:
    """A FIFO where a checkpoint or an exported model is read was "does not exist"; it is there, and not read."""
    import os

    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert main(["eval", str(fifo)]) == 2
    one_error(capsys, f"{fifo} is not a regular file; not read")
