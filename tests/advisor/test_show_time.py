"""``bigbatch show``'s ``predicted time`` line (advisor/show.py): from an advisor.json beside the config file, read as
untrusted input (a hand-edited or hostile file is one line, never a traceback or a ``nan``)."""

import dataclasses
import json

import pytest

from bigbatch.advisor.links import LINKS
from bigbatch.advisor.model import StepMeasurement
from bigbatch.advisor.show import predicted_time
from bigbatch.batching import BatchPhase, BatchPlan
from tests.helpers import ROOT, run_main

MEASURED = StepMeasurement(micro_batch=32, compute_s=0.1, compute_sd=0.01, backward_s=0.06, update_s=0.02,
                           data_s_per_image=1e-6, data_workers=0, gradient_bytes=400_000, bn_layers=3, bn_bytes=600.0,
                           bn_sync=False)


def advisor_beside(tmp_path, step=None, link=None):
    """digits.yaml with an advisor.json beside it whose measured step is ``MEASURED`` with ``step``'s fields."""
    config = tmp_path / "digits.yaml"
    config.write_text((ROOT / "bigbatch" / "configs" / "digits.yaml").read_text())
    data = {"bigbatch_advisor": 1, "measurement": {"device": "cpu", "step": {**dataclasses.asdict(MEASURED),
                                                                               **(step or {})}},
            "link": {**dataclasses.asdict(LINKS["nvlink"]), **(link or {})}}
    (tmp_path / "advisor.json").write_text(json.dumps(data))
    return str(config)


@pytest.mark.fast
def test_a_sound_advisor_file_predicts_steps_times_the_modelled_step(tmp_path):
    line = predicted_time(advisor_beside(tmp_path), BatchPlan(256, 1, 8, 10, None))
    # 8 micro-batches of 0.1 s, the update 0.02 s, the data 256 x 1e-6 s in the training process: 0.82 + 0.000256
    assert line.startswith("predicted time  8.2 s +/- 3 %: 10 steps of 0.82 s at batch 256 on 1 device(s)")


@pytest.mark.fast
@pytest.mark.parametrize("step, link", [
    ({"micro_batch": 0}, None),  # a division by the measured micro-batch
    ({"micro_batch": True}, None),
    ({"micro_batch": 10**400}, None),  # past a float's range
    ({"compute_s": "1"}, None),  # a string multiplied
    ({"compute_s": 0, "update_s": 0, "data_s_per_image": 0, "backward_s": 0, "compute_sd": 0}, None),  # a step of 0 s
    ({"compute_s": float("nan")}, None),
    ({"compute_s": float("inf")}, None),
    ({"compute_s": -1.0}, None),
    ({"overlap": "half"}, None),
    ({"bn_sync": "yes"}, None),
    ({"gradient_bytes": 1.5}, None),
    (None, {"beta": 0}),  # a division by the bandwidth
    (None, {"alpha": None}),
])
def test_a_bad_number_in_the_advisor_file_is_one_line_naming_the_file(tmp_path, step, link):
    assert predicted_time(advisor_beside(tmp_path, step, link), BatchPlan(256, 1, 8, 10, None)) == (
        f"predicted time: {tmp_path / 'advisor.json'} is not a readable advisor file (bigbatch plan --devices --out "
        "writes one)")


def step_by_hand(batch: int) -> float:
    """MEASURED's step on one device, data in the training process: batch / 32 micro-batches of 0.1 s, the update
    0.02 s, and batch x 1e-6 s of data."""
    return batch / 32 * 0.1 + 0.02 + batch * 1e-6


@pytest.mark.fast
def test_a_batch_schedule_is_predicted_phase_by_phase(tmp_path):
    """12 steps at 256, then 9 at 4096 (a ``schedule.batch`` milestone at step 12): the phases' steps times their own
    steps' times, not 21 steps at the first batch (once 7.3 x too short: 20.1 s where the model gives 146.8)."""
    shown = run_main("show", advisor_beside(tmp_path), "--set", "steps=21", "schedule.batch=[{at: 12, batch: 4096}]")
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("predicted time")]
    total = 12 * step_by_hand(256) + 9 * step_by_hand(4096)  # 125.26 s
    assert line.startswith(f"predicted time  {total / 60:.1f} min +/- ")
    assert (f": 12 steps of {step_by_hand(256):.3g} s at batch 256, then 9 steps of {step_by_hand(4096):.3g} s at "
            "batch 4096 on 1 device(s)") in line
    plan = BatchPlan(256, 1, 8, 21, None, phases=(BatchPhase(12, 12 * 256, 4096),))
    assert predicted_time(advisor_beside(tmp_path), plan) == line
    later = BatchPlan(256, 1, 8, 10, None, phases=(BatchPhase(12, 12 * 256, 4096),))  # a milestone past the end
    assert predicted_time(advisor_beside(tmp_path), later).startswith(f"predicted time  {10 * step_by_hand(256):.1f} s")


@pytest.mark.fast
@pytest.mark.parametrize("batch, words", [("{mode: adaptive, base: 64, max: 1024, grow: true}", "steps and batches"),
                                          ("{mode: adaptive, base: 64, max: 256}", "steps")])
def test_an_adaptive_batch_says_its_time_is_not_predicted(tmp_path, batch, words):
    config = advisor_beside(tmp_path)
    result = run_main("show", config, "--set", f"batch={batch}", "subdivisions=2")
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("predicted time")]
    assert line == (f"predicted time  not predicted for an adaptive batch: its {words} are measured during the run "
                    f"(AdaScale's gain), not planned ({tmp_path / 'advisor.json'}: measured on cpu, link nvlink)")
