"""``bigbatch plan --devices``: its refusals (one line, before any measurement) and its table on a tiny digits config,
in process (tests/helpers.py run_main), a few measured steps."""

import json
import re

import pytest

from bigbatch.advisor.links import Link
from bigbatch.advisor.model import StepMeasurement, predict_step
from tests.helpers import ROOT, run_main

TINY = ("--set", "batch=64", "subdivisions=2", "model.width=8")
"""Digits at batch 64 in 2 micro-batches of 32, a narrow CNN: a step is cheap to measure."""


def refused(*args: str) -> str:
    result = run_main("plan", "digits", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "measuring" not in result.stdout  # refused before any work
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.fast
def test_a_device_count_the_batch_cannot_be_cut_for_is_refused_naming_the_nearest():
    assert refused("--devices", "1,3,4", "--batches", "256") == (
        "error: --devices: batch 256 cannot be cut for 3 devices (256/3 is not a whole number of images); the "
        "nearest that work: 2 or 4")
    assert "the nearest that work: 4 or 8" in refused("--devices", "6", "--batches", "64,256")
    assert "the nearest that work: 2 or 4" in refused("--devices", "3")  # the config's batch, 256


@pytest.mark.fast
def test_bad_options_are_refused_in_one_line(tmp_path):
    assert "--link" in refused("--devices", "2", "--link", "warp-drive")
    assert "--devices" in refused("--devices", "0,2")
    assert "--batches" in refused("--devices", "2", "--batches", "1")
    assert "--measure-steps" in refused("--devices", "2", "--measure-steps", "1")
    assert "--from and --target-loss go together" in refused("--devices", "2", "--target-loss", "0.1")
    assert "--price" in refused("--devices", "2", "--price", "-1")
    assert refused("--json").startswith("error: --json: goes with --devices")
    assert refused("--no-pair").startswith("error: --no-pair: goes with --devices")
    assert "--from" in refused("--devices", "2", "--from", str(tmp_path), "--target-loss", "0.1")
    (tmp_path / "advisor.json").write_text('{"mine": true}\n')
    assert "not a bigbatch advisor file" in refused("--devices", "2", "--out", str(tmp_path))
    assert (tmp_path / "advisor.json").read_text() == '{"mine": true}\n'  # not overwritten


@pytest.mark.fast
def test_a_batch_show_would_refuse_for_this_machine_is_refused_naming_batches():
    """Every ``--batches`` value passes the check ``show`` and ``train`` make before any work, so no row (and no
    recommendation) is a ``--set batch=...`` that fails: 2^40 images need 8 TiB for the data order alone."""
    largest = 2**40
    shown = run_main("show", "digits", "--set", f"batch={largest}", "subdivisions=1")
    assert shown.returncode == 2 and "for the data order alone" in shown.stderr  # the oracle: show refuses it
    line = refused("--devices", "1", "--batches", f"64,{largest}")
    assert line.startswith(f"error: --batches: at batch {largest}, {largest} images per step need 8.0 TiB for the "
                           "data order alone")
    line = refused("--devices", "1", "--batches", "64,2048", "--set", f"steps={2**53}")
    assert line.startswith(f"error: --batches: at batch 2048, {2**53} steps of 2048 images are")  # past 64 bits


def fake_run(path, batch=64, noise=100.0):
    """A finished run's files: validation loss 0.5 at step 20, 0.2 at step 30 (B_noise then 100), 0.1 at 40."""
    path.mkdir()
    (path / "config.yaml").write_text(f"name: digits\nbatch: {batch}\n")
    records = [{"step": 10, "lr": 0.1, "loss": 0.9, "noise_scale": noise / 2},
               {"step": 20, "split": "val", "loss": 0.5}, {"step": 30, "lr": 0.1, "loss": 0.3, "noise_scale": noise},
               {"step": 30, "split": "val", "loss": 0.2}, {"step": 40, "lr": 0.1, "loss": 0.2, "noise_scale": 400},
               {"step": 40, "split": "val", "loss": 0.1}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 4')
    return path


@pytest.mark.fast
def test_a_target_the_run_never_reached_is_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    line = refused("--devices", "2", "--from", str(run), "--target-loss", "0.05")
    assert line == f"error: --target-loss: {run} never reached a validation loss of 0.05 (its lowest: 0.1)"


def test_the_table_with_steps_from_a_run_its_recommendation_and_advisor_json(tmp_path):
    run = fake_run(tmp_path / "run")
    out = tmp_path / "advice"
    result = run_main("plan", "digits", *TINY, "--devices", "1,2", "--batches", "32,64,128", "--measure-steps", "2",
                      "--from", str(run), "--target-loss", "0.2", "--price", "2.5", "--out", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = [line for line in lines if re.match(r"[*$ ] +\d+ +\d+ +\d+ +\d+ ", line)]
    assert len(rows) == 6  # 2 device counts x 3 batches
    assert sum(line.startswith("*") for line in rows) == 1
    assert any(line.startswith("* recommended: batch ") for line in lines)
    assert "noise scale B_noise ~ 100 " in result.stdout  # the run's, at the step it reached the target
    data = json.loads((out / "advisor.json").read_text())
    assert data["bigbatch_advisor"] == 1 and len(data["rows"]) == 6
    assert data["target"]["s_min"] == pytest.approx(30 / (1 + 100 / 64))
    by = {(r["devices"], r["batch"]): r for r in data["rows"]}
    assert by[(1, 64)]["steps"] == pytest.approx(30)  # the run's own steps at its own batch
    assert by[(1, 32)]["steps"] == pytest.approx(30 / (1 + 100 / 64) * (1 + 100 / 32))
    assert by[(2, 32)]["micro_batch"] == 16 and by[(2, 128)]["subdivisions"] == 2
    for row in data["rows"]:
        assert row["step"] == pytest.approx(row["compute"] + row["grad_sync"] + row["wait"] + row["bn_sync"]
                                            + row["update"] + row["data"])  # data.workers 0: the data wait adds
        # the pair's measured wait on several devices (what the all-reduce alone does not explain: 0 or more, 0.0
        # when the all-reduce explains all of it on a quiet machine), none on one
        assert row["wait"] == (data["measurement"]["pair"]["wait_s"] if row["devices"] > 1 else 0.0)
        assert row["wait"] >= 0.0
        assert row["wall_s"] == pytest.approx(row["steps"] * row["step"])
        assert row["cost"] == pytest.approx(2.5 * row["devices"] * row["wall_s"] / 3600)
    best = data["rows"][data["recommended"]]
    assert best["wall_s"] == min(r["wall_s"] for r in data["rows"])
    measured = data["measurement"]
    assert measured["batch"] == 64 and measured["subdivisions"] == 2 and measured["steps"] == 2
    assert measured["step"]["gradient_bytes"] > 0 and measured["step"]["bn_layers"] > 0
    # the pair: two real processes under DDP measured the overlap (the digits CNN's gradient is one bucket, ready
    # at the end of the backward: little or none of it hidden) and the wait, and they are the step's
    pair = measured["pair"]
    assert pair["steps"] == 2 and 0 <= pair["overlap"] <= 1 and pair["backward_s"] > 0 and pair["all_reduce_s"] > 0
    assert measured["step"]["overlap"] == pair["overlap"] and measured["step"]["wait_s"] == pair["wait_s"]
    assert pair["bn_collective_s"] is None  # norm.sync: none
    assert "measured on 2 processes of this machine (cpu, 2 steps at batch 64 = 2 x 2 x 16)" in result.stdout
    # again, without the pair: the overlap assumed, and the file (bigbatch's own) replaced
    again = run_main("plan", "digits", *TINY, "--devices", "2", "--batches", "64", "--measure-steps", "2", "--json",
                     "--out", str(out), "--no-pair")
    assert again.returncode == 0, again.stderr
    printed = json.loads(again.stdout)
    assert [(r["devices"], r["batch"]) for r in printed["rows"]] == [(2, 64)]
    assert printed["target"]["s_min"] is None  # without a run: steps relative to S_min
    assert printed["measurement"]["pair"] is None and printed["measurement"]["pair_note"] == "--no-pair"
    assert printed["measurement"]["step"]["overlap"] is None and printed["rows"][0]["wait"] == 0
    assert json.loads((out / "advisor.json").read_text())["rows"] == printed["rows"]
    # show: the predicted time of the configured run, from the advisor.json beside its config file
    (out / "config.yaml").write_text((ROOT / "bigbatch" / "configs" / "digits.yaml").read_text())
    shown = run_main("show", str(out / "config.yaml"), "--set", "batch=64", "subdivisions=2", "steps=100")
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("predicted time"))
    step = predict_step(StepMeasurement(**printed["measurement"]["step"]), 64, 1, 32, Link(**printed["link"]))
    assert f"100 steps of {step.step:.3g} s at batch 64 on 1 device(s)" in line
    plain = run_main("show", "digits", "--set", "batch=64", "subdivisions=2")
    assert plain.returncode == 0 and "predicted time" not in plain.stdout
    # batch.max: advisor, from the advisor.json beside the config: its one row's batch, 64
    grow = run_main("show", str(out / "config.yaml"), "--set", "batch={mode: adaptive, base: 16, max: advisor, "
                    "grow: true}", "subdivisions=2")
    assert grow.returncode == 0, grow.stderr
    assert "  mode: adaptive\n  base: 16\n  max: 64\n  grow: true\n" in grow.stdout
    # report: the advisor's chart of the run directory's advisor.json
    assert run_main("report", str(out)).returncode == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    advisor = html[html.index('<section id="advisor">'):]
    assert "<svg" in advisor[:advisor.index("</section>")] and "recommended: batch 64 on 2" in advisor


@pytest.mark.fast
def test_a_run_without_evaluations_counts_its_training_loss_and_an_adaptive_batch_is_refused(tmp_path):
    from bigbatch.advisor.from_run import reached
    from bigbatch.errors import UserError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: digits\nbatch: 32\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 5, "lr": 0.1, "loss": 0.8}, {"step": 10, "lr": 0.1, "loss": 0.4, "noise_scale": 70.0},
        {"step": 15, "lr": 0.1, "loss": 0.35})))
    got = reached(run, 0.5)
    assert (got.steps, got.batch, got.loss_kind, got.noise_scale) == (10, 32, "training", 70.0)
    assert reached(run, 0.9).noise_scale is None  # none recorded by step 5
    (run / "config.yaml").write_text("name: digits\nbatch: {mode: adaptive, base: 32, max: 256}\n")
    with pytest.raises(UserError, match="--from: .* has no fixed global batch"):
        reached(run, 0.5)



