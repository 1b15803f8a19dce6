"""End to end through the real CLI: a run directory, its metrics, checkpoints, eval and show."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
import yaml

from tests.helpers import run_cli, run_main


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """The digits recipe (batch 256, subdivisions 8), shortened to 40 steps: ``python -m bigbatch train`` in a real
    process, the suite's smoke test of the entry point (the other tests call ``main`` in process)."""
    out = tmp_path_factory.mktemp("runs") / "digits"
    result = run_cli("train", "digits", "--out", str(out), "--set", "steps=40", "eval.every=15",
                     "checkpoint.every=20", "memory.interval=0.5")
    assert result.returncode == 0, result.stderr
    return out, result


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_digits_learns_to_95_percent(digits_run):
    out, result = digits_run
    final = [r for r in records(out) if r.get("split") == "val"][-1]
    assert final["step"] == 40
    assert final["top1"] >= 95.0
    assert final["images"] == 360, "every validation image is counted once"
    assert f"run written to {out}" in result.stdout
    assert "micro-batch     32 images" in result.stdout


def test_run_directory_layout(digits_run):
    out, _ = digits_run
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["batch"] == 256 and config["subdivisions"] == 8 and config["steps"] == 40
    train = [r for r in records(out) if "lr" in r]
    assert [r["step"] for r in train] == [1, 10, 20, 30, 40]
    for r in train:
        assert r["images"] == 256 * r["step"]
        assert {"lr", "loss", "epoch"} <= r.keys()
    assert [r["step"] for r in records(out) if r.get("split") == "val"] == [15, 30, 40]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    memory = list(csv.DictReader((out / "memory.csv").open()))
    assert len(memory) >= 2
    times = [float(row["time"]) for row in memory]
    # in time order; two rows may share a timestamp (milliseconds): the sampler's last periodic row and the final one
    assert times == sorted(times), "timestamps do not go back"
    steps = [int(row["step"]) for row in memory]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 40
    assert all(float(row["rss_mib"]) > 10 for row in memory)
    peaks = [r for r in records(out) if r.get("event") == "memory"]
    assert len(peaks) == 1
    assert peaks[0]["peak_rss_mib"] == pytest.approx(max(float(row["rss_mib"]) for row in memory), abs=0.11)
    last = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    best = torch.load(out / "checkpoints" / "best.pt", weights_only=True)
    assert last["step"] == 40
    assert {"model", "optimizer", "rng", "data", "config", "best"} <= last.keys()
    assert best["step"] == last["best"]["step"]
    assert best["best"]["value"] == max(r["top1"] for r in records(out) if r.get("split") == "val")


def test_eval_reproduces_the_final_metrics(digits_run):
    out, _ = digits_run
    result = run_main("eval", str(out), "--set", "eval.batch=7")
    assert result.returncode == 0, result.stderr
    written = json.loads((out / "eval-last.json").read_text())
    final = [r for r in records(out) if r.get("split") == "val"][-1]
    assert written["images"] == 360
    assert written["top1"] == pytest.approx(final["top1"])
    assert written["loss"] == pytest.approx(final["loss"], rel=1e-4)
    assert "top1" in result.stdout


def test_out_dir_with_another_run_refuses_to_overwrite(digits_run):
    out, _ = digits_run
    result = run_main("train", "digits", "--out", str(out), "--set", "steps=1", "eval.every=15",
                      "checkpoint.every=20", "memory.interval=0.5")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: --out: {out} already holds a run of another config (steps: 40 there, "
                                    f"1 here)")


def test_out_dir_with_this_run_resumes_it(digits_run, tmp_path):
    """The same command again (as torchrun runs it after a restart) continues the run; here it is finished."""
    out = tmp_path / "copy"
    shutil.copytree(digits_run[0], out)
    before = [r for r in records(out) if "lr" in r]
    result = run_main("train", "digits", "--out", str(out), "--set", "steps=40", "eval.every=15",
                      "checkpoint.every=20", "memory.interval=0.5", "subdivisions=4")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"resumed from step 40 of 40 ({out / 'checkpoints' / 'last.pt'})\n")
    assert [r for r in records(out) if "lr" in r] == before, "nothing trained again"


