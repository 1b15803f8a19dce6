"""Memory planning: real measurements in fresh processes, the fit, and the choice of subdivisions."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from bigbatch.config import load_config
from bigbatch.engine import planner
from bigbatch.engine.planner import FAILED, RUN_MARGIN, Measurement, candidates, fit_line, needed, plan_layout
from bigbatch.errors import UserError
from tests.helpers import run_main

TINY = ["data.size=16", "model.width=8", "log.tensorboard=false"]
MiB = 2**20


def test_candidates_divide_the_per_device_batch():
    assert candidates(48) == [1, 2, 4, 8, 16, 48]
    assert candidates(64) == [1, 2, 4, 8, 16, 32, 64]


def test_fit_is_least_squares_over_the_whole_runs_peaks():
    points = [Measurement(m, int(100 + 3 * m + e), 0.0, 7 * m) for m, e in [(1, 1), (2, -1), (4, 1), (8, -1)]]
    a, b = fit_line(points)
    slope, intercept = np.polyfit([p.micro_batch for p in points], [p.run_bytes for p in points], 1)
    assert (a, b) == pytest.approx((intercept, slope), rel=1e-9)
    assert b == pytest.approx(3 + 7, rel=0.05), "the workers' memory is part of the run's"


def test_a_micro_batch_is_planned_for_its_process_its_workers_and_the_margin():
    assert RUN_MARGIN == 0.15  # docs/memory.md states it, and why
    assert needed(Measurement(8, 1000 * MiB, 0.0, 200 * MiB)) == pytest.approx(1380 * MiB)
    assert needed(Measurement(8, 1000 * MiB, 0.0)) == pytest.approx(1150 * MiB)
    assert needed(Measurement(8, FAILED, 0.0)) == float("inf")


def synthetic(peaks: dict[int, tuple[float, float]], asked: list[tuple[int, int]]):
    """A stand-in for the measuring processes: micro-batch -> (process MiB, workers MiB); records what was asked."""
    def measure(cfg, micro_batch, per_device):
        asked.append((micro_batch, per_device))
        process, workers = peaks[micro_batch]
        return Measurement(micro_batch, int(process * MiB), 1.0, int(workers * MiB))
    return measure


PEAKS = {1: (900, 100), 2: (910, 100), 4: (930, 100), 8: (970, 110), 16: (1050, 120), 32: (1200, 150)}
"""Whole runs of 1,000, 1,010, 1,030, 1,080, 1,170 and 1,350 MiB; planned at 1,150, 1,161.5, 1,184.5, 1,242, 1,345.5
and 1,552.5 MiB."""


@pytest.mark.parametrize(("limit", "micro_batch"), [(1242.5, 8), (1241.5, 4), (1400, 16), (1553, 32), (1161, 1)])
def test_the_layout_is_the_largest_micro_batch_whose_planned_whole_run_fits(monkeypatch, limit, micro_batch):
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(planner, "measure", synthetic(PEAKS, asked))
    cfg = load_config("digits", ["batch=32", "subdivisions=1"])
    plan = plan_layout(cfg, 1, int(limit * MiB))
    assert (plan.micro_batch, plan.subdivisions) == (micro_batch, 32 // micro_batch)
    measured = [m for m, _ in asked]
    assert measured == [m for m in PEAKS if m <= min(2 * micro_batch, 32)], "stops at the first that does not fit"
    assert {per_device for _, per_device in asked} == {32}, "each measured beside a whole step's data"
    table = plan.table()
    assert "planned = (peak + workers) x 1.15" in table
    row = next(line.split() for line in table.splitlines() if line.split()[0] == str(micro_batch))
    assert row[1:4] == [f"{PEAKS[micro_batch][0]:.0f}", f"{PEAKS[micro_batch][1]:.0f}",
                        f"{sum(PEAKS[micro_batch]) * 1.15:.0f}"]


def test_a_limit_below_one_images_whole_run_is_refused_naming_the_margin(monkeypatch):
    monkeypatch.setattr(planner, "measure", synthetic(PEAKS, []))
    with pytest.raises(UserError, match=r"needs 1150 MiB \(the whole run's measured peak and a 15% margin\), over the "
                                        r"budget of 1149 MiB"):
        plan_layout(load_config("digits", ["batch=32", "subdivisions=1"]), 1, 1149 * MiB)


def test_the_data_measured_beside_each_micro_batch_is_the_largest_step_of_a_batch_schedule(monkeypatch):
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(planner, "measure", synthetic({**PEAKS, 64: (1500, 200)}, asked))
    cfg = load_config("digits", ["batch=32", "subdivisions=1", "steps=10", "epochs=null",
                                 "schedule.batch=[{at: 5, factor: 2}]"])
    plan_layout(cfg, 1, 1200 * MiB)
    assert {per_device for _, per_device in asked} == {64}


@pytest.mark.slow  # make test-slow: keeps make test under 10 minutes on 2 cores
def test_plan_with_room_for_the_whole_batch_chooses_one_subdivision():
    result = run_main("plan", "digits", "--set", "batch=8", *TINY, "--memory-limit", "100GiB")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    assert all(float(r[1]) > 50 for r in rows), "a real process uses tens of MiB at least"
    assert "chosen: batch 8 = world 1 x subdivisions 1 x micro-batch 8" in result.stdout


def test_plan_that_cannot_fit_is_a_clear_error():
    result = run_main("plan", "digits", "--set", "batch=8", *TINY, "--memory-limit", "1MiB")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --memory-limit: even a micro-batch of 1 image needs")


@pytest.mark.parametrize("sets, given, key, note", [
    ([], True, "--memory-limit", ""),
    (["memory.limit=1149MiB"], False, "memory.limit", ""),
    ([], False, "memory", " (this machine's available memory less 10%; memory.limit unset)")])
def test_a_plan_that_cannot_fit_names_where_its_budget_came_from(monkeypatch, sets, given, key, note):
    """The budget is ``--memory-limit`` (given to the plan), else ``memory.limit``, else the available memory less
    10 % (here made 1149 MiB): the error names the one it was (``memory.limit`` once named all three)."""
    import psutil

    monkeypatch.setattr(planner, "measure", synthetic(PEAKS, []))
    monkeypatch.setattr(planner.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 1149 * MiB / 0.9 + 10})())
    cfg = load_config("digits", ["batch=32", "subdivisions=auto", *sets])
    with pytest.raises(UserError) as error:
        if given:
            plan_layout(cfg, 1, 1149 * MiB)
        else:
            planner.resolve_auto_subdivisions(cfg, 1)  # as train and show plan subdivisions: auto
    assert str(error.value) == (f"{key}: even a micro-batch of 1 image needs 1150 MiB (the whole run's measured peak "
                                f"and a 15% margin), over the budget of 1149 MiB{note}")


@pytest.mark.slow  # make test-slow: keeps make test under 10 minutes on 2 cores
def test_auto_subdivisions_are_chosen_before_training(tmp_path):
    out = tmp_path / "run"
    result = run_main("train", "digits", "--out", str(out), "--set", "batch=4", "subdivisions=auto", "steps=1",
                      "memory.limit=100GiB", *TINY)
    assert result.returncode == 0, result.stderr
    assert "subdivisions: auto -> 1 (micro-batch 4)" in result.stdout
    assert yaml.safe_load((out / "config.yaml").read_text())["subdivisions"] == 1


def test_the_cpu_measurement_is_a_short_run_its_data_evaluation_and_checkpoint_beside_the_steps(monkeypatch):
    """Training serializes a checkpoint at its step and the background writer holds the bytes while the next steps
    run; on the CPU that is the device's memory, so the measurement holds a whole checkpoint through its second
    step (ResNet-18 at micro-batch 16, by hand: 1,111 -> 1,199 MB of peak RSS, its 90 MB checkpoint). Before it, an
    evaluation batch of ``eval.batch`` images; and each step runs beside the run's own data for a whole step.

    After every step, as a run that evaluates and checkpoints every step: each evaluation after the first runs beside
    the last checkpoint's bytes, and each needed more of kept memory (ResNet-18 at 4 x 16: +171, +104, +61, +0 MiB
    over four; one evaluation had read 1.16x less than such a run, docs/benchmarks.md). With ``log.updates``, the
    float32 copy of the weights that the run's update sizes keep."""
    from bigbatch.engine import checkpoint

    taken, evaluated, steps = [], [], []
    real, real_evaluate, real_data = checkpoint.serialized, planner.evaluate, planner.run_data
    monkeypatch.setattr(checkpoint, "serialized", lambda state: taken.append(state) or real(state))

    def evaluate(cfg, task, models, device):
        images = task.synthetic_batch(cfg, min(cfg.eval.batch, len(task.val_set)), device)[0]
        evaluated.append((len(images), len(models), len(taken)))
        real_evaluate(cfg, task, models, device)

    def run_data(*args):
        for step in real_data(*args):
            steps.append([len(micro[0]) for micro in step])
            yield step

    from bigbatch.engine import step as step_module

    accumulated, real_attempt = [], step_module.attempt_step
    monkeypatch.setattr(step_module, "attempt_step",
                        lambda model, optimizer, cut, *rest: accumulated.append(len(cut)) or
                        real_attempt(model, optimizer, cut, *rest))
    from bigbatch.telemetry.update_sizes import UpdateSizes

    copies, real_before = [], UpdateSizes.before
    monkeypatch.setattr(UpdateSizes, "before", lambda sizes, model: copies.append(len(taken)) or
                        real_before(sizes, model))
    monkeypatch.setattr(planner, "evaluate", evaluate)
    monkeypatch.setattr(planner, "run_data", run_data)
    cfg = load_config("digits", ["model.width=4", "eval.batch=50", "ema.decay=0.9", "log.updates=true"])
    measured = planner.measure_in_this_process(cfg, 8, 24)
    assert measured.peak_bytes > 0 and len(taken) == 4
    assert all({"model", "optimizer", "rng", "data"} <= state.keys() for state in taken)
    assert evaluated == [(50, 2, 0), (50, 2, 1), (50, 2, 2), (50, 2, 3)], \
        "after each step an evaluation batch, of the raw and the EMA weights, then a checkpoint"
    assert copies == [0, 1, 2, 3], "the update sizes' copy of the weights, taken before each step"
    assert steps == [[8, 8, 8]] * 4, "each step's 3 micro-batches of the run's own data"
    assert accumulated == [3] * 4, "each measured step accumulates the run's 3 micro-batches into the gradients"


@pytest.mark.parametrize(("micro_batch", "per_device", "accumulated"), [(8, 8, 1), (8, 24, 3), (2, 256, 4)])
def test_a_measured_step_accumulates_the_runs_micro_batches_up_to_four(micro_batch, per_device, accumulated):
    assert planner.measured_micro_batches(micro_batch, per_device) == accumulated