@pytest.mark.fast
def test_a_large_metrics_file_is_read_a_record_at_a_time(tmp_path):
    """``plan --from RUN`` holds one record of ``metrics.jsonl`` at a time, not the file (a 200 MB file once took
    800 MB): the memory Python allocates while reading an 8 MiB file stays under 1/4 of it, and the answer is what
    the records say (the first validation loss under the target, the last noise scale at or before its step)."""
    import tracemalloc

    from bigbatch.advisor.from_run import reached

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: digits\nbatch: 32\n")
    padding = json.dumps({"step": 1, "x": "0" * 150_000}) + "\n"  # 150 kB
    records = [{"step": 8, "lr": 0.1, "loss": 0.3, "noise_scale": 40.0}, {"step": 9, "split": "val", "loss": 0.6},
               {"step": 10, "lr": 0.1, "loss": 0.3, "noise_scale": 70.0}, {"step": 10, "split": "val", "loss": 0.4},
               {"step": 11, "lr": 0.1, "loss": 0.2, "noise_scale": 90.0}, {"step": 12, "split": "val", "loss": 0.3}]
    with open(run / "metrics.jsonl", "w") as f:
        for record in records:
            f.write(padding * 10 + json.dumps(record) + "\n")
    size = (run / "metrics.jsonl").stat().st_size
    assert size > 8 * 2**20
    tracemalloc.start()
    try:
        got = reached(run, 0.5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (got.steps, got.loss_kind, got.noise_scale) == (10, "validation", 70.0)
    assert peak < size / 4, f"{peak:,} bytes allocated reading {size:,}"


@pytest.mark.fast
def test_a_runs_files_are_read_only_from_inside_it_and_only_as_regular_files(tmp_path):
    """``plan --from RUN`` reads ``config.yaml`` and ``metrics.jsonl`` as every reader of a run folder does: a link
    leading out of the run, or a FIFO, is one error line and never read (it once read both unchecked); an overlong
    metrics line is skipped unread."""
    import os

    from bigbatch.advisor.from_run import MAX_LINE, reached
    from bigbatch.errors import UserError

    run = tmp_path / "run"
    run.mkdir()
    secret = tmp_path / "secret.yaml"
    secret.write_text("batch: 32\n")
    (run / "config.yaml").symlink_to(secret)
    (run / "metrics.jsonl").write_text("x" * (MAX_LINE + 10) + "\n" + json.dumps({"step": 3, "lr": 0.1, "loss": 0.2})
                                       + "\n")
    with pytest.raises(UserError, match=r"^--from: .*config\.yaml leads outside"):
        reached(run, 0.5)
    (run / "config.yaml").unlink()
    (run / "config.yaml").write_text("name: digits\nbatch: 32\n")
    assert reached(run, 0.5).steps == 3
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(UserError, match=r"^--from: .*metrics\.jsonl is not a regular file"):
        reached(run, 0.5)

ADVISOR_MAX = "batch={mode: adaptive, base: 32, max: advisor, grow: true}"


@pytest.mark.fast
def test_batch_max_advisor_reads_the_recommended_batch_beside_the_config_or_in_the_run_directory(tmp_path):
    from bigbatch.config import load_config
    from bigbatch.errors import UserError

    config = tmp_path / "cfg" / "digits.yaml"
    config.parent.mkdir()
    config.write_text((ROOT / "bigbatch" / "configs" / "digits.yaml").read_text())
    run = tmp_path / "run"
    run.mkdir()
    advice = {"bigbatch_advisor": 1, "rows": [{"devices": 1, "batch": 64}, {"devices": 4, "batch": 512}],
              "recommended": 1}
    (run / "advisor.json").write_text(json.dumps(advice))
    cfg = load_config(str(config), [ADVISOR_MAX], run_dir=run)  # not beside the config: the run directory's
    assert cfg.adaptive.max == 512 and cfg.adaptive.base == 32 and cfg.batch == 32
    (config.parent / "advisor.json").write_text(json.dumps({**advice, "recommended": 0}))
    assert load_config(str(config), [ADVISOR_MAX], run_dir=run).adaptive.max == 64  # beside the config first
    assert load_config(str(config), ["batch={mode: adaptive, base: 32, max: 128}"]).adaptive.max == 128
    with pytest.raises(UserError, match=r"^batch.max: advisor: the batch .* recommends, 64, is not above batch.base "
                                        r"128"):
        load_config(str(config), ["batch={mode: adaptive, base: 128, max: advisor}"])
    (config.parent / "advisor.json").write_text('{"rows": []}')
    with pytest.raises(UserError, match=r"^batch.max: advisor: .*advisor.json holds no recommended batch"):
        load_config(str(config), [ADVISOR_MAX])


@pytest.mark.fast
@pytest.mark.parametrize("recommended", [-1, True, 3, 1.0, "1", None])
def test_batch_max_advisor_takes_the_recommended_index_only_as_a_row_of_the_file(tmp_path, recommended):
    """``recommended`` is a row's position, 0 to len(rows) - 1: -1 (the last row) or true (row 1) is no row."""
    from bigbatch.config import load_config
    from bigbatch.errors import UserError

    config = tmp_path / "digits.yaml"
    config.write_text((ROOT / "bigbatch" / "configs" / "digits.yaml").read_text())
    rows = [{"devices": 1, "batch": 64}, {"devices": 1, "batch": 128}, {"devices": 1, "batch": 1024}]
    (tmp_path / "advisor.json").write_text(json.dumps({"bigbatch_advisor": 1, "rows": rows, "recommended": 1}))
    assert load_config(str(config), [ADVISOR_MAX]).adaptive.max == 128  # the oracle: rows[1] by hand
    (tmp_path / "advisor.json").write_text(json.dumps({"bigbatch_advisor": 1, "rows": rows,
                                                       "recommended": recommended}))
    with pytest.raises(UserError, match=rf"^batch.max: advisor: {tmp_path / 'advisor.json'} holds no recommended "
                                        r"batch"):
        load_config(str(config), [ADVISOR_MAX])


@pytest.mark.fast
def test_an_advisor_json_not_bigbatchs_own_as_it_is_now_is_refused_before_any_work(tmp_path):
    """``plan --out RUN`` replaces ``RUN/advisor.json`` only while it is the file a plan wrote and recorded, unchanged:
    one edited by hand (its ``bigbatch_advisor`` key kept), a copy, a link (to an advisor file elsewhere, which the
    old code wrote through) and a FIFO (the old code waited on it for a writer) are each one line, never read or
    written."""
    import os
    import threading

    from tests.helpers import HANG_GUARD_S

    out = tmp_path / "run"
    out.mkdir()
    file = out / "advisor.json"
    mine = json.dumps({"bigbatch_advisor": 1, "rows": [], "recommended": 0, "note": "tuned by hand"}) + "\n"
    file.write_text(mine)
    line = refused("--devices", "2", "--out", str(out))
    assert line == (f"error: --out: {file} looks like a bigbatch advisor file but bigbatch has no record of writing "
                    "it as it is now (edited since, copied, or written by an older bigbatch); not overwritten (move "
                    "it away)")
    assert file.read_text() == mine
    file.unlink()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(mine)
    file.symlink_to(elsewhere)
    assert refused("--devices", "2", "--out", str(out)) == (
        f"error: --out: {file} is a link; bigbatch neither follows nor replaces it (move it away)")
    assert elsewhere.read_text() == mine and file.is_symlink()
    file.unlink()
    os.mkfifo(file)
    guard = threading.Timer(HANG_GUARD_S, lambda: open(file, "wb").close())  # hang guard: frees a waiting reader
    guard.start()
    try:
        assert refused("--devices", "2", "--out", str(out)) == (
            f"error: --out: {file} is not a regular file; not read, not overwritten (move it away)")
    finally:
        guard.cancel()


@pytest.mark.fast
def test_batch_max_advisor_and_show_read_advisor_json_only_as_a_bounded_regular_file(tmp_path):
    import os
    import threading

    from bigbatch.advisor.show import predicted_time
    from bigbatch.batching import BatchPlan
    from bigbatch.config import load_config
    from bigbatch.config.adaptive import MAX_ADVISOR_BYTES
    from bigbatch.errors import UserError
    from tests.helpers import HANG_GUARD_S

    config = tmp_path / "digits.yaml"
    config.write_text((ROOT / "bigbatch" / "configs" / "digits.yaml").read_text())
    file = tmp_path / "advisor.json"
    with open(file, "wb") as f:
        f.truncate(MAX_ADVISOR_BYTES + 1)  # holes: past the bound, never read
    with pytest.raises(UserError, match=rf"^batch.max: advisor: {file} is {MAX_ADVISOR_BYTES + 1:,} bytes, more "):
        load_config(str(config), [ADVISOR_MAX])
    assert predicted_time(str(config), BatchPlan(64, 1, 1, 10, None)).endswith(
        "is not a readable advisor file (bigbatch plan --devices --out writes one)")
    file.unlink()
    os.mkfifo(file)
    guard = threading.Timer(HANG_GUARD_S, lambda: open(file, "wb").close())  # hang guard: frees a waiting reader
    guard.start()
    try:
        with pytest.raises(UserError, match=rf"^batch.max: advisor: {file} is not a regular file; not read"):
            load_config(str(config), [ADVISOR_MAX])
        assert "is not a readable advisor file" in predicted_time(str(config), BatchPlan(64, 1, 1, 10, None))
    finally:
        guard.cancel()


@pytest.mark.fast
def test_batch_max_advisor_without_an_advisor_file_is_one_line_naming_the_key(tmp_path):
    result = run_main("show", "digits", "--set", ADVISOR_MAX)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: batch.max: advisor: no advisor.json (no config file or run directory given); bigbatch plan CONFIG "
        "--devices N,N,... --out DIR writes DIR/advisor.json"]
    line = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", ADVISOR_MAX).stderr.strip()
    assert line == (f"error: batch.max: advisor: no {tmp_path / 'run' / 'advisor.json'}; bigbatch plan CONFIG "
                    "--devices N,N,... --out DIR writes DIR/advisor.json")
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.mark.fast
def test_a_failed_rank_is_reported_by_its_python_error_not_by_what_went_down_after_it():
    from bigbatch.advisor.pair import failure_line

    log = ("measuring...\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
           "    raise KeyError\nKeyError: 'lr'\n\n"
           "During handling of the above exception, another exception occurred:\n\n"
           "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
           "RuntimeError: the optimizer has no lr\n[W gloo] a warning\nterminate called without an active exception\n")
    assert failure_line(log) == "RuntimeError: the optimizer has no lr"
    assert failure_line("loading\nKilled\n") == "Killed"
    assert failure_line("Traceback (most recent call last):\n  File \"x.py\", line 1\n") == "File \"x.py\", line 1"
    assert failure_line("\n \n") is None