def test_resume_with_another_batch_is_refused(digits_run):
    out, _ = digits_run
    result = run_main("train", "--resume", str(out), "--set", "batch=128")
    assert result.returncode == 2
    assert result.stderr.startswith("error: batch: the checkpoint was trained with batch 256")


def test_resume_or_eval_with_another_model_is_refused(digits_run):
    out, _ = digits_run
    for command in (["train", "--resume", str(out), "--set", "model.width=16", "steps=61"],
                    ["eval", str(out), "--set", "model.width=16"]):
        result = run_main(*command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: model: the checkpoint does not fit this model"), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_show_prints_config_and_plan():
    result = run_main("show", "digits", "--set", "subdivisions=4", "epochs=10")
    assert result.returncode == 0, result.stderr
    assert "subdivisions: 4" in result.stdout
    assert "micro-batch     64 images (= 256 / (1 x 4))" in result.stdout
    assert "steps           57" in result.stdout  # ceil(10 * 1437 / 256)
    assert "images seen     14592" in result.stdout


def test_torchvision_model_trains_from_scratch(tmp_path):
    out = tmp_path / "resnet"
    result = run_main("train", "digits", "--out", str(out), "--set", "model.name=resnet18", "steps=2", "batch=16",
                      "subdivisions=2", "eval.batch=120", "log.tensorboard=false")
    assert result.returncode == 0, result.stderr
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert "layer4.1.bn2.running_mean" in state["model"]
    assert state["model"]["fc.weight"].shape == (10, 512)


def test_the_best_evaluation_is_said_in_the_reports_unit(digits_run):
    """One unit for a metric: top-1 is a percentage (as the record holds it); detection's mAP, a fraction in the
    records, is printed as the percentage its report table shows (``mAP@0.5 0.26 %``, not ``best mAP50 0.00``)."""
    from bigbatch.registry import TASKS

    out, result = digits_run
    best = max(r["top1"] for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
               if r.get("split") == "val")
    assert f"best top1 {best:.2f} % at step " in result.stdout, result.stdout
    detection = TASKS.get("detection").info["metric_text"]
    assert detection("mAP50", 0.0026) == "0.26 %" and detection("mAP", 0.52) == "52.00 %"


def test_train_help_names_every_kind_of_config_and_the_default(capsys):
    from bigbatch.cli import main

    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a YAML file, a Darknet .cfg, or a built-in recipe: digits," in text, text
    assert "(default: digits; with --resume, the run's own config)" in text and "default: None" not in text


def test_eval_shows_its_progress_on_a_terminal(digits_run, tmp_path):
    """``bigbatch eval`` says how many images it evaluates, and on a terminal draws a progress bar (tqdm) while it
    does; elsewhere no bar."""
    import contextlib
    import io

    from bigbatch.cli import main

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = tmp_path / "copy"
    shutil.copytree(digits_run[0], out)
    for stderr, bar in ((Terminal(), True), (io.StringIO(), False)):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            assert main(["eval", str(out)]) == 0
        assert "evaluating 360 validation images" in stdout.getvalue()
        assert ("evaluating 360 images" in stderr.getvalue() and "batch" in stderr.getvalue()) is bar, \
            stderr.getvalue()


def test_a_default_run_folder_is_named_after_the_model_and_data_that_set_changed(tmp_path, monkeypatch, capsys):
    """``runs/<recipe>-<time>`` for a recipe as it is; ``runs/<model>-<data folder>-<time>`` when --set changes its
    model or data, so that a folder run borrowing the digits recipe is not named ``digits``."""
    from bigbatch.cli import main
    from tests.helpers import TINY, write_photo_folder

    monkeypatch.chdir(tmp_path)
    photos = write_photo_folder(tmp_path / "photos", train=4, val=2)
    assert main(["train", "digits", "--set", *TINY, "steps=1", "data.name=folder", f"data.path={photos}"]) == 0
    assert main(["train", "digits", "--set", *TINY, "steps=1"]) == 0
    capsys.readouterr()
    names = sorted(p.name.rsplit("-", 2)[0] for p in (tmp_path / "runs").iterdir())
    assert names == ["digits", "small_cnn-photos"], names
