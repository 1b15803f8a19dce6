"""The fast subset's run of the real thing: ``bigbatch train digits`` for two steps, then ``--resume`` to four,
ends bit-identical to one four-step run, and no step is logged twice."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import TINY, run_main, weights

pytestmark = pytest.mark.fast


def logged_steps(out) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r]


def test_two_steps_of_digits_then_resume_to_four(tmp_path):
    run, reference = tmp_path / "run", tmp_path / "reference"
    first = run_main("train", "digits", "--out", str(run), "--set", *TINY, "steps=2")
    assert first.returncode == 0, first.stderr
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == 2
    resumed = run_main("train", "--resume", str(run), "--set", "steps=4")
    assert resumed.returncode == 0, resumed.stderr
    assert f"run written to {run}" in resumed.stdout
    whole = run_main("train", "digits", "--out", str(reference), "--set", *TINY, "steps=4")
    assert whole.returncode == 0, whole.stderr
    expected, actual = weights(reference), weights(run)
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    assert logged_steps(run) == [1, 2, 3, 4] and logged_steps(reference)[-1] == 4