def test_a_folder_holding_only_the_advisor_file_a_plan_wrote_takes_the_run_that_reads_it(tmp_path):
    """``plan --devices --out RUN`` then ``train CONFIG --out RUN`` with ``batch.max: advisor``, as docs/recipe.md
    describes: the new run was refused, its folder "not a bigbatch run directory", so the run directory's
    advisor.json never served a new run. A folder holding only the advisor file bigbatch wrote (and recorded) is taken;
    a copy of it, which bigbatch has no record of, is still someone's file, and refused."""
    from bigbatch.floor.files import atomic_write
    from tests.helpers import TINY as RUN

    advice = {"bigbatch_advisor": 1, "rows": [{"devices": 1, "batch": 64}, {"devices": 4, "batch": 512}],
              "recommended": 1}
    run = tmp_path / "run"
    run.mkdir()
    atomic_write(run / "advisor.json", lambda f: f.write(json.dumps(advice)), mode="w", record=True)
    result = run_main("train", "digits", "--out", str(run), "--set", *RUN, "steps=1", ADVISOR_MAX)
    assert result.returncode == 0, result.stderr
    assert "max: 512" in (run / "config.yaml").read_text()
    assert json.loads((run / "advisor.json").read_text()) == advice  # read, left as it was

    copied = tmp_path / "copied"
    copied.mkdir()
    (copied / "advisor.json").write_text(json.dumps(advice))
    result = run_main("train", "digits", "--out", str(copied), "--set", *RUN, "steps=1", ADVISOR_MAX)
    assert result.returncode == 2 and "is not a bigbatch run directory and holds" in result.stderr, result.stderr
    assert sorted(p.name for p in copied.iterdir()) == ["advisor.json"]
