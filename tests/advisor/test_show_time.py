"""``bigbatch show``'s ``predicted time`` line (advisor/show.py): from an advisor.json beside the config file, read as
untrusted input (a hand-edited or hostile file is one line, never a traceback or a ``nan``)."""

import dataclasses
import json

import pytest

from bigbatch.advisor.links import LINKS
from bigbatch.advisor.model import StepMeasurement
from bigbatch.advisor.show import predicted_time
from tests.helpers import ROOT

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
    line = predicted_time(advisor_beside(tmp_path), 256, 1, 32, 10)
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
    assert predicted_time(advisor_beside(tmp_path, step, link), 256, 1, 32, 10) == (
        f"predicted time: {tmp_path / 'advisor.json'} is not a readable advisor file (bigbatch plan --devices --out "
        "writes one)")
